"""What access analysis and launch binding get right for real kernels: guarded accesses
to arrays smaller than the launch, scalars handed to calls, kernels calling kernels,
default arguments, and small launches of heavy work spread over the cores."""
import logging
import math
import warnings

import numba
import numpy as np
import pytest

import hetflow
from test_ir_graph import add, scale


# -- guards --------------------------------------------------------------------------------
@hetflow.kernel
def fused(i, n, x, y, out_x, out_y):
    """Two loops of different lengths in one launch: y has n < len(x) elements."""
    out_x[i] = 2 * x[i]
    if i < n:
        out_y[i] = y[i] + 1


@hetflow.kernel
def early_return(i, j, x, out):
    if i >= x.shape[0]:
        return
    out[i, j] = x[i, j] * 3


@hetflow.kernel
def unguarded(i, n, x, y, out_x, out_y):
    out_x[i] = 2 * x[i]
    out_y[i] = y[i] + 1


def test_a_guarded_smaller_array_is_accepted():
    x, y = np.arange(10.0), np.arange(4.0)
    out_x, out_y = np.zeros(10), np.zeros(4)
    hetflow.forall(10, fused, 4, x, y, out_x, out_y, device="cpu0")
    np.testing.assert_array_equal(out_x, 2 * x)
    np.testing.assert_array_equal(out_y, y + 1)


def test_a_guard_by_early_return_covers_only_its_own_axis():
    x = np.arange(12.0).reshape(3, 4)
    out = np.zeros((3, 4))
    hetflow.forall((5, 4), early_return, x, out, device="cpu0")
    np.testing.assert_array_equal(out, 3 * x)
    with pytest.raises(hetflow.errors.ShapeError, match="'x'"):  # axis 1 is not guarded
        hetflow.forall((3, 6), early_return, x, out, device="cpu0")


def test_an_unguarded_smaller_array_is_refused():
    with pytest.raises(hetflow.errors.ShapeError, match=r"'y'.*guard its accesses"):
        hetflow.forall(10, unguarded, 4, np.arange(10.0), np.arange(4.0), np.zeros(10), np.zeros(4),
                       device="cpu0")


def test_a_guard_that_does_not_hold_still_fails_in_checked_mode():
    checked = hetflow.kernel(fused.pyfunc, boundscheck=True)
    with pytest.raises(hetflow.errors.IndexOutOfBoundsError, match="'y'"):
        hetflow.forall(10, checked, 6, np.arange(10.0), np.arange(4.0), np.zeros(10), np.zeros(4),
                       device="cpu0")


# -- scalars handed to calls, kernels calling kernels -----------------------------------------
@hetflow.kernel
def moments(i, n, m, scale, x, out):
    acc = 0.0
    for t in range(n):
        acc += x[i] ** t
    out[i] = acc * int(scale) + min(n, m)


@hetflow.kernel
def double(j, x, out):
    out[j] = 2 * x[j]


@hetflow.kernel
def calls_a_kernel(i, x, out):
    double(i, x, out)


def _expected_moments(n, m, scale, x):
    return sum(x ** t for t in range(n)) * int(scale) + min(n, m)


def test_scalars_handed_to_calls_are_not_written():
    access = moments.access(1)
    assert not any(access.writes(p) for p in ("n", "m", "scale"))
    assert "out" in access.rows and not access.scattered


@pytest.mark.simgpu
@pytest.mark.parametrize("kernel", ["moments", "calls_a_kernel"])
def test_co_executes_on_cpu_and_simulated_gpu_without_a_warning(gpu_device, caplog, kernel):
    x = np.linspace(0, 1, 40)
    out = np.zeros(40)
    args = (3, 2, 2.5, x, out) if kernel == "moments" else (x, out)
    with caplog.at_level(logging.WARNING), warnings.catch_warnings():
        warnings.simplefilter("error")
        report = hetflow.forall(40, globals()[kernel], *args, device=["cpu0", gpu_device.id],
                                schedule="static", shares=[0.5, 0.5])
    assert not caplog.records
    assert {w.device_id for w in report.workers if w.indices} == {"cpu0", gpu_device.id}
    want = _expected_moments(3, 2, 2.5, x) if kernel == "moments" else 2 * x
    np.testing.assert_allclose(out, want, rtol=1e-12)


def test_a_kernel_call_maps_the_callee_access_onto_the_caller():
    access = calls_a_kernel.access(1)
    assert (access.modes, access.rows) == ({"x": "r", "out": "w"}, frozenset({"x", "out"}))
    assert access.identity == {"x": 1, "out": 1} and not access.scattered


# -- default arguments --------------------------------------------------------------------
@hetflow.kernel
def scaled(i, x, out, factor=2.0, shift=1.0):
    out[i] = factor * x[i] + shift


@pytest.mark.parametrize("given, factor, shift", [((), 2.0, 1.0), ((3.0,), 3.0, 1.0), ((3.0, 0.5), 3.0, 0.5)])
def test_default_arguments_are_honoured(given, factor, shift):
    x, out = np.arange(6.0), np.zeros(6)
    hetflow.forall(6, scaled, x, out, *given, device="cpu0")
    np.testing.assert_array_equal(out, factor * x + shift)


@pytest.mark.simgpu
def test_default_arguments_on_the_simulated_gpu(gpu_device):
    x, out = np.arange(6.0), np.zeros(6)
    hetflow.forall(6, scaled, x, out, device=gpu_device.id)
    np.testing.assert_array_equal(out, 2.0 * x + 1.0)


def test_arguments_missing_without_a_default_are_refused():
    with pytest.raises(hetflow.errors.ArgumentTypeError, match="takes 4 data argument"):
        hetflow.forall(6, scaled, np.arange(6.0), device="cpu0")


# -- small launches of heavy work ------------------------------------------------------------
@hetflow.kernel
def count_in_bin(i, samples, width, counts):
    c = 0
    for k in range(samples.shape[0]):
        if i * width <= samples[k] < (i + 1) * width:
            c += 1
    counts[i] = c


def test_a_small_launch_of_heavy_work_uses_more_than_one_worker():
    if numba.get_num_threads() < 2:
        pytest.skip("one CPU thread")
    bins, samples = 200, np.random.default_rng(3).random(200_000)
    want = np.array([np.count_nonzero((k / bins <= samples) & (samples < (k + 1) / bins)) for k in range(bins)])
    for launch in range(2):  # the first measures the cost of a row, the second knows it
        counts = np.zeros(bins, np.int64)
        report = hetflow.forall(bins, count_in_bin, samples, 1 / bins, counts, device="cpu0")
        np.testing.assert_array_equal(counts, want, err_msg=f"launch {launch}")
        assert len(report.workers) > 1, report.summary()
        assert sum(w.indices for w in report.workers) == bins
        assert sorted((e.lo, e.hi) for e in report.events)[0][0] == 0


@hetflow.kernel
def through_a_nested_function(i, x, out):
    def at(k):
        out[k] = 2 * x[k]
    at(i)


def test_stores_inside_a_nested_function_are_not_judged_scattered():
    """Their indices come through the nested function's parameters, which the analysis
    does not follow (hetflow's wavefront tiles run the user's body that way)."""
    access = through_a_nested_function.access(1)
    assert access.writes("out") and not access.scattered
    x, out = np.arange(5.0), np.zeros(5)
    hetflow.forall(5, through_a_nested_function, x, out, device="cpu0")
    np.testing.assert_array_equal(out, 2 * x)


@hetflow.kernel
def overwrites(i, j, out, half, x):
    out[i, j] = 2.0 * x[i, j]
    half[i, j] = x[i, j]  # written, then read below: it must come in
    half[i, j] = half[i, j] * 0.5


@hetflow.kernel
def overwrites_where(i, out, x):
    if x[i] > 0.5:
        out[i] = x[i]


@hetflow.kernel
def returns_early(i, out, x):
    if x[i] > 0.5:
        return
    out[i] = x[i]


@hetflow.kernel
def overwrites_in_a_loop(i, out, x):
    for k in range(1):
        out[i] = x[i] + k


def test_covered_only_where_every_launch_index_overwrites_without_reading():
    access = overwrites.access(2)
    assert access.covered == {"out", "half"} and access.reads("half") and not access.reads("out")
    assert overwrites.access(1).covered == frozenset()          # out[i, j] is not row i whole
    for kernel in (overwrites_where, returns_early, overwrites_in_a_loop):
        assert kernel.access(1).covered == frozenset()


@pytest.mark.simgpu
@pytest.mark.parametrize("kernel", [overwrites_where, returns_early])
def test_co_executed_conditional_writes_keep_the_other_elements(gpu_device, kernel):
    # the kernel writes some elements only: the others must come back from the GPU as they were
    x = np.random.default_rng(3).random(600)
    out = np.full(600, -1.0)
    hetflow.forall(600, kernel, out, x, device=["cpu0", gpu_device.id], schedule="static",
                   shares=[0.5, 0.5])
    want = np.where(x > 0.5, x, -1.0) if kernel is overwrites_where else np.where(x > 0.5, -1.0, x)
    np.testing.assert_array_equal(out, want)


@hetflow.kernel
def write_through_alias(i, x, out):
    o = out
    o[i] = 2.0 * x[i]


@hetflow.kernel
def write_through_chosen(i, flag, x, out, other):
    o, _ = (out if flag else other), x
    p = o
    p[i] = x[i]


@hetflow.kernel
def write_through_rebound(i, x, out):
    out = x
    out[i] = 1.0


def test_an_array_written_through_another_name_counts_as_written():
    # The write was not seen: a graph reordered the launch, and a GPU never copied it back.
    assert write_through_alias.access(1).modes == {"x": "r", "out": "rw"}
    modes = write_through_chosen.access(1).modes
    assert "w" in modes["out"] and "w" in modes["other"] and modes["flag"] == ""
    assert "w" in write_through_rebound.access(1).modes["x"]


@pytest.mark.simgpu
def test_a_write_through_an_alias_reaches_the_host_from_a_gpu(gpu_device):
    x, out = np.arange(8.0), np.zeros(8)
    hetflow.forall(8, write_through_alias, x, out, device=gpu_device.id)
    np.testing.assert_array_equal(out, 2.0 * x)


def test_a_graph_keeps_the_order_of_a_write_through_an_alias():
    n = 16

    def program(x, w, y):
        hetflow.forall(n, scale, 2.0, x, y)               # y = 2x
        hetflow.forall(n - 1, write_through_alias, y, w)  # w[:n-1] = 2y
        hetflow.forall(n, add, y, w, x)                   # x = y + w

    eager = [np.arange(n, dtype=float), np.zeros(n), np.zeros(n)]
    program(*eager)
    captured = [np.arange(n, dtype=float), np.zeros(n), np.zeros(n)]
    with hetflow.graph() as g:
        program(*captured)
    g.run()
    np.testing.assert_array_equal(captured[0], eager[0])



RECORD = np.dtype([("x", "f8"), ("y", "i4")])


@hetflow.kernel
def bump_row(i, a):
    row = a[i]  # a view of row i: Numba hands it out by reference
    row[0] = row[0] + 7.0


@hetflow.kernel
def bump_record(i, a):
    r = a[i]  # a reference to record i
    r.y = r.y + 7


@hetflow.kernel
def fill_row(i, a):
    row = a[i]
    row.fill(3.0)


@hetflow.kernel
def reads_an_element(i, a, out):
    v = a[i]
    w = v if v > 0 else -v
    out[i] = math.sqrt(w) + v


def _bumped_rows():
    want = np.zeros((4, 3))
    want[:, 0] = 7.0
    return want


def _bumped_records():
    want = np.zeros(4, RECORD)
    want["y"] = np.arange(4) + 7
    return want


@pytest.mark.parametrize("kernel", [bump_row, bump_record, fill_row])
def test_a_write_through_a_row_or_record_held_by_a_local_counts_as_written(kernel):
    assert "w" in kernel.access(1).modes["a"]


def test_reading_an_element_held_by_a_local_is_no_write():
    # the common case keeps its precise access: read at the launch index alone
    access = reads_an_element.access(1)
    assert access.modes == {"a": "r", "out": "w"} and access.aligned == {"a", "out"}


@pytest.mark.simgpu
@pytest.mark.parametrize("where", ["on-cpu", "on-a-gpu", "co-executed"])  # not "gpu": the real-GPU mark
def test_a_write_through_a_row_held_by_a_local_reaches_the_host(gpu_device, where):
    # Before, a GPU never copied such a write back: the rows stayed zero.
    device = {"on-cpu": "cpu0", "on-a-gpu": gpu_device.id, "co-executed": ["cpu0", gpu_device.id]}[where]
    a = np.zeros((4, 3))
    hetflow.forall(4, bump_row, a, device=device)
    np.testing.assert_array_equal(a, _bumped_rows())
    recs = np.zeros(4, RECORD)
    recs["y"] = np.arange(4)
    hetflow.forall(4, bump_record, recs, device=device)
    np.testing.assert_array_equal(recs, _bumped_records())


@hetflow.kernel
def scratch_under_a_parameters_name(i, out, x):
    out = np.zeros(x.shape[0])  # out names a scratch array from here on
    out[i] = x[i]


@pytest.mark.simgpu
@pytest.mark.parametrize("where", ["on-cpu", "on-a-gpu", "co-executed"])
def test_a_parameter_bound_anew_is_not_overwritten_at_the_launch_index(gpu_device, where):
    # Before, out counted as overwritten at i: a GPU copied none of it in and all of it
    # back, over the caller's values.
    access = scratch_under_a_parameters_name.access(1)
    assert access.covered == frozenset() and "out" not in access.identity and "out" not in access.rows
    device = {"on-cpu": "cpu0", "on-a-gpu": gpu_device.id, "co-executed": ["cpu0", gpu_device.id]}[where]
    out, x = np.full(8, 5.0), np.arange(8.0)
    hetflow.forall(8, scratch_under_a_parameters_name, out, x, device=device)
    np.testing.assert_array_equal(out, np.full(8, 5.0))
