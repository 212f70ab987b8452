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
