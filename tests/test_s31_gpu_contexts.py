"""A process opens a CUDA context only on the GPUs it computes on (real GPUs only).

Describing the host's GPUs (``hetflow.devices()``) and sampling them for the scheduler
(NVML) read the driver's device attributes; neither may open a context, which costs
every process memory and start-up time on every GPU of the host (an MPI rank uses one;
the two-GPU ``mpiexec`` test, ``tests/mpi/s30_two_gpus.py``, checks that each rank holds
a context on its own GPU alone). Oracle: NVML's list of the processes on each GPU.
"""
import subprocess
import sys

import pytest

import hetflow

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not any(d.kind == "gpu" and not d.simulated for d in hetflow.devices()),
                       reason="needs a real GPU"),
]

CENSUS = r"""
import os, sys
import pynvml
import hetflow
from hetflow.runtime.status import Sampler, _handle

gpus = [d for d in hetflow.devices() if d.kind == "gpu"]
sampler = Sampler(ttl=0.0)
samples = [sampler.sample(d) for d in gpus]
pynvml.nvmlInit()
mine = [k for k in range(pynvml.nvmlDeviceGetCount())
        if os.getpid() in {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(
            pynvml.nvmlDeviceGetHandleByIndex(k))}]
print("contexts", mine)
print("sampled", all(s.utilization is not None for s in samples))
bus = [pynvml.nvmlDeviceGetPciInfo(_handle(pynvml, d)).busId for d in gpus]
import cupy  # now open them, to check the descriptions against CUDA's own figures
def tail(bus_id):  # NVML: 00000000:18:00.0, CUDA: 0000:18:00.0
    return (bus_id.decode() if isinstance(bus_id, bytes) else bus_id).lower().split(":", 1)[1]
for d, nvml_bus in zip(gpus, bus):
    print("same GPU", d.id, tail(nvml_bus) == tail(cupy.cuda.runtime.deviceGetPCIBusId(d.ordinal)))
    with cupy.cuda.Device(d.ordinal):
        props = cupy.cuda.runtime.getDeviceProperties(d.ordinal)
        total = cupy.cuda.Device(d.ordinal).mem_info[1]
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    print("check", d.id, d.global_memory == total, d.compute_units == props["multiProcessorCount"],
          d.name == name, d.arch == f"sm_{props['major']}{props['minor']}")
"""


def test_describing_and_sampling_the_gpus_opens_no_context():
    pytest.importorskip("pynvml")
    out = subprocess.run([sys.executable, "-c", CENSUS], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert "contexts []" in lines, out.stdout
    assert "sampled True" in lines, out.stdout
    same = [line for line in lines if line.startswith("same GPU ")]  # NVML's GPU is CUDA's, by PCI bus
    assert same and all(line.endswith(" True") for line in same), out.stdout
    checks = [line for line in lines if line.startswith("check ")]
    assert len(checks) == sum(d.kind == "gpu" for d in hetflow.devices())
    assert all(line.endswith("True True True True") for line in checks), out.stdout
