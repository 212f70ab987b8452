"""Test set-up: a private code repository, and the simulated/real GPU marks."""
import os
import tempfile

import pytest

# A fresh code repository for the whole run, so tests never see a user's cache.
os.environ.setdefault("HETFLOW_CACHE_DIR", tempfile.mkdtemp(prefix="hetflow-test-cache-"))
# ... holding every kernel the run compiles: evicting (and logging it) mid-run would be
# noise in the tests that check what hetflow says (tests of the bound make their own).
os.environ.setdefault("HETFLOW_CACHE_MAX_ENTRIES", "100000")

from hetflow.cuda_compat import cuda_available, simulated  # noqa: E402


def pytest_collection_modifyitems(config, items):
    sim = simulated()
    real_gpu = not sim and cuda_available()
    skip_sim = pytest.mark.skip(reason="needs NUMBA_ENABLE_CUDASIM=1 (simulated GPU)")
    skip_gpu = pytest.mark.skip(reason="needs a real NVIDIA GPU (and no simulator)")
    for item in items:
        if "simgpu" in item.keywords and not sim:
            item.add_marker(skip_sim)
        if "gpu" in item.keywords and not real_gpu:
            item.add_marker(skip_gpu)


@pytest.fixture
def gpu_device():
    """The first GPU device (simulated under the simulator, real otherwise)."""
    import hetflow

    gpus = [d for d in hetflow.devices() if d.kind == "gpu"]
    if not gpus:
        pytest.skip("no GPU device")
    return gpus[0]


@pytest.fixture
def tiny_chunks(monkeypatch):
    """Chunks of a few rows on both devices (stealing happens at these sizes), and every
    launch co-executed (never one device alone by the performance model's choice)."""
    import dataclasses

    from hetflow.runtime import coexec, cpu

    monkeypatch.setattr(cpu, "INLINE_LIMIT", 2)
    gpu_worker = coexec._gpu_worker

    def small(launch, held=()):
        worker, chunks = gpu_worker(launch, held)
        return dataclasses.replace(worker, chunk_size=2), chunks

    monkeypatch.setattr(coexec, "_gpu_worker", small)
    monkeypatch.setattr(coexec, "_alone", lambda *args: None)
