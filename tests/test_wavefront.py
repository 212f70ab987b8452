"""The wavefront call site: results equal to the sequential row-major loop, exactly."""
import numpy as np
import pytest

import hetflow
from hetflow import interior
from hetflow.errors import ArgumentTypeError, KernelRaisedError, ShapeError

RNG = np.random.default_rng(3)


@hetflow.kernel
def p2p(i, j, a):
    """PRK's p2p sweep over the interior (index (i, j) updates a[i + 1, j + 1])."""
    a[i + 1, j + 1] = a[i, j + 1] + a[i + 1, j] - a[i, j]


@hetflow.kernel
def gauss_seidel(i, j, u, f, h2):
    """One Gauss-Seidel update of the 5-point Poisson stencil, u a view of the interior
    (its neighbours reached through the view's halo)."""
    u[i, j] = 0.25 * (u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] + h2 * f[i, j])


@hetflow.kernel
def recurrence(i, j, a, c):
    """Every element from its upper and left neighbours, first row and column included."""
    up = a[i - 1, j] if i > 0 else 1.0
    left = a[i, j - 1] if j > 0 else 0.5
    a[i, j] = c * up + (1.0 - c) * left + 0.001 * (i - j)


@hetflow.kernel
def fails_at(i, j, a):
    if i == 3 and j == 2:
        raise ValueError("bad element")
    a[i, j] = 1.0


def seq_p2p(a):
    for i in range(1, a.shape[0]):
        for j in range(1, a.shape[1]):
            a[i, j] = a[i - 1, j] + a[i, j - 1] - a[i - 1, j - 1]


def seq_gauss_seidel(u, f, h2):
    for i in range(1, u.shape[0] - 1):
        for j in range(1, u.shape[1] - 1):
            u[i, j] = 0.25 * (u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] + h2 * f[i, j])


def seq_recurrence(a, c):
    for i in range(a.shape[0]):
        for j in range(a.shape[1]):
            up = a[i - 1, j] if i > 0 else 1.0
            left = a[i, j - 1] if j > 0 else 0.5
            a[i, j] = c * up + (1.0 - c) * left + 0.001 * (i - j)


def p2p_grid(m, n):
    a = np.zeros((m, n))
    a[0, :], a[:, 0] = np.arange(n), np.arange(m)
    return a


@pytest.mark.parametrize("tile", [None, (1, 1), (3, 5), (7, 2), (100, 100)])
def test_p2p_equals_the_sequential_loop(tile):
    a, want = p2p_grid(37, 29), p2p_grid(37, 29)
    hetflow.wavefront((36, 28), p2p, a, tile=tile)
    seq_p2p(want)
    np.testing.assert_array_equal(a, want)


@pytest.mark.parametrize("tile", [None, (4, 4), (5, 3)])
def test_gauss_seidel_through_views_equals_the_sequential_loop(tile):
    u, f = RNG.random((23, 31)), RNG.random((23, 31))
    want = u.copy()
    for _ in range(3):
        hetflow.wavefront((21, 29), gauss_seidel, interior(u, 1), interior(f, 1), 0.01, tile=tile)
        seq_gauss_seidel(want, f, 0.01)
    np.testing.assert_array_equal(u, want)


def test_boundary_branches_and_scalars():
    a, want = np.zeros((50, 41)), np.zeros((50, 41))
    hetflow.wavefront(a.shape, recurrence, a, 0.3, tile=(6, 9))
    seq_recurrence(want, 0.3)
    np.testing.assert_array_equal(a, want)


def test_large_enough_for_the_parallel_sweep():
    a, want = p2p_grid(600, 500), p2p_grid(600, 500)
    a[1:, 1:] = want[1:, 1:] = RNG.random((599, 499))  # overwritten by the sweep anyway
    hetflow.wavefront((599, 499), p2p, a)
    seq_p2p(want)
    np.testing.assert_array_equal(a, want)


def test_empty_extent_runs_nothing():
    a = np.ones((3, 3))
    hetflow.wavefront((0, 3), p2p, a)
    assert (a == 1).all()


def test_errors():
    a = np.zeros((4, 4))
    with pytest.raises(ShapeError, match="rank 2"):
        hetflow.wavefront(4, p2p, a)
    with pytest.raises(ShapeError, match="tile"):
        hetflow.wavefront((3, 3), p2p, a, tile=(0, 2))
    with pytest.raises(ArgumentTypeError, match="must be a hetflow kernel"):
        hetflow.wavefront((3, 3), seq_p2p, a)
    with pytest.raises(KernelRaisedError, match="kernel .fails_at. raised ValueError"):
        hetflow.wavefront((6, 6), fails_at, np.zeros((6, 6)), tile=(2, 2))


def test_recorded_in_a_graph():
    a, want = p2p_grid(9, 9), p2p_grid(9, 9)
    with hetflow.graph() as g:
        hetflow.wavefront((8, 8), p2p, a, tile=(3, 3))
    g.run()
    seq_p2p(want)
    np.testing.assert_array_equal(a, want)


@pytest.mark.simgpu
@pytest.mark.parametrize("tile", [None, (2, 3)])
def test_simulated_gpu_equals_the_sequential_loop(gpu_device, tile):
    a, want = p2p_grid(7, 6), p2p_grid(7, 6)
    hetflow.wavefront((6, 5), p2p, a, tile=tile, device=gpu_device)
    seq_p2p(want)
    np.testing.assert_array_equal(a, want)
    u, f = RNG.random((6, 7)), RNG.random((6, 7))
    want = u.copy()
    hetflow.wavefront((4, 5), gauss_seidel, interior(u, 1), interior(f, 1), 0.01, tile=tile, device=gpu_device)
    seq_gauss_seidel(want, f, 0.01)
    np.testing.assert_array_equal(u, want)


@pytest.mark.gpu
def test_gpu_equals_the_sequential_loop():
    from hetflow.cuda_compat import cupy_module

    cp = cupy_module()
    if cp is None:
        pytest.skip("needs CuPy")
    a, want = p2p_grid(301, 257), p2p_grid(301, 257)
    d = cp.asarray(a)
    hetflow.wavefront((300, 256), p2p, d, device="gpu0")
    seq_p2p(want)
    np.testing.assert_array_equal(d.get(), want)
    u, f = RNG.random((130, 70)), RNG.random((130, 70))
    want = u.copy()
    du = cp.asarray(u)
    hetflow.wavefront((128, 68), gauss_seidel, interior(du, 1), interior(cp.asarray(f), 1), 0.01, device="gpu0")
    seq_gauss_seidel(want, f, 0.01)
    # Not bitwise: the GPU contracts h2 * f + ... into a fused multiply-add.
    np.testing.assert_allclose(du.get(), want, rtol=1e-13, atol=0)
