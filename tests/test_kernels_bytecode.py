"""Kernels compiled from their function object, views as Numba values: kernels defined
anywhere Python runs, many parameters, views handed to other compiled code; oracle:
NumPy."""
import os
import subprocess
import sys
import textwrap

import numba
import numpy as np
import pytest

import hetflow
from hetflow import cshift, interior

N_PARAMS = 40


def _many_params_kernel():
    """A kernel of 40 parameters: the index, an output and 38 inputs (exec'd: the
    parameter list is generated)."""
    names = [f"x{k}" for k in range(N_PARAMS - 2)]
    text = f"def many(i, out, {', '.join(names)}):\n    out[i] = {' + '.join(f'{k + 1} * {n}[i]' for k, n in enumerate(names))}\n"
    ns = {}
    exec(text, ns)
    return hetflow.kernel(ns["many"]), len(names)


@pytest.mark.parametrize("where", ["cpu0", "gpu0"])
def test_forty_parameters(where, request):
    device = request.getfixturevalue("gpu_device") if where == "gpu0" else where
    kernel, inputs = _many_params_kernel()
    assert len(kernel.params) == N_PARAMS
    rng = np.random.default_rng(3)
    xs = [rng.random(16) for _ in range(inputs)]
    out = np.zeros(16)
    hetflow.forall(16, kernel, out, *xs, device=device)
    np.testing.assert_allclose(out, sum((k + 1) * x for k, x in enumerate(xs)), rtol=1e-12)


@hetflow.kernel
def seven_point(i, j, k, new, c, xm, xp, ym, yp, zm, zp):
    new[i, j, k] = (c[i, j, k] + xm[i, j, k] + xp[i, j, k] + ym[i, j, k] + yp[i, j, k]
                    + zm[i, j, k] + zp[i, j, k]) / 7.0


def _stencil_views(u, v):
    """Eight views: v's interior, u's interior and u's interior shifted six ways."""
    shifts = [interior(cshift(u, axis, s), 1) for axis in range(3) for s in (-1, 1)]
    return (interior(v, 1), interior(u, 1), *shifts)


@pytest.mark.parametrize("where", ["cpu0", "gpu0"])
def test_three_dimensional_stencil_with_eight_views(where, request):
    device = request.getfixturevalue("gpu_device") if where == "gpu0" else where
    shape = (6, 5, 7) if where == "gpu0" else (20, 18, 16)
    u = np.random.default_rng(4).random(shape)
    v = np.zeros(shape)
    hetflow.forall(tuple(s - 2 for s in shape), seven_point, *_stencil_views(u, v), device=device)
    c = u[1:-1, 1:-1, 1:-1]
    expected = (c + u[:-2, 1:-1, 1:-1] + u[2:, 1:-1, 1:-1] + u[1:-1, :-2, 1:-1] + u[1:-1, 2:, 1:-1]
                + u[1:-1, 1:-1, :-2] + u[1:-1, 1:-1, 2:]) / 7.0
    np.testing.assert_allclose(v[1:-1, 1:-1, 1:-1], expected, rtol=1e-12)
    assert not v[0].any() and not v[-1].any()


@numba.njit
def weight(a, b):
    return 0.75 * a + 0.25 * b


@numba.njit
def neighbours(view, i):
    """A user's own compiled function, handed a view."""
    return view[i - 1] + view[i + 1] if i > 0 else view[i + 1]


@hetflow.kernel
def blend(i, x, y):
    return weight(x[i], y[i])


@hetflow.kernel
def calls_all(i, x, y, ring, out):
    out[i] = blend(i, x, y) + neighbours(ring, i)


@pytest.mark.parametrize("where", ["cpu0", "gpu0"])
def test_kernel_calls_a_kernel_an_njit_function_and_hands_it_a_view(where, request):
    device = request.getfixturevalue("gpu_device") if where == "gpu0" else where
    n = 12
    x, y = np.arange(n, dtype=float), np.arange(n, dtype=float) ** 2
    base = np.arange(n + 2, dtype=float) * 10
    out = np.zeros(n)
    hetflow.forall(n, calls_all, x, y, interior(base, 1), out, device=device)
    inner = base[1:-1]
    expected = 0.75 * x + 0.25 * y + np.concatenate([[inner[1]], inner[:-2] + inner[2:], [np.nan]])[:n]
    np.testing.assert_allclose(out[:n - 1], expected[:n - 1])


def test_a_closure_kernel_reads_its_captured_values():
    def make(scale):
        @hetflow.kernel
        def scaled(i, x, out):
            out[i] = scale * x[i]
        return scaled

    x = np.arange(8.0)
    for scale in (2.0, 3.0):
        out = np.zeros(8)
        hetflow.forall(8, make(scale), x, out)
        np.testing.assert_array_equal(out, scale * x)


def test_exec_kernel_over_views():
    ns = {"hetflow": hetflow, "h": 0.5}
    exec(textwrap.dedent("""
        def diff(i, east, west, out):
            out[i] = (east[i] - west[i]) * h
    """), ns)
    x = np.arange(12.0) ** 2
    out = np.zeros(10)
    views = interior(cshift(x, 0, 1), 1), interior(cshift(x, 0, -1), 1)
    # Without source every argument may be written: two views of x might race.
    with pytest.raises(hetflow.errors.ShapeError, match=r"no source Python can read .* declare the ones it "
                                                        r"writes \(@hetflow.kernel\(writes=\[...\]\)\)"):
        hetflow.forall(10, hetflow.kernel(ns["diff"]), *views, out)
    hetflow.forall(10, hetflow.kernel(ns["diff"], writes=["out"]), *views, out)
    np.testing.assert_array_equal(out, (x[2:] - x[:-2]) * 0.5)


PROGRAM = """
import numpy as np, hetflow
from hetflow import interior, cshift

@hetflow.kernel(writes=["new"])  # no source to read: what it writes, declared
def lap(i, new, c, w, e):
    new[i] = w[i] - 2.0 * c[i] + e[i]

u = np.arange(10.0) ** 3
v = np.zeros(10)
hetflow.forall(8, lap, interior(v, 1), interior(u, 1), interior(cshift(u, 0, -1), 1), interior(cshift(u, 0, 1), 1))
print(" ".join(repr(float(a)) for a in v))
"""


def _expected_lap():
    u = np.arange(10.0) ** 3
    v = np.zeros(10)
    v[1:-1] = u[:-2] - 2.0 * u[1:-1] + u[2:]
    return v


@pytest.mark.parametrize("how", ["dash_c", "stdin"])
def test_views_in_a_kernel_from_python_dash_c_and_stdin(how, tmp_path):
    env = dict(os.environ, HETFLOW_CACHE_DIR=str(tmp_path / "cache"))
    args, stdin = ([sys.executable, "-c", PROGRAM], None) if how == "dash_c" else ([sys.executable, "-"], PROGRAM)
    run = subprocess.run(args, input=stdin, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    got = np.array([float(a) for a in run.stdout.split()])
    np.testing.assert_array_equal(got, _expected_lap())


def test_changing_a_called_njit_function_changes_the_executable():
    def make(c):
        @numba.njit
        def f(a):
            return a + c
        return f

    ns = {"hetflow": hetflow}
    exec("def k(i, x, out):\n    out[i] = f(x[i])\n", ns)
    x, results = np.arange(4.0), []
    for c in (1.0, 2.0):
        ns["f"] = make(c)
        kernel = hetflow.kernel(ns["k"])
        out = np.zeros(4)
        hetflow.forall(4, kernel, x, out)
        results.append(out)
    np.testing.assert_array_equal(results[0], x + 1.0)
    np.testing.assert_array_equal(results[1], x + 2.0)
