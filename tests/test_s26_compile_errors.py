"""A kernel that does not compile fails as hetflow's KernelCompileError naming the kernel
and its line, whatever the compiler raised: on a real GPU the TypeError, KeyError or
AssertionError of numba-cuda's internals too (never a raw traceback), and on the CPU a
global or captured value Numba has no constant of is named as such (Numba calls it
undefined, or names its own lookup table)."""
import dataclasses
import types

import numba
import numpy as np
import pytest
from numba.core import types as nbtypes

import hetflow
from hetflow.errors import ArgumentError, KernelCompileError, KernelRaisedError
from test_kernel_sweep import marker_line


def _line(marker: str) -> int:
    return marker_line(marker, __file__)


@hetflow.kernel
def copy_in(i, x, out):
    out[i] = x[i]


class _Raising:
    """An object whose Numba type is asked for raises ``exc`` inside Numba's typeof."""

    def __init__(self, exc):
        self.exc = exc

    @property
    def _numba_type_(self):
        raise self.exc


def _on_a_real_gpu(gpu_device):
    """A launch of ``copy_in`` bound on the simulated GPU, with a stand-in for a real one."""
    from hetflow.runtime.launch import bind

    launch = bind(copy_in, 4, (np.zeros(4), np.zeros(4)), gpu_device)
    real = types.SimpleNamespace(id=gpu_device.id, kind="gpu", arch="sm_90", simulated=False)
    return dataclasses.replace(launch, device=real)


@pytest.mark.simgpu
@pytest.mark.parametrize(("internal", "kind"), [
    (lambda: nbtypes.UniTuple(nbtypes.int64, "x"), "TypeError"),
    (lambda: numba.typeof(_Raising(KeyError("sqrt"))), "KeyError"),
    (lambda: numba.typeof(_Raising(AssertionError("bad IR"))), "AssertionError"),
])
def test_what_numba_cudas_internals_raise_compiling_is_a_compile_error(gpu_device, internal, kind):
    from hetflow.runtime.gpu import compile_errors

    with pytest.raises(KernelCompileError, match=rf"^kernel 'copy_in' \(.*test_s26_compile_errors\.py:\d+\) "
                                                 rf"failed to compile for {gpu_device.id} \(gpu, sm_90\): "
                                                 rf".*{kind}") as info:
        with compile_errors(_on_a_real_gpu(gpu_device)):
            internal()
    assert type(info.value.__cause__).__name__ == kind  # the internal error's trace, for a bug report


def _driver_error():
    """An exception shaped as numba-cuda's CudaAPIError (a CudaDriverError), which the
    simulator does not define."""
    base = type("CudaDriverError", (Exception,), {"__module__": "numba.cuda.cudadrv.error"})
    return type("CudaAPIError", (base,), {"__module__": "numba.cuda.cudadrv.driver"})(700, "illegal address")


@pytest.mark.simgpu
@pytest.mark.parametrize("exc", [_driver_error(), MemoryError("out of memory"), ArgumentError("hetflow's own")])
def test_a_devices_fault_and_hetflows_own_error_pass_as_they_are(gpu_device, exc):
    from hetflow.runtime.gpu import compile_errors

    with pytest.raises(type(exc)) as info:
        with compile_errors(_on_a_real_gpu(gpu_device)):
            numba.typeof(_Raising(exc))  # raised inside Numba's code, as a launch's driver call is
    assert info.value is exc


@pytest.mark.simgpu
def test_what_is_raised_outside_numba_is_not_called_a_compile_error(gpu_device):
    """The fast entry refuses argument types with a TypeError of its own, and falls back
    to numba-cuda's dispatcher: that one stays a TypeError."""
    from hetflow.runtime.gpu import compile_errors

    with pytest.raises(TypeError, match="no fast launch"):
        with compile_errors(_on_a_real_gpu(gpu_device)):
            raise TypeError("no fast launch for argument types (float64,)")


@hetflow.kernel
def _adds_text(i, x):
    x[i] = "a" + x[i]


@pytest.mark.simgpu
def test_on_the_simulator_a_kernels_python_error_is_its_own(gpu_device):
    with pytest.raises(KernelRaisedError, match=rf"kernel '_adds_text' raised TypeError on {gpu_device.id}"):
        hetflow.forall(4, _adds_text, np.zeros(4), device=gpu_device.id)


# -- CPU: globals and captured values Numba has no constant of ---------------------------------
class _Opaque:
    pass


OPAQUE = _Opaque()
TABLE = {1: 2.0}


@hetflow.kernel
def _reads_an_object(i, x):
    x[i] = OPAQUE(1)  # s26-object


@hetflow.kernel
def _reads_a_dict(i, x):
    x[i] = TABLE[1]  # s26-dict


@hetflow.kernel
def _calls_one_reading_a_dict(i, x):  # s26-call (its def: where the caller's own lines name no place)
    _reads_a_dict(i, x)


@pytest.mark.parametrize(("kernel", "name", "what", "marker"), [
    (_reads_an_object, "OPAQUE", "_Opaque", "s26-object"),
    (_reads_a_dict, "TABLE", "dict", "s26-dict"),
    (_calls_one_reading_a_dict, "TABLE", "dict, read by kernel '_reads_a_dict'", "s26-call"),
])
def test_a_global_numba_cannot_type_is_named_not_called_undefined(kernel, name, what, marker):
    with pytest.raises(KernelCompileError) as info:
        hetflow.forall(4, kernel, np.zeros(4), device="cpu0")
    message = str(info.value)
    assert f"test_s26_compile_errors.py:{_line(marker)}) failed to compile for cpu0" in message, message
    assert f"'{name}' (a Python {what}) has no Numba type: compiled code holds a global or captured value as a " \
           "constant" in message, message
    assert "pass it as an argument" in message and "not defined" not in message, message


@hetflow.kernel
def _reads_an_undefined_name(i, x):
    x[i] = NOT_DEFINED_ANYWHERE + 1.0  # noqa: F821  # s26-undefined


def test_an_undefined_name_is_still_called_undefined():
    with pytest.raises(KernelCompileError, match=rf"py:{_line('s26-undefined')}\) failed to compile for cpu0 .*"
                                                 r"NameError: name 'NOT_DEFINED_ANYWHERE' is not defined"):
        hetflow.forall(4, _reads_an_undefined_name, np.zeros(4), device="cpu0")


def _capturing_a_list():
    weights = [1.0, 2.0]

    @hetflow.kernel
    def weighted(i, x):
        x[i] = weights[0]  # s26-captured-list
    return weighted


def test_a_captured_list_is_named_with_what_to_do():
    with pytest.raises(KernelCompileError) as info:
        hetflow.forall(4, _capturing_a_list(), np.zeros(4), device="cpu0")
    message = str(info.value)
    assert f"py:{_line('s26-captured-list')}) failed to compile for cpu0" in message, message
    assert "'weights' (of Numba type List(float64, True)) cannot be a constant" in message, message
    assert "OverloadSelector" not in message, message


# -- real GPU: numba-cuda's own compiler (run by the lead) --------------------------------------
@hetflow.kernel
def _allocates(i, x):
    t = np.zeros(3)
    x[i] = t[0]


@hetflow.kernel
def _appends(i, x):
    values = [1.0]
    values.append(2.0)
    x[i] = values[1]


@hetflow.kernel
def _prints_keywords(i, x):
    print(x[i], sep="")


@hetflow.kernel
def _prints_an_array(i, x):
    print(x)


@hetflow.kernel
def _sorts(i, x):
    x[i] = np.sort(x)[0]


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", [_allocates, _appends, _prints_keywords, _prints_an_array, _sorts, _adds_text,
                                    _reads_an_object, _reads_a_dict, _capturing_a_list()])
def test_what_a_real_gpu_cannot_compile_is_a_compile_error(gpu_device, kernel):
    with pytest.raises(KernelCompileError, match=rf"^kernel '{kernel.name}' \(.*test_s26_compile_errors\.py:\d+\) "
                                                 rf"failed to compile for {gpu_device.id}"):
        hetflow.forall(4, kernel, np.zeros(4), device=gpu_device.id)
