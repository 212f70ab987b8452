"""The wavefront call site checks the user's kernel as forall does, before anything runs
on any device: the extent against its arrays, its parameters (defaults included),
checked mode and its other options, Buffers on the CPU, its tile size, arguments that
alias (refused where forall refuses them, run as one argument where forall accepts them)."""
import numpy as np
import pytest

import hetflow
from hetflow import interior, section
from hetflow.errors import ArgumentTypeError, IndexOutOfBoundsError, KernelRaisedError, ShapeError
from hetflow.runtime.wavefront import tile_kernel

RNG = np.random.default_rng(5)
DEVICES = ["cpu0", pytest.param("gpu0", marks=pytest.mark.simgpu)]


@hetflow.kernel
def put(i, j, a):
    a[i, j] = 7.0


@hetflow.kernel
def p2p(i, j, a):
    a[i + 1, j + 1] = a[i, j + 1] + a[i + 1, j] - a[i, j]


@hetflow.kernel
def p2p_plus(i, j, a, c=2.0):
    a[i + 1, j + 1] = a[i, j + 1] + a[i + 1, j] - a[i, j] + c


@hetflow.kernel(boundscheck=True, fastmath=True)
def checked_right(i, j, a):
    a[i, j + 1] = a[i, j] + 1.0  # j + 1 == 4 lies outside a 4-column a


@hetflow.kernel
def p2p_into(i, j, dst, src):  # dst[i, j] is src[i + 1, j + 1]
    dst[i, j] = src[i, j + 1] + src[i + 1, j] - src[i, j]


@hetflow.kernel
def one_index(i, a):
    a[i] = 1.0


@hetflow.kernel
def three_indices(i, j, k, a):
    a[i, j] = k


@hetflow.kernel
def no_data(i):
    pass


@hetflow.kernel
def fails_in_row(i, j, a):
    if i == 5 and j == 5:  # in the last diagonal of 2 x 2 tiles, alone
        raise ValueError("bad element")
    a[i, j] = 1.0


@hetflow.kernel
def p2p_and_scale(i, j, a, src, dst):  # src and dst read and written at (i, j) alone
    a[i + 1, j + 1] = a[i, j + 1] + a[i + 1, j] - a[i, j]
    dst[i, j] = 0.5 * src[i, j] + a[i + 1, j + 1]


@hetflow.kernel
def gauss_seidel_into(i, j, u, unew, f):  # u read at (i +- 1, j +- 1)
    unew[i, j] = 0.25 * (u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] + f[i, j])


@hetflow.kernel
def twice_through_a_lambda(i, j, src, dst):
    twice = lambda dst: dst * 2.0  # noqa: E731 (binds the name dst anew)
    dst[i, j] = twice(src[i, j])


def p2p_grid(m, n):
    a = np.zeros((m, n))
    a[0, :], a[:, 0] = np.arange(n), np.arange(m)
    return a


def seq_p2p(a, c=0.0):
    for i in range(1, a.shape[0]):
        for j in range(1, a.shape[1]):
            a[i, j] = a[i - 1, j] + a[i, j - 1] - a[i - 1, j - 1] + c


def seq_p2p_and_scale(a, src, dst, ext):
    """The sequential loop of p2p_and_scale (src and dst one array where they are)."""
    for i in range(ext[0]):
        for j in range(ext[1]):
            a[i + 1, j + 1] = a[i, j + 1] + a[i + 1, j] - a[i, j]
            dst[i, j] = 0.5 * src[i, j] + a[i + 1, j + 1]


@pytest.mark.parametrize("device", DEVICES)
def test_an_extent_beyond_the_array_is_refused_before_anything_runs(device):
    big = np.zeros((8, 4))
    with pytest.raises(ShapeError, match=r"kernel 'put' argument 'a': array of extent \(4, 4\) does not "
                                         r"fit the launch extent \(6, 4\)"):
        hetflow.wavefront((6, 4), put, big[:4], device=device)
    assert not big.any()


@pytest.mark.parametrize("device", DEVICES)
def test_a_view_must_match_the_extent(device):
    u = np.zeros((6, 6))
    with pytest.raises(ShapeError, match="kernel 'put' argument 'a': view of extent"):
        hetflow.wavefront((5, 4), put, interior(u, 1), device=device)
    assert not u.any()


@pytest.mark.parametrize("device", DEVICES)
def test_checked_mode_is_kept(device):
    big = np.zeros((4, 8))
    with pytest.raises(IndexOutOfBoundsError, match="kernel 'checked_right' indexed 'a' out of bounds: "
                                                    "index 4 on axis 1"):
        hetflow.wavefront((4, 4), checked_right, big[:, :4], device=device)
    assert not big[:, 4:].any()


def test_the_tile_kernel_has_the_kernels_options():
    tiles = tile_kernel(checked_right)
    assert (tiles.name, tiles.boundscheck, tiles.fastmath) == ("checked_right", True, True)


def test_a_buffer_on_the_cpu_equals_the_sequential_loop():
    want = p2p_grid(9, 7)
    buf = hetflow.array(want)
    hetflow.wavefront((8, 6), p2p, buf, tile=(3, 2), device="cpu0")
    seq_p2p(want)
    np.testing.assert_array_equal(np.asarray(buf), want)


@pytest.mark.simgpu
def test_a_buffer_written_on_the_gpu_is_swept_on_the_cpu(gpu_device):
    want = p2p_grid(6, 5)
    buf = hetflow.array(want)
    hetflow.wavefront((5, 4), p2p, buf, device=gpu_device)  # current on the GPU alone
    seq_p2p(want)
    hetflow.wavefront((5, 4), p2p_plus, buf, 1.0, device="cpu0")  # its host copy, made current
    seq_p2p(want, 1.0)
    np.testing.assert_array_equal(np.asarray(buf), want)


@pytest.mark.parametrize("device", DEVICES)
def test_default_parameter_values(device):
    a, want = p2p_grid(7, 6), p2p_grid(7, 6)
    hetflow.wavefront((6, 5), p2p_plus, a, tile=(2, 3), device=device)
    seq_p2p(want, 2.0)
    np.testing.assert_array_equal(a, want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernel, args, message", [
    (one_index, 1, r"kernel 'one_index' takes 0 data argument\(s\) \(\) after its 2 index parameter\(s\) "
                   r"\(i, a\), but 1 were given"),
    (three_indices, 1, r"kernel 'three_indices' takes 2 data argument\(s\) \(k, a\) after its 2 index "
                       r"parameter\(s\) \(i, j\), but 1 were given"),
    (p2p, 0, r"kernel 'p2p' takes 1 data argument\(s\) \(a\) after its 2 index parameter\(s\) \(i, j\), "
             r"but 0 were given"),
    (p2p, 2, r"kernel 'p2p' takes 1 data argument\(s\) \(a\) .* but 2 were given"),
    (no_data, 0, r"wavefront: kernel 'no_data' takes 1 parameter\(s\) \(i\); it must take two index "
                 r"parameters \(i, j\)"),
])
def test_wrong_kernels_and_arguments_name_the_users_kernel(device, kernel, args, message):
    a = np.zeros((4, 4))
    with pytest.raises(ArgumentTypeError, match=message):
        hetflow.wavefront((3, 3), kernel, *(a,) * args, device=device)
    with pytest.raises(ArgumentTypeError, match=message):  # checked even where nothing runs
        hetflow.wavefront((0, 3), kernel, *(a,) * args, device=device)


@pytest.mark.simgpu
def test_a_gpu_kernel_that_raises_names_the_grid_rows(gpu_device):
    with pytest.raises(KernelRaisedError, match=r"kernel 'fails_in_row' raised ValueError on gpu0 in rows "
                                                r"\[4, 6\).*bad element"):
        hetflow.wavefront((6, 6), fails_in_row, np.zeros((6, 6)), tile=(2, 2), device=gpu_device)


@pytest.mark.parametrize("device", DEVICES)
def test_aliased_arguments_are_refused_in_wavefronts_terms(device):
    a = p2p_grid(5, 5)
    before = a.copy()
    with pytest.raises(ShapeError, match="wavefront: kernel 'p2p_into' writes argument 'dst' .* and reads "
                                         "argument 'src' .* overlap in one array") as info:
        hetflow.wavefront((4, 4), p2p_into, section(a, (1, 1), (4, 4)), a, device=device)
    assert "snapshot" not in str(info.value)
    np.testing.assert_array_equal(a, before)


def test_disjoint_parts_of_one_array_are_not_aliases():
    a = RNG.random((5, 10))
    want = a.copy()
    for i in range(4):
        for j in range(4):
            want[i + 1, j + 1] = want[i, j + 6] + want[i + 1, j + 5] - want[i, j + 5]
    hetflow.wavefront((4, 4), p2p_into, section(a, (1, 1), (4, 4)), a[:, 5:])
    np.testing.assert_array_equal(a, want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tile, error, message", [
    ((1.5, 2.7), ArgumentTypeError, r"wavefront: tile \(1\.5, 2\.7\) has side 1\.5 \(float\), which is not an integer"),
    ((2, 3.0), ArgumentTypeError, r"wavefront: tile \(2, 3\.0\) has side 3\.0 \(float\), which is not an integer"),
    ((True, 2), ArgumentTypeError, r"wavefront: tile \(True, 2\) has side True \(bool\), which is not an integer"),
    (3, ArgumentTypeError, r"wavefront: tile must be \(rows, columns\), a pair of integers; got int 3"),
    ("23", ArgumentTypeError, r"wavefront: tile must be \(rows, columns\), a pair of integers; got str '23'"),
    ((2, 3, 4), ShapeError, r"wavefront: tile must be \(rows, columns\); got \(2, 3, 4\), of 3 side\(s\)"),
    ((0, 2), ShapeError, r"wavefront: tile \(0, 2\) must have positive sides"),
    ((2, -1), ShapeError, r"wavefront: tile \(2, -1\) must have positive sides"),
])
def test_a_tile_must_be_two_positive_integers(device, tile, error, message):
    a = p2p_grid(5, 5)
    before = a.copy()
    with pytest.raises(error, match=message):
        hetflow.wavefront((4, 4), p2p, a, tile=tile, device=device)
    with pytest.raises(error, match=message):  # checked even where nothing runs
        hetflow.wavefront((0, 4), p2p, a, tile=tile, device=device)
    np.testing.assert_array_equal(a, before)


def test_numpy_integer_tiles_are_taken():
    a, want = p2p_grid(8, 7), p2p_grid(8, 7)
    hetflow.wavefront((7, 6), p2p, a, tile=(np.int64(3), np.int32(2)))
    seq_p2p(want)
    np.testing.assert_array_equal(a, want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("alias", ["one array", "equal slices", "views of one structure", "a slice and a view"])
def test_arguments_forall_accepts_run_as_the_sequential_loop(device, alias):
    grid, want_grid = p2p_grid(7, 8), p2p_grid(7, 8)
    b = RNG.random((8, 9))
    want = b.copy()
    ext = (6, 7)
    src, dst = {
        "one array": (b, b),
        "equal slices": (b[:6, :7], b[:6, :7]),
        "views of one structure": (interior(b, 1), interior(b, 1)),
        "a slice and a view": (b[1:-1, 1:-1], interior(b, 1)),
    }[alias]
    hetflow.forall(ext, p2p_and_scale, grid.copy(), src, dst, device=device)  # forall accepts them
    b[:] = want
    hetflow.wavefront(ext, p2p_and_scale, grid, src, dst, tile=(2, 3), device=device)
    window = want if alias == "one array" else want[:6, :7] if alias == "equal slices" else want[1:-1, 1:-1]
    seq_p2p_and_scale(want_grid, window, window, ext)
    np.testing.assert_array_equal(grid, want_grid)
    np.testing.assert_array_equal(b, want)


def test_a_buffer_passed_twice_on_the_cpu():
    grid, want_grid = p2p_grid(6, 6), p2p_grid(6, 6)
    want = RNG.random((5, 5))
    buf = hetflow.array(want)
    hetflow.wavefront((5, 5), p2p_and_scale, grid, buf, buf, tile=(2, 2), device="cpu0")
    seq_p2p_and_scale(want_grid, want, want, (5, 5))
    np.testing.assert_array_equal(np.asarray(buf), want)


@pytest.mark.parametrize("device", DEVICES)
def test_aliases_forall_refuses_are_refused(device):
    u, f = RNG.random((6, 6)), RNG.random((6, 6))
    before = u.copy()
    args = interior(u, 1), interior(u, 1), interior(f, 1)
    with pytest.raises(ShapeError, match="kernel 'gauss_seidel_into' writes argument 'unew'"):
        hetflow.forall((4, 4), gauss_seidel_into, *args, device=device)
    with pytest.raises(ShapeError, match=r"wavefront: kernel 'gauss_seidel_into' writes argument 'unew' "
                                         r"\(interior\(.*\)\) and reads argument 'u' \(interior\(.*\)\), "
                                         r"which overlap in one array at different indices"):
        hetflow.wavefront((4, 4), gauss_seidel_into, *args, device=device)
    np.testing.assert_array_equal(u, before)


@pytest.mark.parametrize("src, dst", [
    ("whole", "part"), ("part", "whole"),  # the same elements at each index, in other shapes
])
def test_aliases_that_are_not_one_array_are_refused(src, dst):
    b = RNG.random((6, 7))
    before = b.copy()
    parts = {"whole": b, "part": b[:4, :5]}
    hetflow.forall((4, 5), p2p_and_scale, p2p_grid(5, 6), parts[src], parts[dst])  # forall accepts them
    b[:] = before
    with pytest.raises(ShapeError, match=r"wavefront: kernel 'p2p_and_scale' writes argument 'dst' .* and reads "
                                         r"argument 'src' .*, which overlap in one array; each index touches their "
                                         r"shared elements at that index alone, as forall allows, but a wavefront "
                                         r"runs two arguments over one array only as one, where they are the same "
                                         r"elements in the same shape"):
        hetflow.wavefront((4, 5), p2p_and_scale, p2p_grid(5, 6), parts[src], parts[dst])
    np.testing.assert_array_equal(b, before)


def test_one_array_under_a_name_the_kernel_binds_anew_is_refused():
    b = RNG.random((3, 4))
    want = 2.0 * b
    hetflow.forall((3, 4), twice_through_a_lambda, b, b)  # forall accepts it
    np.testing.assert_array_equal(b, want)
    with pytest.raises(ShapeError, match=r"kernel 'twice_through_a_lambda' writes argument 'dst' .* the kernel "
                                         r"binds neither name anew \(an assignment, a loop, a lambda's parameter\)"):
        hetflow.wavefront((3, 4), twice_through_a_lambda, b, b)
    np.testing.assert_array_equal(b, want)
