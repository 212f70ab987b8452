"""Run under mpiexec -n 2 by tests/test_s30_launch_work.py on a host with two GPUs: each
rank computes on a GPU of its own, its blocks coherent, as bench/distributed.py's 2-GPU
row does. The halo rows go straight between the GPUs' copies through page-locked
buffers; the grid must equal NumPy's, and two equal GPUs must keep about equal rows (a
rank's rate counted the host's time between launches once, and they were cut 4:1).
Each rank must hold a CUDA context on its own GPU alone (NVML's process lists): each
once opened one on every GPU of the host. Every rank prints "rank R: two gpus ok".
"""
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import heat_distributed as heat  # noqa: E402

import hetflow  # noqa: E402
from hetflow import cluster, collectives  # noqa: E402


def gpus_with_my_context() -> list:
    """Ids of the GPUs on which NVML lists this process."""
    import pynvml
    from numba import cuda

    pynvml.nvmlInit()
    driver = cuda.cudadrv.driver.driver
    found = []
    for d in hetflow.devices():
        if d.kind == "gpu":
            handle = pynvml.nvmlDeviceGetHandleByUUID(str(driver.get_device(d.ordinal).uuid))
            if os.getpid() in {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}:
                found.append(d.id)
    return found


if __name__ == "__main__":
    comm = collectives.world(timeout=60)
    with cluster.distributed(comm):
        n, iterations = 2048, 60
        own = [d for d in cluster.session(comm).devices if d != "cpu0"]
        assert len(own) == 1, own
        program, u, v = heat.setup(n, comm, devices=own, report_every=4)
        assert u.coherent
        result = heat.advance(program, u, v, iterations)
        sizes = program.partitions[-1][1]
        assert min(sizes) >= 0.6 * max(sizes), program.partitions
        moved = result.local.moved
        assert gpus_with_my_context() == own, (gpus_with_my_context(), own)
        grid = result.gather(0)
        if comm.rank == 0:
            error = float(np.max(np.abs(grid - heat.numpy_solve(n, iterations))))
            assert error <= 1e-10, error  # a GPU may contract a * b + c into one FMA
            print("partitions", program.partitions, "moved", moved, flush=True)
    print(f"rank {comm.rank}: two gpus ok", flush=True)
