"""The examples as a user runs them on a host without a GPU: their --help and refusals."""
import os
import subprocess
import sys
from pathlib import Path

import hetflow

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
ENV = dict(os.environ, PYTHONPATH=str(Path(hetflow.__file__).resolve().parents[1]))


def _script(name, *argv, cwd=None):
    return subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py"), *argv], capture_output=True,
                          text=True, timeout=120, env=ENV, cwd=cwd)


def test_mandelbrot_help_says_what_each_option_is():
    out = _script("mandelbrot", "--help")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    for option, meaning in (("--size SIZE", "pixels per side (default 1500)"),
                            ("--max-iter MAX_ITER", "iterations per pixel at most (default 256)"),
                            ("--devices DEVICES", "comma-separated device ids (default cpu0)")):
        assert f"{option} {meaning}" in text


def test_heat_distributed_gpu_on_a_host_without_one_says_so(tmp_path):
    """Before: 'no GPU of its own (run at most one rank per GPU)' for one rank alone,
    on a host with no GPU (a simulated one is never a rank's own)."""
    assert not any(d.kind == "gpu" and not d.simulated for d in hetflow.devices())
    out = _script("heat_distributed", "--gpu", "--size", "8", "--iterations", "2", cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == "" and "Traceback" not in out.stderr
    assert out.stderr.splitlines()[-1] == ("heat_distributed.py: error: --gpu needs a GPU, and this host has "
                                           "none (a simulated GPU is never a rank's own)")
