"""A view's compiled type is its structure's, whichever kernel parameter passes it: a
kernel that its caller does not inline (``inline="never"``; every kernel on a GPU) is
compiled once for views of one structure passed as different parameters."""
import numpy as np
import pytest
from numba.core import event

import hetflow
from hetflow import project, transpose
from hetflow.errors import KernelCompileError


@hetflow.kernel(inline="never")
def element(v, i, j):
    return v[i, j]


@hetflow.kernel
def two_views(i, j, out, a, b):
    out[i, j] = element(a, i, j) * 10 + element(b, i, j)


class _Compiles(event.Listener):
    """The functions Numba compiles, by name."""

    def __init__(self):
        self.names = []

    def on_start(self, ev):
        self.names.append(getattr(ev.data["dispatcher"], "py_func", None).__name__)

    def on_end(self, ev):
        pass


def test_a_callee_is_compiled_once_for_one_view_structure_passed_as_two_parameters(monkeypatch, tmp_path):
    monkeypatch.setenv("HETFLOW_CACHE_DIR", str(tmp_path))  # an empty code repository: nothing loaded
    u = np.arange(20.0).reshape(4, 5)
    w = np.arange(100.0, 120.0).reshape(4, 5)
    out = np.zeros((5, 4))
    compiles = _Compiles()
    with event.install_listener("numba:compile", compiles):
        hetflow.forall((5, 4), two_views, out, transpose(u, 0, 1), transpose(w, 0, 1), device="cpu0")
    np.testing.assert_array_equal(out, u.T * 10 + w.T)
    assert compiles.names.count("__hf_entry") == 1 and compiles.names.count("element") == 1, compiles.names


@hetflow.kernel
def total(i, h, out):
    out[i] = len(h)


def test_a_refused_views_error_names_the_kernels_line_and_the_views_type():
    with pytest.raises(KernelCompileError) as info:
        hetflow.forall(1, total, project(np.arange(8.0), 0, 3), np.zeros(1), device="cpu0")
    message = str(info.value)
    assert f"test_s26_view_extent_types.py:{total.pyfunc.__code__.co_firstlineno + 2}" in message, message
    assert "len() of a rank-0 view" in message and "hetflow.view" in message


@pytest.fixture(params=[pytest.param("simulated", marks=pytest.mark.simgpu),
                        pytest.param("real", marks=pytest.mark.gpu)])
def gpu_kind(request):
    return request.param


def test_a_callee_takes_one_view_structure_passed_as_two_parameters_on_a_gpu(gpu_kind, gpu_device):
    u = np.arange(20.0).reshape(4, 5)
    w = np.arange(100.0, 120.0).reshape(4, 5)
    out = np.zeros((5, 4))
    hetflow.forall((5, 4), two_views, out, transpose(u, 0, 1), transpose(w, 0, 1), device=gpu_device.id)
    np.testing.assert_array_equal(out, u.T * 10 + w.T)
