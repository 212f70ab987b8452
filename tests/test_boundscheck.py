"""Checked mode (boundscheck): an index outside an array raises hetflow's
IndexOutOfBoundsError naming the kernel, the parameter and the index, on the CPU and the
(simulated) GPU; in-bounds kernels still match NumPy."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import hetflow
from hetflow import interior
from hetflow.errors import HetflowError, IndexOutOfBoundsError


@hetflow.kernel(boundscheck=True)
def shift_read(i, x, out):
    out[i] = x[i + 1]


@hetflow.kernel(boundscheck=True)
def far_read(i, x, out):
    out[i] = x[i + 10**9]


@hetflow.kernel(boundscheck=True)
def shift_write(i, x, out):
    out[i + 1] = x[i]


@hetflow.kernel(boundscheck=True)
def rows(i, j, x, out):
    out[i, j] = x[i, j] + x[i + 1, j]


@hetflow.kernel(boundscheck=True)
def view_read(i, v, out):
    out[i] = v[i + 2]


@hetflow.kernel(boundscheck=True)
def record_write(i, p, dt):
    p[i + 1].x = p[i].v * dt


@hetflow.kernel(boundscheck=True)
def local_array(i, out):
    scratch = np.zeros(3)
    out[i] = scratch[i]


@hetflow.kernel(boundscheck=True)
def stencil(i, x, out):
    out[i] = x[i - 1] + x[i] + x[(i + 1) % x.shape[0]]  # x[-1]: from the end, as in NumPy


def _error(n, kernel, *args, device="cpu0"):
    with pytest.raises(IndexOutOfBoundsError) as err:
        hetflow.forall(n, kernel, *args, device=device)
    return err.value


def test_read_past_the_end_names_kernel_array_and_index():
    x, out = np.arange(10.0), np.zeros(10)
    err = _error(10, shift_read, x, out)
    assert (err.kernel, err.array, err.axis, err.index) == ("shift_read", "x", 0, 10)
    assert "kernel 'shift_read'" in str(err) and "'x'" in str(err) and "index 10" in str(err)
    assert isinstance(err, HetflowError) and isinstance(err, IndexError)
    hetflow.forall(9, shift_read, x, out)  # in bounds: the NumPy result
    np.testing.assert_array_equal(out[:9], x[1:])


def test_a_wild_index_raises_instead_of_crashing():
    err = _error(4, far_read, np.arange(10.0), np.zeros(10))
    assert (err.array, err.index) == ("x", 10**9)


def test_write_past_the_end_is_named():
    err = _error(10, shift_write, np.arange(10.0), np.zeros(10))
    assert (err.array, err.index) == ("out", 10)


def test_large_launch_over_all_cores_raises():
    n = 200_000
    err = _error(n, shift_read, np.zeros(n), np.zeros(n))
    assert (err.array, err.index) == ("x", n)


def test_second_axis_and_in_bounds_results():
    x = np.arange(20.0).reshape(4, 5)
    out = np.zeros((4, 5))
    err = _error((4, 5), rows, x, out)
    assert (err.array, err.axis, err.index) == ("x", 0, 4)
    hetflow.forall((3, 5), rows, x, out)
    np.testing.assert_array_equal(out[:3], x[:3] + x[1:])


def test_view_is_checked_on_its_root_array():
    x = np.arange(10.0)
    err = _error(8, view_read, interior(x, 1), np.zeros(8))
    assert err.array == "v" and err.index == 10 and "view 'v'" in str(err)


def test_record_field_store_is_checked():
    p = np.zeros(5, dtype=[("x", "f8"), ("v", "f8")])
    err = _error(5, record_write, p, 0.5)
    assert (err.array, err.index) == ("p", 5)


def test_numba_check_covers_arrays_that_are_not_parameters():
    err = _error(5, local_array, np.zeros(5))
    assert err.kernel == "local_array" and err.array is None


def test_negative_indices_count_from_the_end():
    x = np.arange(6.0)
    out = np.zeros(6)
    hetflow.forall(6, stencil, x, out)
    np.testing.assert_array_equal(out, np.roll(x, 1) + x + np.roll(x, -1))


def test_environment_variable_turns_checks_on_for_every_kernel(tmp_path):
    """Run twice: the second process runs the machine code Numba stored, which must
    raise the same named error (it once failed to build the exception's arguments)."""
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent("""
        import numpy as np
        import hetflow
        from hetflow.errors import IndexOutOfBoundsError

        @hetflow.kernel
        def shift(i, x, out):
            out[i] = x[i + 1]

        try:
            hetflow.forall(10, shift, np.arange(10.0), np.zeros(10))
        except IndexOutOfBoundsError as exc:
            print("raised:", exc.array, exc.index)
    """))
    env = dict(os.environ, HETFLOW_BOUNDSCHECK="1", HETFLOW_CACHE_DIR=str(tmp_path / "cache"))
    for process in ("compiles", "loads from the cache"):
        run = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, f"{process}: {run.stderr}"
        assert run.stdout.strip() == "raised: x 10", process
    assert list((tmp_path / "cache").rglob("*.nbc")), "no machine code was stored"


def test_unchecked_kernels_stay_unchecked(monkeypatch):
    monkeypatch.delenv("HETFLOW_BOUNDSCHECK", raising=False)

    @hetflow.kernel
    def plain(i, x, out):
        out[i] = x[i]

    assert not plain.boundscheck and shift_read.boundscheck
    assert hetflow.kernel(boundscheck=False)(plain.pyfunc).boundscheck is False


# -- the simulated GPU (its own checks would raise a raw IndexError) -------------------------
@pytest.mark.simgpu
def test_simulated_gpu_read_and_write_past_the_end(gpu_device):
    x, out = np.arange(10.0), np.zeros(10)
    err = _error(10, shift_read, x, out, device=gpu_device)
    assert (err.kernel, err.array, err.index) == ("shift_read", "x", 10)
    err = _error(10, shift_write, x, out, device=gpu_device)
    assert (err.array, err.index) == ("out", 10)
    hetflow.forall(9, shift_read, x, out, device=gpu_device)
    np.testing.assert_array_equal(out[:9], x[1:])


@pytest.mark.simgpu
def test_simulated_gpu_views_records_and_two_dimensions(gpu_device):
    err = _error(8, view_read, interior(np.arange(10.0), 1), np.zeros(8), device=gpu_device)
    assert (err.array, err.index) == ("v", 10)
    err = _error(5, record_write, np.zeros(5, dtype=[("x", "f8"), ("v", "f8")]), 0.5, device=gpu_device)
    assert (err.array, err.index) == ("p", 5)
    x = np.arange(12.0).reshape(3, 4)
    out = np.zeros((3, 4))
    err = _error((3, 4), rows, x, out, device=gpu_device)
    assert (err.array, err.axis, err.index) == ("x", 0, 3)
    hetflow.forall((2, 4), rows, x, out, device=gpu_device)
    np.testing.assert_array_equal(out[:2], x[:2] + x[1:])


@pytest.mark.simgpu
def test_simulated_gpu_checks_stores_anywhere_on_a_line(gpu_device):
    @hetflow.kernel(boundscheck=True)
    def one_liner(i, out):
        if i > 0: out[i + 1] = 1.0  # noqa: E701

    err = _error(4, one_liner, np.zeros(4), device=gpu_device)
    assert (err.array, err.index) == ("out", 4)


@pytest.mark.gpu
def test_real_gpu_checks_reads_writes_and_views(gpu_device):
    n = 100_003
    x, out = np.arange(float(n)), np.zeros(n)
    for kernel, name in ((shift_read, "x"), (far_read, "x"), (shift_write, "out")):
        err = _error(n, kernel, x, out, device=gpu_device)
        assert (err.kernel, err.array) == (kernel.name, name)
    hetflow.forall(n - 1, shift_read, x, out, device=gpu_device)
    np.testing.assert_array_equal(out[:-1], x[1:])
    err = _error(n - 2, view_read, interior(x, 1), np.zeros(n - 2), device=gpu_device)
    assert (err.array, err.index) == ("v", n)
    err = _error(1000, record_write, np.zeros(1000, dtype=[("x", "f8"), ("v", "f8")]), 0.5, device=gpu_device)
    assert (err.array, err.index) == ("p", 1000)
