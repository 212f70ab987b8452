"""Views passed to kernels lower to index arithmetic: oracle NumPy, no copies."""
import numpy as np
import pytest

import hetflow
from hetflow import co_map, cshift, interior, project, section, transpose
from hetflow.errors import KernelError, ShapeError


@hetflow.kernel
def jacobi(i, j, new, c, n, s, w, e):
    new[i, j] = 0.25 * (n[i, j] + s[i, j] + w[i, j] + e[i, j]) + 0.0 * c[i, j]


@hetflow.kernel
def copy2(i, j, src, dst):
    dst[i, j] = src[i, j]


@hetflow.kernel
def copy1(i, src, dst):
    dst[i] = src[i]


def _jacobi_views(u, v):
    return (interior(v, 1), interior(u, 1), interior(cshift(u, 0, -1), 1), interior(cshift(u, 0, 1), 1),
            interior(cshift(u, 1, -1), 1), interior(cshift(u, 1, 1), 1))


def _jacobi_numpy(u):
    out = u.copy()
    out[1:-1, 1:-1] = 0.25 * (u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:])
    return out


def test_jacobi_with_interior_and_cshift_matches_numpy():
    u = np.random.default_rng(0).random((64, 48))
    v = u.copy()
    views = _jacobi_views(u, v)
    hetflow.forall(views[0].shape, jacobi, *views)
    np.testing.assert_array_equal(v, _jacobi_numpy(u))


def test_writes_through_views_land_in_the_parent():
    a = np.arange(30.0).reshape(5, 6)
    dst = np.zeros((6, 5))
    hetflow.forall((5, 6), copy2, a, transpose(dst, 0, 1))
    np.testing.assert_array_equal(dst, a.T)
    plane = np.zeros((4, 3, 5))
    hetflow.forall((4, 5), copy2, np.ones((4, 5)), project(plane, 1, 2))
    assert plane[:, 2, :].sum() == 20 and plane.sum() == 20


def test_wrapping_cshift_and_section_and_co_map():
    a = np.arange(10.0)
    out = np.zeros(10)
    hetflow.forall(10, copy1, cshift(a, 0, 3), out)  # wraps: modulo path
    np.testing.assert_array_equal(out, np.roll(a, -3))
    out = np.zeros(4)
    hetflow.forall(4, copy1, section(a, (5,), (4,)), out)
    np.testing.assert_array_equal(out, a[5:9])
    rev = co_map(a, lambda idx: (9 - idx[0],), (10,))
    out = np.zeros(10)
    hetflow.forall(10, copy1, rev, out)
    np.testing.assert_array_equal(out, a[::-1])


def test_same_structure_other_numbers_reuses_the_executable():
    from hetflow.platform.repository import repository

    a = np.arange(12.0)
    out = np.zeros(12)
    hetflow.forall(12, copy1, cshift(a, 0, 2), out)
    before = repository().compiled
    for s in (1, 3, 4):  # the same wrap guard (index stays below 2n) as shift 2
        hetflow.forall(12, copy1, cshift(a, 0, s), out)
        np.testing.assert_array_equal(out, np.roll(a, -s))
    assert repository().compiled == before


def test_view_extent_must_match_the_launch():
    u = np.zeros((8, 8))
    with pytest.raises(ShapeError, match=r"view of extent \(6, 6\) does not fit the launch extent \(8, 8\)"):
        hetflow.forall((8, 8), copy2, interior(u, 1), u)


def test_views_may_only_be_subscripted():
    @hetflow.kernel
    def leaks(i, v, out):
        out[i] = v.strides[0]

    with pytest.raises(KernelError, match="kernel 'leaks'.*failed to compile.*hetflow.view"):
        hetflow.forall(4, leaks, section(np.zeros(8), (0,), (4,)), np.zeros(4))


@pytest.mark.simgpu
def test_views_on_the_simulated_gpu(gpu_device):
    u = np.random.default_rng(1).random((8, 7))
    v = u.copy()
    views = _jacobi_views(u, v)
    hetflow.forall(views[0].shape, jacobi, *views, device=gpu_device)
    np.testing.assert_array_equal(v, _jacobi_numpy(u))


@pytest.mark.gpu
def test_views_on_a_real_gpu(gpu_device):
    u = np.random.default_rng(2).random((513, 700))
    v = u.copy()
    views = _jacobi_views(u, v)
    hetflow.forall(views[0].shape, jacobi, *views, device=gpu_device)
    np.testing.assert_allclose(v, _jacobi_numpy(u), rtol=1e-15)


@pytest.mark.gpu
def test_repeated_launches_on_cupy_arrays_match_numpy(gpu_device):
    cp = pytest.importorskip("cupy")
    u0 = np.random.default_rng(3).random((300, 400))
    u, v = cp.asarray(u0), cp.asarray(u0)
    for _ in range(5):  # each launch reads what the one before wrote, in GPU memory
        hetflow.forall(interior(v, 1).shape, jacobi, *_jacobi_views(u, v), device=gpu_device)
        hetflow.forall(interior(u, 1).shape, jacobi, *_jacobi_views(v, u), device=gpu_device)
    expected = u0
    for _ in range(10):
        expected = _jacobi_numpy(expected)
    np.testing.assert_allclose(cp.asnumpy(u), expected, rtol=1e-13)
