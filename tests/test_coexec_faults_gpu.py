"""Co-execution under faults on a real GPU (issue 18 items 1-2); oracle: NumPy.

The simulator's tests (test_coexec_faults.py) count its small chunks; here the arrays
are large enough for a real GPU to run several chunks of its share.
"""
import numpy as np
import pytest

import hetflow
from test_coexec_faults import bump, fail_gpu, keep_positive

pytestmark = pytest.mark.gpu

N = 1 << 25     # about 15 chunks of an H100's (132 SMs x 32 x 32 x 16 rows)


def both(gpu_device, kernel, *args):
    return hetflow.forall(N, kernel, *args, device=["cpu0", gpu_device.id], schedule="static",
                          shares=[0.1, 0.9])


@pytest.mark.parametrize("coherent", [False, True])
def test_conditional_writes_keep_old_values(gpu_device, coherent):
    rng = np.random.default_rng(1)
    x, old = rng.standard_normal(N), rng.standard_normal(N)
    out = hetflow.array(old) if coherent else old.copy()
    report = both(gpu_device, keep_positive, x, out)
    assert sum(w.indices for w in report.workers if w.kind == "gpu") > 0
    np.testing.assert_array_equal(np.asarray(out), np.where(x > 0, x, old))


@pytest.mark.parametrize("kind", ["numpy", "array", "resident"])
@pytest.mark.parametrize("where,at", [("run_chunk", 4), ("retire", 2), ("sync", 1)])
def test_read_modify_write_applies_once_when_the_gpu_fails(gpu_device, monkeypatch, kind, where, at):
    start = np.arange(N, dtype=np.float64)
    out = start.copy() if kind == "numpy" else hetflow.array(start)
    if kind == "resident":
        hetflow.forall(N, bump, out, device=gpu_device.id)   # current on the GPU alone
        start = start + 1
    calls = fail_gpu(monkeypatch, at, where)
    report = both(gpu_device, bump, out)
    assert calls["n"] >= at and report.failures
    np.testing.assert_array_equal(np.asarray(out), start + 1)


@pytest.mark.parametrize("kind", ["numpy", "array"])
def test_a_gpu_run_alone_that_fails_has_its_rows_run_on_the_cpu_once(gpu_device, monkeypatch, kind):
    # The model's choice of the GPU alone, and that GPU failing at its launch: on host
    # arrays in pieces (staging.run), on a coherent array current on the host and the GPU
    # in one launch over device data (gpu.run).
    from hetflow.runtime import coexec, gpu
    monkeypatch.setattr(coexec, "_alone", lambda *args: gpu_device)
    start = np.arange(N, dtype=np.float64)
    out = start.copy() if kind == "numpy" else hetflow.array(start)
    if kind == "array":
        hetflow.forall(N, bump, out, device=gpu_device.id)
        np.asarray(out)                                       # current on both
        start = start + 1

        def lost(launch):
            raise RuntimeError("GPU lost (injected)")
        monkeypatch.setattr(gpu, "run", lost)
    else:
        fail_gpu(monkeypatch, 6)                              # after two of 8 pieces landed
    report = hetflow.forall(N, bump, out, device=["cpu0", gpu_device.id])
    np.testing.assert_array_equal(np.asarray(out), start + 1)
    assert report.failures and report.failures[0].device_id == gpu_device.id
