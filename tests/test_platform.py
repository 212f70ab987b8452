"""Devices, capability matching and contexts (SPEC §2)."""
import json
import subprocess
import sys

import psutil
import pytest

import hetflow
from hetflow.errors import DeviceError, InvalidContextError
from hetflow.platform.context import lookup


def test_cpu_record_matches_the_machine():
    cpu = hetflow.get_device("cpu0")
    assert cpu.kind == "cpu" and not cpu.simulated
    assert cpu.compute_units == len(psutil.Process().cpu_affinity())
    assert cpu.global_memory == psutil.virtual_memory().total
    assert cpu.simd_width in (4, 8, 16) and cpu.fp64 and cpu.host_shared


def test_refresh_rebuilds_the_table():
    first = hetflow.devices()
    again = hetflow.devices(refresh=True)
    assert again is not first and [d.id for d in again] == [d.id for d in first]


def test_unknown_device_id_names_the_known_ones():
    with pytest.raises(DeviceError, match="no device with id 'tpu7'.*cpu0"):
        hetflow.get_device("tpu7")


def test_select_by_requirements():
    assert hetflow.select(require={"kind": "cpu", "fp64": True}).ids == ("cpu0",)
    assert hetflow.select(require={"compute_units": 1, "kind": "cpu"}).devices[0].kind == "cpu"


def test_select_lists_unmet_requirements_per_device():
    with pytest.raises(DeviceError) as err:
        hetflow.select(require={"kind": "cpu", "compute_units": 10**6})
    assert "cpu0" in str(err.value) and "compute_units=1000000" in str(err.value)


def test_select_without_strict_takes_the_best_score():
    picked = hetflow.select(require={"kind": "cpu", "compute_units": 10**6}, strict=False)
    assert picked.ids == ("cpu0",)


def test_select_at_most_one_device_per_requirement_list():
    with pytest.raises(DeviceError):  # only one CPU package exists
        hetflow.select({"kind": "cpu"}, {"kind": "cpu"})


@pytest.mark.simgpu
def test_simulated_gpu_is_listed_and_selectable(gpu_device):
    assert gpu_device.simulated and gpu_device.kind == "gpu" and gpu_device.simd_width == 32
    both = hetflow.select({"kind": "cpu"}, {"kind": "gpu"})
    assert both.ids == ("cpu0", gpu_device.id)


def test_context_reference_counting():
    ctx = hetflow.Context("cpu0")
    assert lookup(ctx.id) is ctx
    ctx.retain()
    ctx.release()
    assert ctx.devices[0].id == "cpu0"  # one reference left
    ctx.release()
    with pytest.raises(InvalidContextError, match=f"context {ctx.id} was released"):
        ctx.devices
    with pytest.raises(InvalidContextError):
        ctx.retain()
    with pytest.raises(InvalidContextError, match="unknown context id"):
        lookup(ctx.id)


def test_released_context_cannot_run_work():
    ctx = hetflow.Context("cpu0")
    ctx.release()
    import numpy as np

    with pytest.raises(InvalidContextError):
        hetflow.forall(4, hetflow.library.fill, 1.0, np.zeros(4), device=ctx)


def test_cli_devices_json():
    out = subprocess.run([sys.executable, "-m", "hetflow", "devices", "--json"],
                         capture_output=True, text=True, check=True).stdout
    records = json.loads(out)
    assert records[0]["id"] == "cpu0"
    assert set(records[0]) >= {"kind", "vendor", "name", "version", "compute_units", "simd_width",
                               "global_memory", "local_memory", "fp64", "atomics", "host_shared",
                               "simulated"}


@pytest.mark.parametrize("code", ["from hetflow.cuda_compat import cuda_module\nprint(cuda_module().__file__)",
                                  "import hetflow\nfrom numba import cuda\nprint(cuda.__file__)"],
                         ids=["hetflow's import", "the user's import after hetflow's"])
def test_numba_cuda_is_used_where_its_pth_file_was_not_processed(code):
    """A venv that adds another environment's site-packages by path skips that
    environment's .pth files, so numba-cuda's redirect of ``numba.cuda`` is not installed
    and Numba's old CUDA target fails on hetflow's kernels; ``import hetflow`` installs it,
    for hetflow and for a user's (or an example's) own ``from numba import cuda``."""
    import site
    from pathlib import Path

    import hetflow as hf

    paths = [str(Path(hf.__file__).parents[1]), *site.getsitepackages()]
    code = "import sys; sys.path[:0] = %r\n%s" % (paths, code)
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "NUMBA_ENABLE_CUDASIM": "1"})
    assert out.returncode == 0, out.stderr
    assert "numba_cuda" in out.stdout, out.stdout
