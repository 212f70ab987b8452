"""Fusing chains of elementwise launches: results equal the unfused program's and NumPy's."""
import numpy as np
import pytest

import hetflow
from hetflow.ir import Chain, Fuse, NodePattern, Rule, RuleSet, graph
from hetflow.kernels.kernel import Kernel

FUSE = RuleSet([Rule("fuse", match=Chain(NodePattern(op="forall")), then=Fuse())])


@hetflow.kernel
def scale(i, a, x, out):
    out[i] = a * x[i]


@hetflow.kernel
def shift(i, x, b, out):
    out[i] = x[i] + b


@hetflow.kernel
def square(i, x, out):
    out[i] = x[i] * x[i]


@hetflow.kernel
def add(i, x, y, out):
    out[i] = x[i] + y[i]


@hetflow.kernel
def next_of(i, x, out):
    out[i] = x[i + 1] if i + 1 < x.shape[0] else 0.0


@hetflow.kernel
def accumulate(i, x, acc):
    acc[i] += x[i]


@hetflow.kernel
def guarded(i, n, x, out):
    if i >= n:
        return
    out[i] = x[i] * 2.0


@hetflow.kernel
def cube(v):
    return v * v * v


@hetflow.kernel
def cube_of(i, x, out):
    out[i] = cube(x[i])


@hetflow.kernel
def scale2d(i, j, a, x, out):
    out[i, j] = a * x[i, j]


@hetflow.kernel
def add2d(i, j, x, y, out):
    out[i, j] = x[i, j] + y[i, j] + j


def ops(g):
    return [(n.op, n.name) for n in g.current.nodes]


def chain_program(n, x, y):
    """a: t0 = 2x; b: t1 = t0 + 1; c: y = t1^2 (the a, b, c -> d of SPEC §4.5 scenario 7)."""
    with graph("abc") as g:
        t0 = hetflow.empty(n)
        t1 = hetflow.empty(n)
        hetflow.forall(n, scale, 2.0, x, t0)
        hetflow.forall(n, shift, t0, 1.0, t1)
        hetflow.forall(n, square, t1, y)
    return g, (t0, t1)


def test_chain_fuses_and_intermediates_are_never_allocated():
    n = 1000
    x = np.random.default_rng(1).random(n)
    y = np.zeros(n)
    g, temps = chain_program(n, x, y)
    g.run(rules=FUSE)
    assert ops(g) == [("forall", "fused_scale_shift_square")]
    assert g.current.nodes[0].attrs["eliminated"] == ("t0", "t1")
    np.testing.assert_array_equal(y, (2.0 * x + 1.0) ** 2)
    assert not any(t.materialized for t in temps)
    # The unfused program (no rules) computes exactly the same values.
    y_fused = y.copy()
    g.run(rules=RuleSet())
    np.testing.assert_array_equal(y, y_fused)
    assert all(t.materialized for t in temps)


def test_outputs_are_kept():
    n = 64
    x, y = np.arange(n, dtype=float), np.zeros(n)
    g, (t0, t1) = chain_program(n, x, y)
    g.output(t1)
    g.run(rules=FUSE)
    assert g.current.nodes[-1].attrs["eliminated"] == ("t0",)
    np.testing.assert_array_equal(np.asarray(t1), 2.0 * x + 1.0)
    np.testing.assert_array_equal(y, (2.0 * x + 1.0) ** 2)
    assert not t0.materialized


def test_reading_a_neighbour_is_not_fused():
    n = 50
    x, y = np.arange(n, dtype=float), np.zeros(n)
    with graph() as g:
        t = hetflow.empty(n)
        hetflow.forall(n, scale, 3.0, x, t)
        hetflow.forall(n, next_of, t, y)       # reads t[i + 1]: needs all of t first
    g.run(rules=FUSE)
    assert len(g.versions) == 1
    expected = np.append(3.0 * x[1:], 0.0)
    np.testing.assert_array_equal(y, expected)


def test_write_after_read_at_another_index_is_not_fused():
    n = 40
    x = np.arange(n, dtype=float)
    t = np.zeros(n)
    with graph() as g:
        hetflow.forall(n, next_of, x, t)      # reads x[i + 1]
        hetflow.forall(n, scale, 1.0, t, x)   # writes x[i]
    g.run(rules=FUSE)
    assert len(g.versions) == 1
    np.testing.assert_array_equal(x, np.append(np.arange(1.0, n), 0.0))


def test_intermediate_read_elsewhere_is_kept():
    n = 32
    x, y = np.arange(n, dtype=float), np.zeros(n)
    with graph() as g:
        t = hetflow.empty(n)
        hetflow.forall(n, scale, 2.0, x, t)
        hetflow.forall(n, shift, t, 1.0, y)
        total = g.record("reduce", fn=np.sum, args=(t,))
    g.run(rules=FUSE)
    fused = [n for n in g.current.nodes if n.op == "forall"]
    assert len(fused) == 1 and "eliminated" not in fused[0].attrs
    assert float(total) == pytest.approx(np.sum(2.0 * x))
    np.testing.assert_array_equal(y, 2.0 * x + 1.0)


def test_accumulating_intermediate_is_not_made_local():
    # acc is read before it is written (acc[i] += ...): its old value matters.
    n = 16
    x = np.arange(n, dtype=float)
    y = np.zeros(n)
    with graph() as g:
        acc = hetflow.zeros(n)
        hetflow.forall(n, accumulate, x, acc)
        hetflow.forall(n, scale, 2.0, acc, y)
    g.run(rules=FUSE)
    assert g.current.nodes[-1].attrs["fused"] == ("accumulate", "scale")
    assert "eliminated" not in g.current.nodes[-1].attrs
    np.testing.assert_array_equal(y, 2.0 * x)
    g.run(rules=FUSE)                          # zeros again at each run
    np.testing.assert_array_equal(y, 2.0 * x)


def test_diamond_and_shared_inputs():
    n = 100
    x, y = np.linspace(0, 1, n), np.zeros(n)
    with graph() as g:
        a = hetflow.empty(n)
        b = hetflow.empty(n)
        hetflow.forall(n, scale, 2.0, x, a)
        hetflow.forall(n, square, a, b)
        hetflow.forall(n, add, a, b, y)        # reads both earlier results
    g.run(rules=FUSE)
    assert ops(g) == [("forall", "fused_scale_square_add")]
    np.testing.assert_allclose(y, 2 * x + (2 * x) ** 2, rtol=0, atol=0)


def test_early_return_fuses():
    n = 10
    x, y = np.ones(n), np.zeros(n)
    with graph() as g:
        t = hetflow.empty(n)
        hetflow.forall(n, guarded, n - 2, x, t)
        hetflow.forall(n, scale, 3.0, t, y)
    g.run(rules=FUSE)
    assert ops(g) == [("forall", "fused_guarded_scale")]  # a return leaves only its own kernel
    np.testing.assert_array_equal(y[:n - 2], 6.0)


def test_kernels_calling_kernels_fuse():
    n = 20
    x, y = np.arange(n, dtype=float), np.zeros(n)
    with graph() as g:
        t = hetflow.empty(n)
        hetflow.forall(n, cube_of, x, t)
        hetflow.forall(n, shift, t, -1.0, y)
    g.run(rules=FUSE)
    assert ops(g) == [("forall", "fused_cube_of_shift")]
    np.testing.assert_array_equal(y, x ** 3 - 1.0)


def test_two_dimensional_chain():
    x = np.arange(12.0).reshape(3, 4)
    y = np.zeros((3, 4))
    with graph() as g:
        t = hetflow.empty((3, 4))
        hetflow.forall((3, 4), scale2d, 0.5, x, t)
        hetflow.forall((3, 4), add2d, t, x, y)
    g.run(rules=FUSE)
    assert ops(g) == [("forall", "fused_scale2d_add2d")]
    np.testing.assert_array_equal(y, 1.5 * x + np.arange(4)[None, :])


def test_different_extents_or_placements_do_not_fuse():
    x, y, z = np.ones(8), np.zeros(8), np.zeros(8)
    with graph() as g:
        t = hetflow.empty(8)
        hetflow.forall(8, scale, 2.0, x, t)
        hetflow.forall(4, shift, t, 1.0, y)
        hetflow.forall(8, shift, t, 1.0, z, device="cpu0")
    g.run(rules=FUSE)
    assert len(g.versions) == 1
    np.testing.assert_array_equal(y[:4], 3.0)
    np.testing.assert_array_equal(z, 3.0)


def test_globals_with_the_same_name_stay_apart():
    k1 = Kernel.from_source("times_c", "def times_c(i, x, out):\n    out[i] = x[i] * C\n", {"C": 2.0})
    k2 = Kernel.from_source("plus_c", "def plus_c(i, x, out):\n    out[i] = x[i] + C\n", {"C": 10.0})
    x, y = np.arange(5.0), np.zeros(5)
    with graph() as g:
        t = hetflow.empty(5)
        hetflow.forall(5, k1, x, t)
        hetflow.forall(5, k2, t, y)
    g.run(rules=FUSE)
    assert ops(g) == [("forall", "fused_times_c_plus_c")]
    np.testing.assert_array_equal(y, 2.0 * x + 10.0)


def test_fused_kernel_is_reused_when_derived_again():
    n = 8
    x, y = np.ones(n), np.zeros(n)
    g, _ = chain_program(n, x, y)
    g.run(rules=FUSE)
    first = g.current.nodes[0].kernel
    g.run(rules=RuleSet())       # another rule set: back to the captured version
    g.run(rules=FUSE)            # derived again: the cached variant comes back
    assert g.current.nodes[0].kernel is first
    assert g.interpreter.cache.hits >= 1
    assert len(g.versions) == 3


def test_fuse_needs_a_chain():
    x = np.ones(4)
    with graph() as g:
        hetflow.forall(4, scale, 2.0, x, x)
    rules = RuleSet([Rule("bad-fuse", match=NodePattern(op="forall"), then=Fuse())])
    g.run(rules=rules)
    assert not rules.get("bad-fuse").enabled
    assert "fuse needs a chain" in rules.get("bad-fuse").error
    np.testing.assert_array_equal(x, 2.0)


def test_same_text_with_other_global_values_is_another_kernel():
    results = []
    for c in (2.0, 5.0):
        k1 = Kernel.from_source("times_k", "def times_k(i, x, out):\n    out[i] = x[i] * K\n", {"K": c})
        k2 = Kernel.from_source("minus_one", "def minus_one(i, x, out):\n    out[i] = x[i] - 1.0\n", {})
        x, y = np.arange(3.0), np.zeros(3)
        with graph() as g:
            t = hetflow.empty(3)
            hetflow.forall(3, k1, x, t)
            hetflow.forall(3, k2, t, y)
        g.run(rules=FUSE)
        results.append(y)
    np.testing.assert_array_equal(results[0], 2.0 * np.arange(3.0) - 1.0)
    np.testing.assert_array_equal(results[1], 5.0 * np.arange(3.0) - 1.0)
