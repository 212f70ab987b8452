"""A kernel that does not compile fails as hetflow's KernelCompileError naming the kernel
and its line: on the CPU a global or captured value Numba has no constant of is named as
such (Numba calls it undefined, or names its own lookup table)."""

import numpy as np
import pytest

import hetflow
from hetflow.errors import KernelCompileError, KernelRaisedError
from test_kernel_sweep import marker_line


def _line(marker: str) -> int:
    return marker_line(marker, __file__)


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
