"""Arguments that alias (issue 23 item 1): a launch writing through one argument what
another argument of the same array reads at other indices raises ShapeError on every
device; with ``snapshot=True`` it gives NumPy's result. The oracle is NumPy: its slicing
for the results, and index grids pushed through the same NumPy operations for which
elements each argument touches."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hetflow
from hetflow import cshift, interior, section, transpose
from hetflow.errors import ShapeError
from hetflow.ir import RuleSet


@hetflow.kernel
def avg(i, out, left, right):
    out[i] = (left[i] + right[i]) / 2


@hetflow.kernel
def copy(i, out, a):
    out[i] = a[i]


@hetflow.kernel
def copy2(i, j, out, a):
    out[i, j] = a[i, j]


@hetflow.kernel
def inc(i, out, a):
    out[i] = a[i] + 1


@hetflow.kernel
def two_outputs(i, first, second, a):
    first[i] = a[i]
    second[i] = -a[i]


@pytest.fixture(params=["on-cpu", "on-a-gpu", "co-executed"])  # not "gpu": that id is the real-GPU mark
def device(request):
    """cpu0, the (simulated) GPU, or both co-executing."""
    if request.param == "on-cpu":
        return "cpu0"
    gpus = [d.id for d in hetflow.devices() if d.kind == "gpu"]
    if not gpus:
        pytest.skip("no GPU device (run with NUMBA_ENABLE_CUDASIM=1)")
    return gpus[0] if request.param == "on-a-gpu" else ["cpu0", gpus[0]]


def squares(n=6):
    return np.arange(n, dtype=float) ** 2


def smoothing(u):
    n = len(u)
    return n - 2, avg, interior(u, 1), section(u, (0,), (n - 2,)), section(u, (2,), (n - 2,))


def test_in_place_smoothing_raises_naming_the_kernel_and_both_arguments(device):
    u = squares()
    with pytest.raises(ShapeError, match=r"kernel 'avg' writes argument 'out' .*interior.* and reads "
                                            r"argument 'left' .*section") as caught:
        hetflow.forall(*smoothing(u), device=device)
    assert isinstance(caught.value, ValueError)  # a plain argument check
    np.testing.assert_array_equal(u, squares())  # refused before anything ran


def test_in_place_smoothing_with_snapshot_is_numpys(device):
    u, expected = squares(), squares()
    expected[1:-1] = (expected[:-2] + expected[2:]) / 2
    hetflow.forall(*smoothing(u), device=device, snapshot=True)
    np.testing.assert_array_equal(u, expected)  # [0, 2, 5, 10, 17, 25]


def test_shift_in_place(device):
    u = squares(5)
    with pytest.raises(ShapeError, match="'out'.*'a'"):
        hetflow.forall(5, copy, u, cshift(u, 0, 1), device=device)
    hetflow.forall(5, copy, u, cshift(u, 0, 1), device=device, snapshot=True)
    np.testing.assert_array_equal(u, np.roll(squares(5), -1))


def test_transpose_in_place(device):
    m = np.arange(16.0).reshape(4, 4)
    with pytest.raises(ShapeError):
        hetflow.forall((4, 4), copy2, m, transpose(m, 0, 1), device=device)
    hetflow.forall((4, 4), copy2, m, transpose(m, 0, 1), device=device, snapshot=True)
    np.testing.assert_array_equal(m, np.arange(16.0).reshape(4, 4).T)


def test_same_index_and_disjoint_views_stay_allowed(device):
    u = squares()
    hetflow.forall(6, inc, u, u, device=device)  # u[i] = u[i] + 1
    hetflow.forall(4, inc, interior(u, 1), interior(u, 1), device=device)  # one map, read and written
    hetflow.forall(3, copy, section(u, (0,), (3,)), section(u, (3,), (3,)), device=device)  # disjoint halves
    expected = squares() + 1
    expected[1:-1] += 1
    expected[:3] = expected[3:]
    np.testing.assert_array_equal(u, expected)


@hetflow.kernel
def from_next(i, out, a):
    out[i] = a[i + 1]


def test_arrays_that_own_their_memory_alias_only_when_one_is_passed_twice(device):
    """Whole arrays owning their memory share a plan that looks only for one array passed
    twice: distinct ones run, the same one twice is judged as before (and raises here),
    and a slice, which owns nothing, is judged by its own plan."""
    a, out = squares(), np.zeros(6)
    hetflow.forall(5, from_next, out, a, device=device)
    np.testing.assert_array_equal(out[:5], a[1:])
    with pytest.raises(ShapeError, match="writes argument 'out'.*reads argument 'a'"):
        hetflow.forall(5, from_next, a, a, device=device)
    with pytest.raises(ShapeError, match="writes argument 'out'.*reads argument 'a'"):
        hetflow.forall(5, from_next, a[:-1], a, device=device)
    np.testing.assert_array_equal(a, squares())  # nothing ran


def test_two_written_arguments_that_overlap_raise_even_with_snapshot():
    u = np.zeros(6)
    for snapshot in (False, True):
        with pytest.raises(ShapeError, match="writes argument 'first'.*and writes argument 'second'"):
            hetflow.forall(5, two_outputs, section(u, (0,), (5,)), section(u, (1,), (5,)), np.ones(5),
                           snapshot=snapshot)


def test_views_of_coherent_arrays_are_checked_per_plan(device):
    """Views over hetflow arrays only (roots that are no NumPy slices): a plan whose
    written view's root no other argument passes skips the scan; one that shares it
    raises, launch after launch."""
    u, w = hetflow.array(squares()), hetflow.array(np.zeros(6))
    for _ in range(2):
        with pytest.raises(ShapeError):
            hetflow.forall(*smoothing(u), device=device)
        hetflow.forall(4, avg, interior(w, 1), section(u, (0,), (4,)), section(u, (2,), (4,)), device=device)
    expected = np.zeros(6)
    expected[1:-1] = (squares()[:-2] + squares()[2:]) / 2
    np.testing.assert_array_equal(w.numpy(), expected)
    np.testing.assert_array_equal(u.numpy(), squares())  # refused before anything ran


def test_the_cached_verdict_follows_the_offsets():
    """Views of one structure and other numbers are judged again: disjoint, then not."""
    for start, overlaps in ((3, False), (2, True), (3, False), (1, True)):
        u = squares()
        args = (3, copy, section(u, (0,), (3,)), section(u, (start,), (3,)))
        if overlaps:
            with pytest.raises(ShapeError):
                hetflow.forall(*args)
        else:
            hetflow.forall(*args)
            np.testing.assert_array_equal(u[:3], squares()[start:start + 3])


def test_the_cached_verdict_follows_the_strides_of_slices():
    """Slices of one array at one offset, of one shape and layout, stepping differently:
    the even elements written, the odd ones read (fine), then elements 1, 4, 7, 10 read
    (element 4 is written at index 2 and read at index 1)."""
    for step, overlaps in ((2, False), (3, True), (2, False)):
        a = np.arange(16.0)
        out, src = a[0:8:2], a[1:1 + 4 * step:step]
        if overlaps:
            with pytest.raises(ShapeError):
                hetflow.forall(4, copy, out, src)
        else:
            hetflow.forall(4, copy, out, src)
            np.testing.assert_array_equal(a[0:8:2], np.arange(16.0)[1:9:2])


def test_a_captured_graph_keeps_snapshot():
    u, expected = squares(), squares()
    expected[1:-1] = (expected[:-2] + expected[2:]) / 2
    with hetflow.graph("smooth") as g:
        hetflow.forall(*smoothing(u), snapshot=True)
    g.run(rules=RuleSet())
    np.testing.assert_array_equal(u, expected)
    with hetflow.graph("racy") as g:
        hetflow.forall(*smoothing(u))
    with pytest.raises(ShapeError):
        g.run(rules=RuleSet())


# -- the property: NumPy's result or ShapeError, the same on every device -----------------
@hetflow.kernel
def scale(i, j, out, x):
    out[i, j] = 2 * x[i, j] + 1


@hetflow.kernel
def combine(i, j, out, x, y):
    out[i, j] = x[i, j] - 3 * y[i, j]


@hetflow.kernel
def accumulate(i, j, out, x):
    out[i, j] += x[i, j]


KERNELS = {  # kernel, number of read arguments, NumPy's meaning (old out, reads)
    "scale": (scale, 1, lambda out, x: 2 * x + 1),
    "combine": (combine, 2, lambda out, x, y: x - 3 * y),
    "accumulate": (accumulate, 1, lambda out, x: out + x),
}
ROOT = (5, 5)


@st.composite
def views(draw, shape):
    """(chain, root number): a chain of view operations giving ``shape`` over one of two
    roots. A chain step is (name, parameters), applied by ``as_view`` and ``as_numpy``;
    "slice" and "T" are NumPy's own slicing and transpose."""
    a, b = shape
    kind = draw(st.sampled_from(["section", "cshift", "shifted", "transpose", "interior", "slice"]))
    if kind == "transpose":
        r0, c0 = draw(st.integers(0, ROOT[0] - b)), draw(st.integers(0, ROOT[1] - a))
        numpy_ = draw(st.booleans())  # NumPy's slice and transpose, or hetflow's views
        chain = [("slice" if numpy_ else "section", (r0, c0), (b, a)), ("T" if numpy_ else "transpose",)]
    elif kind == "slice":
        r0, c0 = draw(st.integers(0, ROOT[0] - a)), draw(st.integers(0, ROOT[1] - b))
        chain = [("slice", (r0, c0), (a, b))]
    elif kind == "interior":
        r0, c0 = draw(st.integers(0, ROOT[0] - a - 2)), draw(st.integers(0, ROOT[1] - b - 2))
        chain = [("section", (r0, c0), (a + 2, b + 2)), ("interior",)]
    else:
        r0, c0 = draw(st.integers(0, ROOT[0] - a)), draw(st.integers(0, ROOT[1] - b))
        chain = [("section", (r0, c0), (a, b))]
        shift = ("cshift", draw(st.integers(0, 1)), draw(st.integers(-3, 3)))
        if kind == "cshift":  # a shift of the section
            chain.append(shift)
        elif kind == "shifted":  # a section of the shifted root
            chain.insert(0, shift)
    return chain, draw(st.integers(0, 1))


def as_view(chain, root):
    x = root
    for step in chain:
        name = step[0]
        if name == "slice":
            (r, c), (a, b) = step[1:]
            x = x[r:r + a, c:c + b]
        else:
            x = (section(x, *step[1:]) if name == "section" else cshift(x, *step[1:]) if name == "cshift"
                 else transpose(x, 0, 1) if name == "transpose" else x.T if name == "T" else interior(x, 1))
    return x


def as_numpy(chain, grid):
    """The same chain applied by NumPy to an index grid: the root element of each view element."""
    x = grid
    for step in chain:
        name = step[0]
        if name in ("section", "slice"):
            (r, c), (a, b) = step[1:]
            x = x[r:r + a, c:c + b]
        elif name == "cshift":
            x = np.roll(x, -step[2], axis=step[1])
        elif name in ("transpose", "T"):
            x = x.T
        else:
            x = x[1:-1, 1:-1]
    return x


@st.composite
def launches(draw):
    name = draw(st.sampled_from(sorted(KERNELS)))
    shape = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    n_reads = KERNELS[name][1]
    return name, shape, [draw(views(shape)) for _ in range(1 + n_reads)]


def numpy_oracle(name, shape, args, roots):
    """(NumPy's roots after the launch, whether an element written at one launch index is
    touched through another argument at another index)."""
    grid = np.arange(np.prod(ROOT)).reshape(ROOT)
    flat = [r.ravel().copy() for r in roots]
    where = [(as_numpy(chain, grid), k) for chain, k in args]
    values = [flat[k][idx] for idx, k in where]  # every read before any write
    (out_idx, out_root), reads = where[0], where[1:]
    flat[out_root][out_idx] = KERNELS[name][2](*values)
    launch = np.arange(np.prod(shape)).reshape(shape)
    at = dict(zip(out_idx.ravel().tolist(), launch.ravel().tolist()))
    clash = any(k == out_root and at.get(e, i) != i
                for idx, k in reads for e, i in zip(idx.ravel().tolist(), launch.ravel().tolist()))
    return [f.reshape(ROOT) for f in flat], clash


def fresh_roots():
    return [np.arange(25.0).reshape(ROOT), 100 + np.arange(25.0).reshape(ROOT)]


@pytest.mark.simgpu
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(launches())
def test_random_views_give_numpys_result_or_aliasing_error_on_every_device(launch):
    name, shape, args = launch
    gpu = next(d.id for d in hetflow.devices() if d.kind == "gpu")
    expected, clash = numpy_oracle(name, shape, args, fresh_roots())
    for device in ("cpu0", gpu, ["cpu0", gpu]):
        for snapshot in (False, True):
            roots = fresh_roots()
            views_ = [as_view(chain, roots[k]) for chain, k in args]
            if clash and not snapshot:
                with pytest.raises(ShapeError):
                    hetflow.forall(shape, KERNELS[name][0], *views_, device=device)
                continue
            hetflow.forall(shape, KERNELS[name][0], *views_, device=device, snapshot=snapshot)
            for got, want in zip(roots, expected):
                np.testing.assert_array_equal(got, want, err_msg=f"{name} on {device}, snapshot={snapshot}")


@hetflow.kernel
def shift_left(i, out, a):
    out[i] = a[i + 1]


def test_numpy_slices_of_one_array_are_checked_by_address(device):
    u, expected = squares(), squares()
    expected[1:-1] = (expected[:-2] + expected[2:]) / 2
    with pytest.raises(ShapeError):
        hetflow.forall(4, avg, u[1:-1], u[:-2], u[2:], device=device)
    hetflow.forall(4, avg, u[1:-1], u[:-2], u[2:], device=device, snapshot=True)
    np.testing.assert_array_equal(u, expected)
    hetflow.forall(3, copy, u[:3], u[3:], device=device)  # disjoint halves of one array
    expected[:3] = expected[3:]
    np.testing.assert_array_equal(u, expected)


def test_an_argument_read_at_other_indices_counts_whole():
    """a[i + 1] is not the launch index: every element of a may be read at any index."""
    u = squares()
    with pytest.raises(ShapeError):
        hetflow.forall(5, shift_left, u, u)
    hetflow.forall(5, shift_left, u, u, snapshot=True)
    np.testing.assert_array_equal(u[:5], squares()[1:])
    v = squares()
    hetflow.forall(2, shift_left, section(v, (0,), (2,)), section(v, (3,), (3,)))  # apart: allowed
    np.testing.assert_array_equal(v[:2], squares()[4:6])


@hetflow.kernel
def shift_left_2d(i, j, out, a):
    if j + 1 < a.shape[1]:
        out[i, j] = a[i, j + 1]


@hetflow.kernel
def calls_shift_left_2d(i, j, out, a):
    shift_left_2d(i, j, out, a)


@hetflow.kernel
def calls_copy_by_row(i, j, out, a):
    copy(i, out, a)  # out[i] = a[i]: whole rows, at the row index alone


@pytest.mark.parametrize("kernel", [calls_shift_left_2d, calls_copy_by_row])
def test_a_kernel_reading_at_other_indices_through_a_called_kernel_is_refused(device, kernel):
    """A called kernel's offsets (a[i, j + 1]) or fewer indices (a[i] of a launch over
    (i, j)) count as the caller's: passing one array twice is refused as the direct call is."""
    m = np.arange(12.0).reshape(3, 4)
    with pytest.raises(ShapeError, match=rf"kernel '{kernel.name}' writes argument 'out' .* reads argument 'a'"):
        hetflow.forall((3, 4), kernel, m, m, device=device)
    np.testing.assert_array_equal(m, np.arange(12.0).reshape(3, 4))


def test_a_kernel_reading_at_other_indices_through_a_called_kernel_with_snapshot_is_numpys(device):
    m, expected = np.arange(12.0).reshape(3, 4), np.arange(12.0).reshape(3, 4)
    expected[:, :-1] = expected[:, 1:].copy()
    hetflow.forall((3, 4), calls_shift_left_2d, m, m, device=device, snapshot=True)
    np.testing.assert_array_equal(m, expected)
