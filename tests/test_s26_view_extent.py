"""A view's extent inside a kernel: ``v.shape``, ``v.shape[k]``, ``v.size`` and ``len(v)``
answer as NumPy does for the view's array (``v.numpy()``), for every view kind, views of
views, views over coherent arrays and views sharing their root with another argument, on
the CPU and on a GPU. The extent is launch data: views of other extents run the one
compiled kernel."""
import numpy as np
import pytest

import hetflow
from hetflow import co_map, cshift, interior, project, section, tile, transpose
from hetflow.errors import KernelCompileError, KernelRaisedError
from hetflow.runtime.launch import bind

SLOTS = 8  # out's columns: len, size, ndim, then the shape (rank 4 at most)


@hetflow.kernel
def extent_of(i, v, out):
    out[i, 0] = len(v)
    out[i, 1] = v.size
    out[i, 2] = v.ndim
    s = v.shape
    for k in range(len(s)):
        out[i, 3 + k] = s[k]


@hetflow.kernel
def encoded(i, v, out):
    out[i] = v.shape[0] * 100 + v.shape[1]


@hetflow.kernel
def row_sums(i, v, out):
    s = 0.0
    for j in range(v.shape[1]):
        s += v[i, j]
    out[i] = s


@hetflow.kernel(boundscheck=True)
def checked_row_sums(i, v, out):
    s = 0.0
    for j in range(v.shape[1]):
        s += v[i, j]
    out[i] = s + len(v) * 1000 + v.size * 100000


@hetflow.kernel
def two_extents(i, a, b, out):
    out[i] = a.shape[0] * 1000 + a.shape[1] * 100 + b.shape[0] * 10 + b.size + a[0, 0] * 0


@hetflow.kernel
def rank0_size(i, v, out):
    out[i] = v.size * 10 + len(v.shape)


@hetflow.kernel
def rank0_len(i, v, out):
    out[i] = len(v)


def _want(w: np.ndarray) -> np.ndarray:
    """NumPy's answers for array ``w``, as extent_of writes them."""
    row = np.zeros(SLOTS, np.int64)
    row[:3] = len(w), w.size, w.ndim
    row[3:3 + w.ndim] = w.shape
    return row


A = np.arange(48.0).reshape(6, 8)
# Every view kind, views of views, and views over a coherent array (hetflow.array).
VIEWS = {
    "section": lambda: section(A.astype(np.float32), (1, 2), (3, 4)),
    "transpose": lambda: transpose(A.astype(np.int32), 0, 1),
    "cshift": lambda: cshift(A, 1, 3),
    "interior": lambda: interior(A, (1, 2)),
    "project": lambda: project(A, 0, 2),
    "tile": lambda: tile(A, (2, 4)),
    "co_map": lambda: co_map(A, lambda idx: (idx[0], 7 - idx[1]), (6, 8)),
    "section-1d": lambda: section(np.arange(8.0), (2,), (5,)),
    "interior-of-transpose": lambda: interior(transpose(A, 0, 1), (2, 1)),
    "cshift-of-interior": lambda: cshift(interior(A, 1), 0, -1),
    "section-of-tile": lambda: section(tile(A, (3, 2)), (1, 0), (1, 4)),
    "interior-of-array": lambda: interior(hetflow.array(A), 1),
    "transpose-of-section-of-array": lambda: transpose(section(hetflow.array(A), (0, 1), (5, 6)), 0, 1),
}


@pytest.fixture(params=list(VIEWS))
def view(request):
    return VIEWS[request.param]()


def _check_view(v, device):
    w = v.numpy()
    out = np.zeros((3, SLOTS), np.int64)
    hetflow.forall(3, extent_of, v, out, device=device)
    np.testing.assert_array_equal(out, np.tile(_want(w), (3, 1)), err_msg=f"{v!r} on {device}")
    if not w.ndim > v.rank:  # (a tile view's elements add their dimensions)
        assert tuple(out[0, 3:3 + w.ndim]) == tuple(v.shape)


def _check_row_sums(device):
    a = A ** 1.5
    for v in (transpose(a, 0, 1), interior(a, (1, 2)), interior(transpose(a, 0, 1), (2, 1)), cshift(a, 1, -3),
              section(interior(hetflow.array(a), 1), (1, 1), (3, 4))):
        w = v.numpy()
        out = np.zeros(w.shape[0])
        hetflow.forall(w.shape[0], row_sums, v, out, device=device)
        np.testing.assert_allclose(out, w.sum(axis=1), err_msg=f"{v!r} on {device}")


def _check_checked_and_fresh(device):
    """A bounds-checked kernel, and views over a co_map lowered afresh each launch (its
    function captures an unhashable array), of two extents."""
    shift = np.array([1])
    for rows in (4, 5):
        for v in (co_map(A, lambda idx: (idx[0] + shift[0], idx[1]), (rows, 8)), interior(A, (rows - 3, 1))):
            w = v.numpy()
            out = np.zeros(len(w))
            hetflow.forall(len(w), checked_row_sums, v, out, device=device)
            np.testing.assert_allclose(out, w.sum(axis=1) + len(w) * 1000 + w.size * 100000, err_msg=f"{v!r}")


def _check_shared_root(device):
    u = np.arange(60.0).reshape(6, 10)
    a, b = interior(u, (1, 2)), section(transpose(u, 0, 1), (1, 0), (7, 3))
    wa, wb = a.numpy(), b.numpy()
    out = np.zeros(4)
    hetflow.forall(4, two_extents, a, b, out, device=device)
    np.testing.assert_array_equal(out, wa.shape[0] * 1000 + wa.shape[1] * 100 + wb.shape[0] * 10 + wb.size)


def _check_one_compiled_kernel(device):
    """Views of three extents (and one structure) run one executable; each answers its own extent."""
    dev = hetflow.get_device(device)
    executables = []
    for rows, cols in ((6, 8), (9, 5), (12, 30)):
        v = interior(np.zeros((rows, cols)), 1)
        out = np.zeros(2)
        hetflow.forall(2, encoded, v, out, device=device)
        assert (out == (rows - 2) * 100 + cols - 2).all(), (rows, cols, out)
        executables.append(bind(encoded, 2, (v, out), dev).plan.executable)
    assert all(exe is executables[0] for exe in executables)
    entry = executables[0].entry
    if dev.kind == "cpu":  # Numba's dispatcher: one compiled signature
        assert len(entry.signatures) == 1


# -- CPU --------------------------------------------------------------------------------------
def test_every_view_kinds_extent_is_numpys_on_the_cpu(view):
    _check_view(view, "cpu0")


def test_row_sums_over_the_views_own_extent_are_numpys_on_the_cpu():
    _check_row_sums("cpu0")


def test_checked_kernels_and_views_lowered_afresh_read_the_extent_on_the_cpu():
    _check_checked_and_fresh("cpu0")


def test_views_sharing_a_root_each_answer_their_own_extent_on_the_cpu():
    _check_shared_root("cpu0")


def test_views_of_other_extents_reuse_one_compiled_kernel_on_the_cpu():
    _check_one_compiled_kernel("cpu0")


def test_a_rank_0_view_has_size_1_and_an_empty_shape_and_no_len_on_the_cpu():
    v = project(np.arange(8.0), 0, 3)
    out = np.zeros(2)
    hetflow.forall(2, rank0_size, v, out, device="cpu0")
    np.testing.assert_array_equal(out, v.numpy().size * 10 + v.numpy().ndim)
    with pytest.raises(KernelCompileError, match=r"kernel 'rank0_len'.*len\(\) of a rank-0 view"):
        hetflow.forall(2, rank0_len, v, out, device="cpu0")


# -- GPU: simulated (simgpu), real (gpu) ---------------------------------------------------------
@pytest.fixture(params=[pytest.param("simulated", marks=pytest.mark.simgpu),
                        pytest.param("real", marks=pytest.mark.gpu)])
def gpu_kind(request):
    return request.param


def test_every_view_kinds_extent_is_numpys_on_a_gpu(gpu_kind, gpu_device, view):
    _check_view(view, gpu_device.id)


def test_row_sums_over_the_views_own_extent_are_numpys_on_a_gpu(gpu_kind, gpu_device):
    _check_row_sums(gpu_device.id)


def test_checked_kernels_and_views_lowered_afresh_read_the_extent_on_a_gpu(gpu_kind, gpu_device):
    _check_checked_and_fresh(gpu_device.id)


def test_views_sharing_a_root_each_answer_their_own_extent_on_a_gpu_and_co_executed(gpu_kind, gpu_device,
                                                                                    tiny_chunks):
    _check_shared_root(gpu_device.id)
    _check_shared_root(["cpu0", gpu_device.id])


def test_views_of_other_extents_reuse_one_compiled_kernel_on_a_gpu(gpu_kind, gpu_device):
    _check_one_compiled_kernel(gpu_device.id)


def test_a_rank_0_views_len_is_refused_on_a_gpu(gpu_kind, gpu_device):
    v = project(np.arange(8.0), 0, 3)
    out = np.zeros(2)
    hetflow.forall(2, rank0_size, v, out, device=gpu_device.id)
    np.testing.assert_array_equal(out, 10)
    error = KernelRaisedError if gpu_kind == "simulated" else KernelCompileError
    with pytest.raises(error, match=r"kernel 'rank0_len'.*len\(\) of a rank-0 view"):
        hetflow.forall(2, rank0_len, v, out, device=gpu_device.id)
