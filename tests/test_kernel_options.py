"""Kernel options fastmath=, inline=, writes=/reads= (issue 22 item 4); oracle: NumPy."""
import json
import textwrap

import numpy as np
import pytest

import hetflow
from hetflow.errors import ArgumentError, ShapeError
from hetflow.platform.repository import repository


def _poly(i, x, out):
    out[i] = np.sqrt(x[i]) * 2.0 + x[i] * x[i] / 3.0 - 1.0 / (1.0 + x[i])


def _expected(x):
    return np.sqrt(x) * 2.0 + x * x / 3.0 - 1.0 / (1.0 + x)


plain = hetflow.kernel(_poly)
fast = hetflow.kernel(_poly, fastmath=True)
contract = hetflow.kernel(_poly, fastmath={"contract", "arcp"})


def _exec(text, **globals_):
    """Functions from ``exec``: no source Python can read."""
    ns = {"hetflow": hetflow, "np": np, **globals_}
    exec(textwrap.dedent(text), ns)
    return ns


def _descriptions(kernel):
    return [json.loads((e / "description.json").read_text())["description"] for e in repository().entries(kernel)]


@pytest.mark.parametrize("k", [fast, contract], ids=["fastmath", "flags"])
def test_fastmath_matches_numpy_on_the_cpu_in_an_entry_of_its_own(k):
    x = np.random.default_rng(1).random(5000) + 0.1
    out, ref = np.zeros_like(x), np.zeros_like(x)
    hetflow.forall(x.size, k, x, out)
    hetflow.forall(x.size, plain, x, ref)
    np.testing.assert_allclose(out, _expected(x), rtol=1e-12)
    assert k.source_hash == plain.source_hash  # the same function: only the option differs
    fastmath = [d["options"].get("fastmath") for d in _descriptions(k) if d["kind"] == "cpu"]
    assert False in [bool(f) for f in fastmath] and k.options["fastmath"] in fastmath


@pytest.mark.simgpu
def test_fastmath_on_the_simulated_gpu(gpu_device):
    x = np.linspace(0.1, 2.0, 32)
    out = np.zeros_like(x)
    hetflow.forall(x.size, fast, x, out, device=gpu_device.id)
    np.testing.assert_allclose(out, _expected(x), rtol=1e-12)
    assert any(d["kind"] == "gpu" and d["options"].get("fastmath") is True for d in _descriptions(fast))


@pytest.mark.gpu
def test_options_on_a_real_gpu(gpu_device):
    x = np.random.default_rng(2).random(100_000) + 0.1
    out = np.zeros_like(x)
    hetflow.forall(x.size, fast, x, out, device=gpu_device.id)
    np.testing.assert_allclose(out, _expected(x), rtol=1e-6)
    out[:] = 0
    hetflow.forall(x.size, _caller(square_always), x, out, device=gpu_device.id)
    np.testing.assert_allclose(out, x * x + 1.0)


def _square(i, v):
    return v * v


square_always = hetflow.kernel(_square, inline="always")
square_never = hetflow.kernel(_square, inline="never")


def _caller(square):
    """The same calling kernel, calling ``square`` (a global of its own namespace)."""
    ns = _exec("""
        def sq_plus_one(i, x, out):
            out[i] = square(i, x[i]) + 1.0
    """, square=square)
    return hetflow.kernel(ns["sq_plus_one"], writes=["out"], reads=["x"])


@pytest.mark.parametrize("square", [square_always, square_never], ids=["always", "never"])
def test_a_kernel_calling_an_inline_option_kernel(square):
    x = np.arange(300.0)
    out = np.zeros_like(x)
    hetflow.forall(x.size, _caller(square), x, out)
    np.testing.assert_array_equal(out, x * x + 1.0)


@pytest.mark.simgpu
def test_inline_kernels_on_the_simulated_gpu(gpu_device):
    x = np.arange(16.0)
    for square in (square_always, square_never):
        out = np.zeros_like(x)
        hetflow.forall(x.size, _caller(square), x, out, device=gpu_device.id)
        np.testing.assert_array_equal(out, x * x + 1.0)


def test_a_callee_option_changes_the_callers_key():
    # compiled code of the caller holds the callee's: another option, another executable
    assert _caller(square_always).source_hash != _caller(square_never).source_hash
    assert _caller(square_never).source_hash == _caller(hetflow.kernel(_square, inline="never")).source_hash


AXPY = """
    def axpy(i, a, x, y, out):
        out[i] = a * x[i] + y[i]
"""


@pytest.mark.simgpu
def test_writes_lets_a_kernel_without_source_co_execute(gpu_device):
    k = hetflow.kernel(_exec(AXPY)["axpy"], writes=["out"])
    assert not k.has_source
    n = 200
    rng = np.random.default_rng(5)
    x, y, out = rng.random(n), rng.random(n), np.zeros(n)
    report = hetflow.forall(n, k, 3.0, x, y, out, device=["cpu0", gpu_device.id],
                            schedule="static", shares=[0.5, 0.5])
    np.testing.assert_array_equal(out, 3.0 * x + y)
    assert {w.kind for w in report.workers if w.indices} == {"cpu", "gpu"}
    assert sum(w.indices for w in report.workers) == n


@pytest.mark.simgpu
def test_without_writes_a_kernel_without_source_runs_on_one_device(gpu_device):
    k = hetflow.kernel(_exec(AXPY)["axpy"])
    x, y, out = np.arange(40.0), np.ones(40), np.zeros(40)
    report = hetflow.forall(40, k, 2.0, x, y, out, device=["cpu0", gpu_device.id],
                            schedule="static", shares=[0.5, 0.5])
    np.testing.assert_array_equal(out, 2.0 * x + 1.0)
    assert len({w.kind for w in report.workers if w.indices}) == 1


def test_what_writes_and_reads_declare():
    k = hetflow.kernel(_exec(AXPY)["axpy"], writes="out")
    assert k.access(1).modes == {"a": "r", "x": "r", "y": "r", "out": "rw"}
    k = hetflow.kernel(_exec(AXPY)["axpy"], writes=["out"], reads=["x", "y"])
    assert k.access(1).modes == {"a": "", "x": "r", "y": "r", "out": "w"}
    assert k.access(1).rows == {"out"} and k.access(1).identity == {"out": 1}
    # with source, the declaration replaces the analysis' modes, not its indexing facts
    src = hetflow.kernel(_poly, reads=[])
    assert src.access(1).modes == {"x": "", "out": "w"} and src.access(1).rows == plain.access(1).rows


def test_a_declared_written_array_must_cover_the_extent():
    k = hetflow.kernel(_exec(AXPY)["axpy"], writes=["out"])
    with pytest.raises(ShapeError):
        hetflow.forall(10, k, 1.0, np.zeros(10), np.zeros(10), np.zeros(5))


def test_options_are_part_of_the_variant_and_description():
    x, out = np.arange(8.0), np.zeros(8)
    k = hetflow.kernel(_poly, writes=["out"], inline="never")
    hetflow.forall(8, k, x, out)
    np.testing.assert_allclose(out, _expected(x))
    hetflow.forall(8, plain, x, out)
    descs = [d for d in _descriptions(k) if d["kind"] == "cpu"]  # plain's and k's: one function
    (desc,) = [d for d in descs if d["options"].get("inline") == "never"]
    assert desc["options"]["writes"] == ["out"]
    (default,) = [d for d in descs if set(d["options"]) == {"nogil", "cache", "error_model"}]
    assert default["variant"] != desc["variant"]


@pytest.mark.parametrize("options, match", [
    (dict(fastmath="yes"), "fastmath= takes True, False or a set"),
    (dict(fastmath={"fast", "bogus"}), r"fastmath= flags \['bogus'\] are not Numba's"),
    (dict(inline="sometimes"), "inline= takes 'always', 'never' or None"),
    (dict(inline=True), "inline= takes"),
    (dict(writes=["out", "nope"]), r"kernel '_poly': writes= names 'nope', not a parameter"),
    (dict(reads=3), "reads= takes parameter names"),
])
def test_bad_options_raise(options, match):
    with pytest.raises(ArgumentError, match=match):
        hetflow.kernel(**options)(_poly)


def test_an_index_parameter_is_not_data():
    k = hetflow.kernel(_poly, writes=["i", "out"])
    with pytest.raises(ArgumentError, match=r"kernel '_poly': writes=/reads= name 'i', a launch index"):
        hetflow.forall(4, k, np.ones(4), np.zeros(4))


def test_options_reach_numba():
    cpu = hetflow.get_device("cpu0")
    exe = repository().executable(contract, cpu, 1)
    for fn in (exe.entry, exe.parallel, repository().device_function(contract, cpu)):
        assert fn.targetoptions["fastmath"] == {"contract", "arcp"}
    assert repository().device_function(square_never, cpu).targetoptions["inline"] == "never"
    assert not repository().executable(plain, cpu, 1).entry.targetoptions.get("fastmath")


def test_a_fastmath_kernel_called_from_another_keeps_its_flags():
    square_fast = hetflow.kernel(_square, fastmath=True)
    caller = _caller(square_fast)
    x = np.arange(50.0)
    out = np.zeros_like(x)
    hetflow.forall(x.size, caller, x, out)
    np.testing.assert_array_equal(out, x * x + 1.0)
    cpu = hetflow.get_device("cpu0")
    called = repository().device_function(caller, cpu).py_func.__globals__["square"]
    # not inlined into the caller's Numba IR (which the caller's flags compile): a call
    assert called.targetoptions["fastmath"] is True and called.targetoptions["inline"] == "never"
    default = repository().device_function(_caller(square_always), cpu).py_func.__globals__["square"]
    assert default.targetoptions["inline"] != "never"
