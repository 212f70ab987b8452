"""Globals read by kernels and co_map index functions: what compiled code freezes, what
keys it, recursive kernels and what ``hetflow.kernel`` takes. Oracle: NumPy, Python."""
import json
import os
import subprocess
import sys
import textwrap

import numba
import numpy as np
import pytest

import hetflow
from hetflow.errors import ArgumentTypeError, KernelCompileError
from hetflow.index.lowering import function_key

SCALE_KERNEL = """
    @hetflow.kernel
    def scale(i, x, out):
        out[i] = x[i] * SCALE
"""


def _exec(text, **globals_):
    """A module's namespace after running ``text`` (no source Python can read)."""
    ns = {"hetflow": hetflow, "np": np, **globals_}
    exec(textwrap.dedent(text), ns)
    return ns


# -- kernels: the values at the first launch --------------------------------------------
def test_a_global_changed_before_the_first_launch_is_the_one_compiled_and_keyed():
    x = np.arange(6.0)
    first = _exec(SCALE_KERNEL, SCALE=1.0)  # its entry: compiled with SCALE = 1.0
    out = np.zeros(6)
    hetflow.forall(6, first["scale"], x, out, device="cpu0")
    assert np.array_equal(out, x * 1.0)
    later = _exec(SCALE_KERNEL, SCALE=1.0)
    later["SCALE"] = 3.0  # after decorating, before launching
    out = np.zeros(6)
    hetflow.forall(6, later["scale"], x, out, device="cpu0")
    assert np.array_equal(out, x * 3.0)
    assert later["scale"].source_hash == _exec(SCALE_KERNEL, SCALE=3.0)["scale"].source_hash
    assert later["scale"].source_hash != first["scale"].source_hash


def test_after_the_first_launch_the_kernel_keeps_the_values_it_froze():
    """Numba's rule, on every executable of the kernel: one compiled after the global
    changed (for a view) computes with the value of the first launch, as its key says."""
    ns = _exec(SCALE_KERNEL, SCALE=2.0)
    x = np.arange(6.0)
    out = np.zeros(6)
    hetflow.forall(6, ns["scale"], x, out, device="cpu0")
    frozen = ns["scale"].source_hash
    ns["SCALE"] = 5.0
    out = np.zeros(6)
    hetflow.forall(6, ns["scale"], x, out, device="cpu0")
    assert np.array_equal(out, x * 2.0)
    out = np.zeros(3)  # a view: another variant, compiled now, with the frozen value
    hetflow.forall(3, ns["scale"], hetflow.section(x, (1,), (3,)), out, device="cpu0")
    assert np.array_equal(out, x[1:4] * 2.0)
    assert ns["scale"].source_hash == frozen == _exec(SCALE_KERNEL, SCALE=2.0)["scale"].source_hash


def test_a_kernel_called_is_keyed_by_its_code_even_when_defined_after_the_caller():
    x = np.arange(5.0)
    results = []
    for k in (1, 2):
        ns = _exec(f"""
            @hetflow.kernel
            def outer(i, x, out):
                out[i] = inner(x[i])

            @hetflow.kernel
            def inner(v):
                return v + {k}
        """)
        out = np.zeros(5)
        hetflow.forall(5, ns["outer"], x, out, device="cpu0")
        results.append(out)
    assert np.array_equal(results[0], x + 1) and np.array_equal(results[1], x + 2)


PROCESS = textwrap.dedent("""
    import json, sys
    import numpy as np
    import hetflow
    from hetflow.platform.repository import repository

    SCALE = 1.0

    @hetflow.kernel
    def scale(i, x, out):
        out[i] = x[i] * SCALE

    SCALE = float(sys.argv[1])
    x, out = np.arange(5.0), np.zeros(5)
    hetflow.forall(5, scale, x, out, device="cpu0")
    print(json.dumps({"out": out.tolist(), "compiled": repository().compiled}))
""")


def test_a_process_with_another_value_at_its_first_launch_does_not_load_anothers_entry(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(PROCESS)
    env = dict(os.environ, HETFLOW_CACHE_DIR=str(tmp_path / "cache"))
    found = []
    for scale in ("1", "3", "3"):
        run = subprocess.run([sys.executable, str(script), scale], env=env, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        found.append(json.loads(run.stdout.splitlines()[-1]))
    x = np.arange(5.0)
    assert [f["out"] for f in found] == [(x * 1).tolist(), (x * 3).tolist(), (x * 3).tolist()]
    assert [f["compiled"] for f in found] == [1, 1, 0]  # the third loads the second's entry


# -- co_map index functions ----------------------------------------------------------
COMAP = """
    def f(idx):
        return (idx[0] + OFF,)
"""


def test_a_co_map_function_is_keyed_by_the_globals_it_reads():
    ns = _exec(COMAP, OFF=3)
    key = function_key(ns["f"])
    assert function_key(_exec(COMAP, OFF=3)["f"]) == key
    ns["OFF"] = 6
    assert function_key(ns["f"]) != key


def test_a_co_map_function_reading_a_changed_global_agrees_with_numpy():
    ns = _exec(COMAP, OFF=0)
    cp = hetflow.kernel(_copy)
    x = np.arange(20.0)
    for off in (3, 6, 3):
        ns["OFF"] = off
        view = hetflow.co_map(x, ns["f"], (10,))
        out = np.zeros(10)
        hetflow.forall(10, cp, out, view, device="cpu0")
        assert np.array_equal(out, x[off:off + 10])
        assert np.array_equal(view.numpy(), x[off:off + 10])


def _copy(i, out, x):
    out[i] = x[i]


# -- recursion --------------------------------------------------------------------------
@hetflow.kernel
def fact(n):
    return 1 if n <= 1 else n * fact(n - 1)


@hetflow.kernel
def fill_down(i, out):
    out[i] = 1.0
    if i > 0:
        fill_down(i - 1, out)


@hetflow.kernel
def use_fact(i, out):
    out[i] = fact(i)


@hetflow.kernel
def ping(n):
    return 0 if n <= 0 else pong(n - 1)


@hetflow.kernel
def pong(n):
    return 0 if n <= 0 else ping(n - 1)


@hetflow.kernel
def use_ping(i, out):
    out[i] = ping(i)


@pytest.mark.parametrize("caller, message", [
    (fill_down, "kernel 'fill_down' calls itself (fill_down -> fill_down): recursive kernels are not "
                "supported"),
    (use_fact, "kernel 'fact' (called by kernel 'use_fact') calls itself (fact -> fact)"),
    (use_ping, "kernel 'ping' (called by kernel 'use_ping') calls itself (ping -> pong -> ping)"),
], ids=["itself", "called", "through-another"])
def test_a_recursive_kernel_is_refused_by_name(caller, message):
    with pytest.raises(KernelCompileError) as err:
        hetflow.forall(5, caller, np.zeros(5), device="cpu0")
    assert message in str(err.value)
    with pytest.raises(KernelCompileError, match="write the recursion as a loop"):
        caller.source_hash


@hetflow.kernel
def sqrt(i, x, out):  # its own name, as an attribute (np.sqrt), is no call of itself
    out[i] = np.sqrt(x[i])


def test_a_kernel_named_as_an_attribute_it_reads_is_not_recursive():
    x, out = np.arange(5.0), np.zeros(5)
    hetflow.forall(5, sqrt, x, out, device="cpu0")
    assert np.array_equal(out, np.sqrt(x))


# -- what hetflow.kernel takes ------------------------------------------------------------
@pytest.mark.parametrize("given, message", [
    (5, "hetflow.kernel takes a Python function (a def or a lambda), not int 5"),
    (numba.njit(_copy), "hetflow.kernel takes a Python function (a def or a lambda), not CPUDispatcher"),
    (use_fact, "hetflow.kernel takes a Python function, not <hetflow kernel use_fact from"),
], ids=["int", "njit", "kernel"])
def test_kernel_of_no_python_function_names_what_it_was_given(given, message):
    with pytest.raises(ArgumentTypeError) as err:
        hetflow.kernel(given)
    assert message in str(err.value)


def test_kernel_of_a_kernel_says_to_decorate_its_function_once():
    with pytest.raises(ArgumentTypeError, match=r"a kernel already: decorate its function once"):
        hetflow.kernel(fastmath=True)(use_fact)


def test_boundscheck_takes_a_bool():
    with pytest.raises(ArgumentTypeError,
                       match=r"kernel '_copy': boundscheck= takes True, False or None .*not 'yes'"):
        hetflow.kernel(boundscheck="yes")(_copy)
