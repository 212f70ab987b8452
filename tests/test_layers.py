"""The layers (docs/architecture.md): graph capture lives in the call sites, not in the
runtime, and the CUDA shim below every package still has hetflow.atomic registered with a
real numba-cuda."""
import os
import subprocess
import sys

import numpy as np

import hetflow
from hetflow.runtime.forall import forall as runtime_forall


@hetflow.kernel
def double(i, x, out):
    out[i] = 2 * x[i]


def test_the_call_site_records_in_a_capture_and_the_runtime_runs_at_once():
    x, out = np.arange(5.0), np.zeros(5)
    with hetflow.graph() as g:
        hetflow.forall(5, double, x, out)
        assert not out.any()                      # recorded: nothing ran yet
        runtime_forall(5, double, x, out)         # the runtime knows nothing of graphs
        np.testing.assert_array_equal(out, 2 * x)
    out[:] = 0
    g.run()
    np.testing.assert_array_equal(out, 2 * x)


def _run(code: str) -> str:
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0", "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_atomics_register_when_numba_cuda_is_imported_for_a_real_gpu():
    """Without the simulator, the first cuda_module() registers hetflow.atomic's GPU versions
    (cuda_compat imports no hetflow module: kernels.atomic registers itself through it)."""
    out = _run("from hetflow.cuda_compat import cuda_module\n"
               "from hetflow.kernels import atomic\n"
               "before = bool(atomic._cuda_registered)\n"
               "cuda = cuda_module()\n"
               "print(before, cuda is None or atomic._cuda_registered == [cuda])")
    assert out == "False True"


def test_a_hook_registered_after_numba_cuda_was_imported_runs_at_once():
    out = _run("from hetflow.cuda_compat import cuda_module, on_cuda_import\n"
               "cuda = cuda_module()\n"
               "seen = []\n"
               "on_cuda_import(seen.append)\n"
               "print(cuda is None or seen == [cuda])")
    assert out == "True"
