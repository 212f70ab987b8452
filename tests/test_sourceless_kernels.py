"""Kernels defined where Python cannot read their source (``exec``, ``python -c``, stdin,
the plain REPL) run from their function object; oracle: NumPy."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import hetflow
from hetflow import interior
from hetflow.errors import IndexOutOfBoundsError


@hetflow.kernel
def square(i, v):
    return v * v


def _exec_kernel(text, **globals_):
    """A kernel from ``exec``: its function has no source Python can read."""
    ns = {"hetflow": hetflow, "np": np, **globals_}
    exec(textwrap.dedent(text), ns)
    return ns


def test_exec_kernel_runs_and_matches_numpy():
    ns = _exec_kernel("""
        @hetflow.kernel
        def shifted(i, a, x, out):
            out[i] = a * x[i] + OFFSET
    """, OFFSET=0.5)
    k = ns["shifted"]
    assert k.compilable and not k.has_source
    x = np.linspace(0, 1, 1000)
    out = np.zeros_like(x)
    hetflow.forall(1000, k, 3.0, x, out)
    np.testing.assert_array_equal(out, 3.0 * x + 0.5)
    big = np.arange(100_000.0)
    out = np.zeros_like(big)
    hetflow.forall(big.size, k, 2.0, big, out)  # the parallel entry over all cores
    np.testing.assert_array_equal(out, 2.0 * big + 0.5)


def test_exec_kernel_in_two_dimensions_calling_a_kernel():
    ns = _exec_kernel("""
        @hetflow.kernel
        def outer_sq(i, j, x, y, out):
            out[i, j] = square(i, x[i]) + y[j]
    """, square=square)
    x, y = np.arange(4.0), np.arange(6.0)
    out = np.zeros((4, 6))
    hetflow.forall((4, 6), ns["outer_sq"], x, y, out)
    np.testing.assert_array_equal(out, (x * x)[:, None] + y[None, :])


def test_every_array_parameter_counts_as_read_and_written():
    ns = _exec_kernel("""
        def copy(i, x, out):
            out[i] = x[i]
    """)
    k = hetflow.kernel(ns["copy"])
    assert k.access(1).modes == {"x": "rw", "out": "rw"}


def test_views_in_a_kernel_without_source():
    ns = _exec_kernel("""
        @hetflow.kernel
        def take(i, v, out):
            out[i] = v[i]
    """)
    x = np.arange(10.0)
    out = np.zeros(8)
    hetflow.forall(8, ns["take"], interior(x, 1), out)
    np.testing.assert_array_equal(out, x[1:-1])


def test_checked_mode_names_the_array_without_source():
    ns = _exec_kernel("""
        @hetflow.kernel(boundscheck=True)
        def shift(i, x, out):
            out[i] = x[i + 1]
    """)
    with pytest.raises(IndexOutOfBoundsError, match="kernel 'shift'") as err:
        hetflow.forall(10, ns["shift"], np.arange(10.0), np.zeros(10))
    assert (err.value.array, err.value.index) == ("x", 10)


PROGRAM = """
import json
import numpy as np
import hetflow
from hetflow.platform.repository import repository

@hetflow.kernel
def poly(i, x, out):
    out[i] = x[i] * x[i] - 3.0 * x[i] + 1.0

x = np.linspace(-2.0, 2.0, 64)
out = np.zeros(64)
hetflow.forall(64, poly, x, out)
print(json.dumps({"out": out.tolist(), "compiled": repository().compiled, "loaded": repository().loaded}))
"""


def _run(args, cache, stdin=None):
    env = dict(os.environ, HETFLOW_CACHE_DIR=str(cache))
    run = subprocess.run([sys.executable, *args], input=stdin, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def _expected():
    x = np.linspace(-2.0, 2.0, 64)
    return x * x - 3.0 * x + 1.0


def test_python_dash_c_kernel_runs_and_the_next_process_reuses_it(tmp_path):
    first = _run(["-c", PROGRAM], tmp_path)
    np.testing.assert_allclose(first["out"], _expected(), rtol=1e-15)
    again = _run(["-c", PROGRAM], tmp_path)  # the same bytecode: the stored executable
    assert (first["compiled"], again["compiled"], again["loaded"]) == (1, 0, 1)


def test_kernel_read_from_stdin_runs(tmp_path):
    result = _run(["-"], tmp_path, stdin=PROGRAM)
    np.testing.assert_allclose(result["out"], _expected(), rtol=1e-15)


@pytest.mark.simgpu
def test_exec_kernel_on_the_simulated_gpu(gpu_device):
    ns = _exec_kernel("""
        @hetflow.kernel
        def halve(i, x, out):
            out[i] = x[i] / 2
    """)
    x, out = np.arange(16.0), np.zeros(16)
    hetflow.forall(16, ns["halve"], x, out, device=gpu_device)
    np.testing.assert_array_equal(out, x / 2)
    checked = hetflow.kernel(boundscheck=True)(ns["halve"].pyfunc)
    with pytest.raises(IndexOutOfBoundsError) as err:
        hetflow.forall(17, checked, x, out, device=gpu_device)
    assert (err.value.array, err.value.index) == ("x", 16)


def test_lambda_kernels_are_read_from_their_bytecode():
    # A lambda's "source" is the whole line around it, not a def: that failed with "must
    # define exactly one function", even as the operation of a reduction.
    x = np.arange(1.0, 11.0)
    assert hetflow.reduce(x, hetflow.kernel(lambda a, b: a + b)) == x.sum()
    np.testing.assert_array_equal(hetflow.scan(x[::-1].copy(), hetflow.kernel(lambda a, b: max(a, b))),
                                  np.maximum.accumulate(x[::-1]))
    with pytest.raises(hetflow.errors.KernelError, match="kernel '<lambda>' takes 0 parameters"):
        hetflow.forall(3, hetflow.kernel(lambda: None))


def test_overlapping_arguments_of_a_kernel_without_source_are_refused():
    """Nothing says where such a kernel touches its arguments: two over one memory may
    race (before, this ran and gave neither NumPy's result nor an error)."""
    ns = _exec_kernel("""
        @hetflow.kernel
        def avg3(i, out, left, right):
            out[i] = (out[i] + left[i] + right[i]) / 3
    """)
    u = np.arange(6.0) ** 2
    with pytest.raises(hetflow.errors.ShapeError, match=r"kernel 'avg3' writes argument 'out' .* and "
                                                        r"(reads|writes) argument 'left'"):
        hetflow.forall(4, ns["avg3"], interior(u, 1), u[:4], u[2:])
    np.testing.assert_array_equal(u, np.arange(6.0) ** 2)  # refused before anything ran
    expected = u.copy()
    expected[1:-1] = (expected[1:-1] + expected[:-2] + expected[2:]) / 3
    with pytest.raises(hetflow.errors.ShapeError):  # snapshot copies only what is only read
        hetflow.forall(4, ns["avg3"], interior(u, 1), u[:4], u[2:], snapshot=True)
    hetflow.forall(4, ns["avg3"], interior(u, 1), u[:4].copy(), u[2:].copy())  # apart: runs
    np.testing.assert_array_equal(u, expected)


def test_graph_of_sourceless_kernels_says_why_it_was_not_fused():
    ns = _exec_kernel("""
        @hetflow.kernel
        def scale(i, x, out):
            out[i] = 2.0 * x[i]

        @hetflow.kernel
        def shift(i, x, out):
            out[i] = x[i] + 1.0
    """)
    x, y = np.arange(8.0), np.empty(8)
    with hetflow.graph() as g:
        t = hetflow.empty(8)
        hetflow.forall(8, ns["scale"], x, t)
        hetflow.forall(8, ns["shift"], t, y)
    g.run()
    np.testing.assert_array_equal(y, 2.0 * np.arange(8.0) + 1.0)
    with pytest.raises(hetflow.errors.ArgumentError,
                       match=r"no version 1 \(versions 0\.\.0\); no rule has rewritten it, and "
                             r"kernel\(s\) scale, shift cannot be fused because their source"):
        g.diff(0, 1)
