"""One-index launches of sequential code (a CRC): one device, reported as such, cheap path."""
import zlib

import numpy as np
import pytest

import hetflow
from hetflow.runtime import cpu


@hetflow.kernel
def crc32(i, data, out):
    c = 0xFFFFFFFF
    for k in range(data.shape[0]):
        c ^= data[k]
        for _ in range(8):
            c = (c >> 1) ^ (0xEDB88320 & -(c & 1))
    out[0] = c ^ 0xFFFFFFFF


MESSAGE = b"hetflow runs sequential code as a launch of one index"


def run(device=None, schedule=None):
    data = np.frombuffer(MESSAGE, np.uint8).astype(np.int64)
    out = np.zeros(1, np.int64)
    report = hetflow.forall(1, crc32, data, out, device=device, schedule=schedule)
    assert out[0] == zlib.crc32(MESSAGE)
    return report


def test_one_index_runs_inline_on_the_calling_thread(monkeypatch):
    monkeypatch.setattr(cpu, "chunk_runner", None)  # the co-execution workers' entry: never used
    report = run()
    assert report.schedule == "one-device" and [w.device_id for w in report.workers] == ["cpu0"]


def test_a_named_schedule_on_one_index_is_not_co_execution():
    report = run(schedule="steal")
    assert report.schedule == "one-device" and len(report.workers) == 1


@pytest.mark.simgpu
def test_several_devices_run_one_index_on_the_cpu_alone(gpu_device):
    report = run(device=["cpu0", gpu_device.id])
    assert report.schedule == "one-device"
    assert [(w.device_id, w.indices) for w in report.workers] == [("cpu0", 1)]
