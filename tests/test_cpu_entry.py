"""CPU launches call the compiled code of their plan without Numba's type dispatch
(runtime.cpu.compile_launch) only where the plan's key fixes every argument's Numba
type; arguments that differ in any part of that type get a plan of their own. Oracle:
NumPy's result of the same arithmetic."""
import numpy as np
import pytest

import hetflow


@hetflow.kernel
def axpy(i, a, x, y, out):
    out[i] = a * x[i] + y[i]


def _plans(kernel):
    return [p for p in kernel.plans.values() if p.executable.description.kind == "cpu"]


def _unaligned(values):
    """A float64 array one byte off an 8-byte boundary (Numba types it aligned=False)."""
    raw = np.zeros(values.size * 8 + 1, dtype=np.uint8)
    out = np.frombuffer(raw.data, dtype=np.float64, count=values.size, offset=1)
    out[:] = values
    return out


def _readonly(values):
    out = values.copy()
    out.flags.writeable = False
    return out


@pytest.mark.parametrize("n", [1, 5, 1000])
def test_arguments_of_every_compiled_type_in_turn_give_numpys_results(n):
    rng = np.random.default_rng(n)
    x, y = rng.random(n), rng.random(n)
    cases = [
        ("plain", 2.0, x, y),
        ("unaligned", 2.0, _unaligned(x), y),
        ("read-only", 2.0, _readonly(x), _readonly(y)),
        ("float32", 2.0, x.astype(np.float32), y.astype(np.float32)),
        ("strided", 2.0, np.repeat(x, 2)[::2], y),
        ("int scalar", 3, x, y),
        ("plain again", 0.5, x, y),
    ]
    for name, a, xs, ys in cases:
        out = np.zeros(n)
        hetflow.forall(n, axpy, a, xs, ys, out, device="cpu0")
        np.testing.assert_allclose(out, a * xs.astype(np.float64) + ys, rtol=1e-6, err_msg=name)


def test_a_plan_of_numpy_arrays_and_python_scalars_keeps_its_compiled_code():
    x, out = np.ones(4), np.zeros(4)
    hetflow.forall(4, axpy, 2.0, x, x, out, device="cpu0")
    hetflow.forall(4, axpy, np.float32(2.0), x, x, out, device="cpu0")  # a NumPy scalar: not keyed
    entries = {type(p.cpu_entry).__name__ for p in _plans(axpy)}
    assert "builtin_function_or_method" in entries and "NoneType" in entries
    assert np.array_equal(out, np.full(4, 3.0))


@hetflow.kernel
def add(i, x, y, out):
    out[i] = x[i] + y[i]


def test_an_unaligned_array_has_a_plan_of_its_own():
    n = 8
    x = np.arange(n, dtype=np.float64)
    out = np.zeros(n)
    hetflow.forall(n, add, x, x, out, device="cpu0")
    assert len(_plans(add)) == 1
    hetflow.forall(n, add, _unaligned(x), x, out, device="cpu0")
    assert len(_plans(add)) == 2
    assert np.array_equal(out, 2 * x)
