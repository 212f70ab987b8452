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


def _script(name, *args):
    return subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py"), *args], capture_output=True,
                          text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(Path(hetflow.__file__).resolve().parents[1])))


@pytest.mark.parametrize(("argv", "message"), [
    (["--size", "0"], "--size must be at least 3 (a grid with an interior point), got 0"),
    (["--size", "-3"], "--size must be at least 3 (a grid with an interior point), got -3"),
    (["--size", "2"], "--size must be at least 3 (a grid with an interior point), got 2"),
    (["--iterations", "0"], "--iterations must be at least 1, got 0"),
    (["--iterations", "-1"], "--iterations must be at least 1, got -1"),
    (["--devices", "gpu7"], "--devices gpu7: no device with id 'gpu7'; devices are: "),
    (["--devices", "nonsense"], "--devices nonsense: no device with id 'nonsense'; devices are: "),
    (["--devices", "cpu0,"], "--devices cpu0,: no device with id ''; devices are: "),
    (["--devices", "cpu0,cpu0"], "--devices cpu0,cpu0: names cpu0 more than once (each device runs its share once)"),
])
def test_jacobi_script_refuses_bad_options_in_one_line(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        _load("jacobi").main(["--size", "16", "--iterations", "2", *argv])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "Traceback" not in err
    assert err.splitlines()[-1].split(": error: ", 1)[1].startswith(message)  # after the usage lines


def test_jacobi_script_with_an_unknown_device_prints_no_traceback():
    out = _script("jacobi", "--size", "16", "--devices", "gpu7")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines()[-1].startswith("jacobi.py: error: --devices gpu7: no device with id 'gpu7'")
    assert "Traceback" not in out.stderr


def test_jacobi_script_on_the_devices_named_agrees_with_numpy(capsys):
    assert _load("jacobi").main(["--size", "20", "--iterations", "7", "--devices", " cpu0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("20x20, 7 iterations on cpu0: start-up ")
    assert float(out.split("max |difference| from NumPy")[1]) == 0.0


@pytest.mark.parametrize("option", ["--points", "--k", "--iterations"])
@pytest.mark.parametrize("value", ["0", "-5"])
def test_kmeans_script_refuses_fewer_than_one_in_one_line(capsys, option, value):
    with pytest.raises(SystemExit) as exc:
        _load("kmeans").main([option, value])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and f"error: {option} must be at least 1, got {value}\n" in err


def test_kmeans_script_with_negative_points_prints_no_traceback():
    out = _script("kmeans", "--points", "-5")
    assert out.returncode == 2 and out.stdout == "" and "Traceback" not in out.stderr
    assert out.stderr.splitlines()[-1] == "kmeans.py: error: --points must be at least 1, got -5"


def test_kmeans_script_matches_numpy(capsys):
    assert _load("kmeans").main(["--points", "900", "--k", "3", "--iterations", "4"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("1 rank(s); centroids:") and float(out.split("from NumPy")[1]) < 1e-10


@pytest.mark.parametrize("script, argv, message", [
    ("mandelbrot", ["--size", "0"], "--size must be at least 1, got 0"),
    ("mandelbrot", ["--max-iter", "-1"], "--max-iter must be at least 1, got -1"),
    ("mandelbrot", ["--devices", "gpu7"], "--devices gpu7: no device with id 'gpu7'; devices are: "),
    ("mandelbrot", ["--devices", "cpu0,cpu0"], "--devices cpu0,cpu0: names cpu0 more than once (each device runs its share once)"),
    ("mandelbrot", ["--trace", "m.png"], "--trace m.png: cannot write it: the timeline goes beside it, "
                                         "with the suffix .png: name the trace .json"),
    ("heat_distributed", ["--size", "2"], "--size must be at least 3 (a grid with an interior point), got 2"),
    ("heat_distributed", ["--size", "-3"], "--size must be at least 3 (a grid with an interior point), got -3"),
])
def test_examples_refuse_bad_options_in_one_line(tmp_path, script, argv, message):
    """Before: tracebacks (ZeroDivisionError, negative dimensions, DeviceError), a run of
    nothing, or a trace that its timeline overwrote."""
    out = subprocess.run([sys.executable, str(EXAMPLES / f"{script}.py"), *argv], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(Path(hetflow.__file__).resolve().parents[1])))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.splitlines()[-1].startswith(f"{script}.py: error: {message}")
    assert not list(tmp_path.iterdir())  # nothing ran, nothing written
