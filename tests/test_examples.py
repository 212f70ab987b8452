"""Every example runs and agrees with its NumPy oracle."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import hetflow

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_jacobi_matches_numpy():
    jacobi = _load("jacobi")
    np.testing.assert_array_equal(jacobi.solve(40, 30), jacobi.numpy_solve(40, 30))


@pytest.mark.simgpu
def test_jacobi_on_the_cpu_and_a_simulated_gpu_matches_numpy(gpu_device):
    jacobi = _load("jacobi")
    np.testing.assert_array_equal(jacobi.solve(10, 4, ["cpu0", gpu_device.id]), jacobi.numpy_solve(10, 4))


@pytest.mark.gpu
def test_jacobi_on_every_real_device_matches_numpy():
    jacobi = _load("jacobi")
    devices = [d.id for d in hetflow.devices() if not d.simulated]
    np.testing.assert_allclose(jacobi.solve(1000, 60, devices), jacobi.numpy_solve(1000, 60), rtol=1e-15, atol=0)


def test_jacobi_script_reports_its_run_and_agrees_with_numpy():
    out = subprocess.run([sys.executable, str(EXAMPLES / "jacobi.py"), "--size", "24", "--iterations", "5"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    devices = ", ".join(d.id for d in hetflow.devices() if not d.simulated)
    assert out.stdout.startswith(f"24x24, 5 iterations on {devices}: start-up ")
    assert float(out.stdout.split("max |difference| from NumPy")[1]) == 0.0


def test_mandelbrot_steal_and_static_agree_with_a_sequential_run():
    mandel = _load("mandelbrot")
    steal, report = mandel.image(120, 50, "cpu0", "steal")
    static, _ = mandel.image(120, 50, "cpu0", "static")
    x = -2.0 + np.arange(120) * (2.5 / 120)
    y = np.arange(120) * (1.25 / 120)
    c = x[None, :] + 1j * y[:, None]
    z, expect = np.zeros_like(c), np.zeros(c.shape, dtype=np.int32)
    for _ in range(50):
        live = np.abs(z) <= 2.0
        z[live] = z[live] ** 2 + c[live]
        expect[live] += 1
    assert np.mean(steal == expect) > 0.999  # a few boundary points differ by rounding order
    np.testing.assert_array_equal(steal, static)
    assert sum(w.indices for w in report.workers) == 120


def test_kmeans_one_process_matches_numpy():
    km = _load("kmeans")
    mine, everything = km.local_points(0, 1, 3000, 4, 3)
    got = km.kmeans(mine, 4, 5, hetflow.world())
    np.testing.assert_allclose(got, km.numpy_kmeans(everything, 4, 5), rtol=1e-10, atol=1e-10)


@pytest.mark.mpi
def test_kmeans_across_three_ranks():
    mpiexec = Path(sys.executable).with_name("mpiexec")
    env = dict(os.environ, PYTHONPATH=str(Path(hetflow.__file__).resolve().parents[1]))
    out = subprocess.run([str(mpiexec), "-n", "3", sys.executable, str(EXAMPLES / "kmeans.py"),
                          "--points", "6000", "--iterations", "5"], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    err = float(out.stdout.split("max |difference| from NumPy")[1])
    assert "3 rank(s)" in out.stdout and err < 1e-9


def test_heat_distributed_timing_gives_start_up_apart_and_the_steady_steps_throughput():
    heat = _load("heat_distributed")
    cells_per_step = 1000 ** 2
    assert heat.timing(1002, 12, 2, 1.5, 0.5) == (
        "1002x1002, 12 iterations on 2 rank(s): start-up (compiling, first transfers, steps 1-2): "
        f"1.500 s; steps 3-12: 0.500 s, throughput {cells_per_step * 10 / 0.5 / 1e6:.1f} Mcell/s")
    assert heat.timing(1002, 3, 1, 1.5, 0.05).endswith("; step 3: 0.050 s, throughput 20.0 Mcell/s")
    assert heat.timing(1002, 1, 1, 1.5, 0.0) == ("1002x1002, 1 iterations on 1 rank(s): start-up (compiling, "
                                                 "first transfers, step 1): 1.500 s")


@pytest.mark.parametrize("iterations, steady", [(1, None), (2, None), (5, "steps 3-5"), (6, "steps 3-6")])
def test_heat_distributed_script_reports_start_up_apart_and_agrees_with_numpy(capsys, iterations, steady):
    """main() returns 0 only when the grid matches NumPy's steps: the steps after start-up
    continue from where it left the grid, odd counts included."""
    heat = _load("heat_distributed")
    assert heat.main(["--size", "20", "--iterations", str(iterations)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    startup = "steps 1-2" if iterations > 1 else "step 1"
    assert first.startswith(f"20x20, {iterations} iterations on 1 rank(s): start-up (compiling, first "
                            f"transfers, {startup}): ")
    assert (f"; {steady}: " in first and first.endswith(" Mcell/s")) if steady else first.endswith(" s")


def test_heat_distributed_script_refuses_fewer_than_one_iteration(capsys):
    with pytest.raises(SystemExit) as exc:
        _load("heat_distributed").main(["--iterations", "0"])
    assert exc.value.code == 2 and "--iterations must be at least 1, got 0" in capsys.readouterr().err
