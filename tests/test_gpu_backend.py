"""Without a usable numba-cuda a machine has no GPU backend, and hetflow runs on its CPUs.

Numba ships its own deprecated CUDA target, which numba-cuda replaces; hetflow's kernels
need numba-cuda. A plain `pip install hetflow` (no `cuda` extra) has only Numba's, and
every program crashed there with an ImportError from hetflow's GPU set-up. Each case runs
in a fresh process without the simulator, as a user's program would.
"""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import hetflow

PROGRAM = """
import warnings
warnings.simplefilter("always")
import numpy as np
import hetflow
from hetflow import cuda_compat

@hetflow.kernel
def axpy(i, a, x, y, out):
    out[i] = a * x[i] + y[i]

x, out = np.arange(10.0), np.empty(10)
hetflow.forall(10, axpy, 2.0, x, x, out, device="gpu")  # the CPU, where there is no GPU
assert out.tolist() == (3.0 * x).tolist(), out
assert [d.kind for d in hetflow.devices()] == ["cpu"], hetflow.devices()
print("why:", cuda_compat.why_no_gpu)
"""


def _run(tmp_path, prologue: str, args=()):
    script = tmp_path / "program.py"
    script.write_text(textwrap.dedent(prologue) + PROGRAM)
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = str(Path(hetflow.__file__).parents[1])
    env["HETFLOW_CACHE_DIR"] = str(tmp_path / "cache")
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                          env=env, timeout=300)


def test_without_numba_cuda_programs_run_on_the_cpu_and_devices_says_why(tmp_path):
    out = _run(tmp_path, """
        import sys
        sys.modules["numba_cuda"] = None  # as if numba-cuda were not installed
        """)
    assert out.returncode == 0, out.stderr
    assert "why: numba-cuda is not installed (pip install 'hetflow[cuda]')" in out.stdout
    assert "Warning" not in out.stderr  # a CPU-only install is normal: nothing to warn of
    devices = subprocess.run(
        [sys.executable, "-c", "import sys; sys.modules['numba_cuda'] = None\n"
         "from hetflow.cli.main import main; sys.exit(main(['devices']))"],
        capture_output=True, text=True, timeout=300,
        env={k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"})
    assert devices.returncode == 0, devices.stderr
    assert devices.stdout.splitlines()[-1] == "no GPU: numba-cuda is not installed (pip install 'hetflow[cuda]')"


def test_a_numba_cuda_that_hetflow_cannot_set_up_leaves_the_cpus_with_one_warning(tmp_path):
    out = _run(tmp_path, """
        from hetflow import cuda_compat

        def unknown_api(cuda):  # what Numba's own CUDA target raised
            raise ImportError("cannot import name 'overload' from 'numba.cuda.extending'")

        cuda_compat.on_cuda_import(unknown_api)
        """)
    assert out.returncode == 0, out.stderr
    warned = [ln for ln in out.stderr.splitlines() if "RuntimeWarning" in ln]
    assert len(warned) == 1 and "could not be set up for hetflow" in warned[0], out.stderr
    assert "GPUs are not used" in warned[0] and "'overload'" in warned[0]
    assert "why: numba-cuda " in out.stdout and "could not be set up for hetflow" in out.stdout
