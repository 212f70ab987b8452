"""``hetflow.zeros``/``empty``/``asarray`` take ``device=`` as the rest of hetflow names
devices (ids as ``hetflow.devices()`` lists them, ``'gpu'``, a Device; also ``'cpu'``/
``'host'``, ``'managed'`` and other libraries' names of a GPU, which users write), refuse
names of no device saying what to use, and under Numba's CUDA simulator place arrays on
its GPU without CuPy (host memory, which the simulated GPU works on)."""
import re

import numpy as np
import pytest

import hetflow
from hetflow.errors import ArgumentTypeError, DeviceError
from hetflow.index import asarray, section


@hetflow.kernel
def _doubled_plus_index(i, x, out):
    out[i] = 2.0 * x[i] + i


@pytest.mark.simgpu
# (ids: a test whose id holds "gpu" alone counts as marked gpu, for a real GPU)
@pytest.mark.parametrize("device", ["gpu0", "gpu", "device"], ids=["id", "any-gpu", "device"])
def test_new_arrays_on_the_simulated_gpu_need_no_cupy(gpu_device, device):
    device = gpu_device if device == "device" else device
    x = hetflow.empty(5, device=device)
    x[:] = np.arange(5.0)
    out = hetflow.zeros(5, np.float32, device=device)
    assert out.shape == (5,) and out.dtype == np.float32 and not out.any()
    hetflow.forall(5, _doubled_plus_index, x, out, device=gpu_device.id)
    np.testing.assert_array_equal(out, [2.0 * k + k for k in range(5)])


@pytest.mark.simgpu
def test_a_view_copied_to_the_simulated_gpu_holds_its_elements():
    a = np.arange(12.0).reshape(3, 4)
    got = asarray(section(a, (1, 1), (2, 2)), device="gpu0")
    np.testing.assert_array_equal(np.asarray(got), a[1:3, 1:3])


@pytest.mark.simgpu
def test_a_gpu_the_simulator_lacks_is_a_device_error():
    with pytest.raises(DeviceError, match=r"no GPU 1 to place an array on: this machine has 1 \(ordinals 0\.\.0\)"):
        hetflow.zeros(3, device="gpu1")


@pytest.mark.simgpu
@pytest.mark.parametrize("device", ["cuda:0", "cuda", "gpu:0", "GPU0", 0], ids=["cuda-0", "cuda", "gpu-0", "GPU0", "0"])
def test_other_libraries_names_of_a_gpu_place_arrays_as_its_id_does(gpu_device, device):
    """'cuda:0' and an ordinal, as CuPy and PyTorch users write them, name gpu0 as before."""
    a = hetflow.zeros(3, device=device)
    b = asarray(np.arange(3.0), device=device)
    assert type(a) is np.ndarray and not a.any() and np.array_equal(b, np.arange(3.0))


@pytest.mark.parametrize("device", ["cpu1", "tpu0", "gpu-1", "cuda:x", -1], ids=["cpu1", "tpu0", "gpu-1", "cuda-x", "neg"])
def test_names_of_no_device_are_refused_saying_what_to_use(device):
    for call in (lambda: hetflow.zeros(3, device=device), lambda: hetflow.empty(3, device=device),
                 lambda: asarray(np.zeros(3), device=device)):
        with pytest.raises(ArgumentTypeError, match=rf"^unknown device {re.escape(repr(device))}: use None, a device "
                                                    rf"id \('cpu0', 'gpu0', \.\.\.\), "):
            call()


@pytest.mark.parametrize("device", ["cpu0", "cpu", "host", "device"])
def test_host_placements_give_numpy_arrays(device):
    device = hetflow.get_device("cpu0") if device == "device" else device
    a = hetflow.zeros((2, 3), np.int64, device=device)
    assert type(a) is np.ndarray and a.shape == (2, 3) and a.dtype == np.int64 and not a.any()
