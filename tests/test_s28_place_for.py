"""Where a rank keeps its distributed blocks by default: one rule for the demo, the heat
example and ``cluster.asarray``'s default (coherent where the rank's devices hold a GPU)."""
import sys
from pathlib import Path

import pytest

from hetflow.cluster import darray

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import heat_distributed as heat  # noqa: E402


def test_blocks_stay_in_host_memory_without_a_gpu():
    assert darray.place_for(("cpu0",)) == darray.HOST == "host"
    assert darray.place_for(()) == "host"


@pytest.mark.simgpu
def test_blocks_are_coherent_where_the_devices_hold_a_gpu(gpu_device):
    assert darray.place_for(("cpu0", gpu_device.id)) == darray.COHERENT == "coherent"
    assert darray.place_for((gpu_device.id,)) == "coherent"


@pytest.mark.simgpu
def test_the_heat_example_follows_the_rule(gpu_device):
    _, u, _ = heat.setup(8, devices=["cpu0", gpu_device.id])
    assert u.coherent and u.device is None
    _, u, _ = heat.setup(8, devices=["cpu0"])
    assert not u.coherent and u.device is None
    _, u, _ = heat.setup(8, devices=[gpu_device.id], place=gpu_device.id)  # told: in GPU memory
    assert not u.coherent and u.device.id == gpu_device.id
