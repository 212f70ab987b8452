"""Symbolic index expressions and the lowering of views for compiled kernels."""
import itertools

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from view_chains import chains

from hetflow.errors import ShapeError
from hetflow.index import (co_map, cshift, interior, lowering, project, section, tile,
                           transpose)
from hetflow.index.expr import Add, Call, Const, LowerContext, Mul, Param, Var, Wrap, cyclic
from hetflow.cuda_compat import cuda_module


def evaluate(expr, env):
    """Run the rendered source of ``expr`` in plain Python."""
    return eval(expr.render(), {}, dict(env))


# -- expressions ---------------------------------------------------------------------------
def test_render():
    i, n = Var("i"), Param("n")
    assert (i + 3).render() == "(i + 3)" and (i * n).render() == "(i * n)"
    assert (i + Const(-2)).render() == "(i + (-2))"
    assert (i + 0) is i and (i * 1) is i and (i * 0) == Const(0) and Const(2) + 3 == Const(5)
    assert Wrap(i, n, "high").render() == "(i - n if i >= n else i)"
    assert Wrap(i, n, "low").render() == "(i + n if i < 0 else i)"
    assert Wrap(i, n, "mod").render() == "(i % n)"
    assert Call("f", (i,), 0).render({"i": "x"}) == "f((x,))[0]"
    assert Call("f", (i, Var("j")), 1).render() == "f((i, j))[1]"


leaves = st.one_of(st.sampled_from([Var("x"), Var("y"), Param("p")]),
                   st.integers(-5, 5).map(Const))
exprs = st.recursive(leaves, lambda sub: st.one_of(st.builds(Add, sub, sub),
                                                   st.builds(Mul, sub, sub)), max_leaves=6)


@settings(max_examples=200, deadline=None)
@given(exprs, st.integers(-4, 4), st.integers(0, 4), st.integers(-4, 4), st.integers(0, 3),
       st.integers(-6, 6))
def test_bounds_contain_every_value_and_are_reached(e, xlo, xw, ylo, yw, p):
    env = {"x": (xlo, xlo + xw), "y": (ylo, ylo + yw), "p": p}
    values = [evaluate(e, {"x": x, "y": y, "p": p})
              for x in range(xlo, xlo + xw + 1) for y in range(ylo, ylo + yw + 1)]
    lo, hi = e.bounds(env)
    assert lo <= min(values) and max(values) <= hi
    if not isinstance(e, Mul) and not any(isinstance(s, Mul) for s in _subexprs(e)):
        assert (lo, hi) == (min(values), max(values))  # sums of intervals are exact


def _subexprs(e):
    for child in getattr(e, "a", None), getattr(e, "b", None):
        if child is not None:
            yield child
            yield from _subexprs(child)


def test_unknown_bounds():
    assert Var("i").bounds({}) is None and Call("f", (Var("i"),), 0).bounds({"i": (0, 1)}) is None
    assert Wrap(Call("f", (), 0), Param("n"), "mod").bounds({"n": 7}) == (0, 6)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 12), st.integers(-30, 30), st.data())
def test_cyclic_wraps_correctly_and_drops_what_it_can(n, shift, data):
    lo = data.draw(st.integers(0, n - 1))
    hi = data.draw(st.integers(lo, n - 1))
    ctx = LowerContext("q_", {"i": (lo, hi)})
    e, mode = cyclic(Var("i"), shift, n, ctx)
    params = dict(zip(ctx.param_names, ctx.params))
    values = [evaluate(e, {"i": i, **params}) for i in range(lo, hi + 1)]
    assert values == [(i + shift) % n for i in range(lo, hi + 1)]
    blo, bhi = ctx.bounds(e)
    assert blo <= min(values) and max(values) <= bhi
    # Independent characterisation: no wrap happens iff the quotient stays the same.
    wraps = (lo + shift) // n != (hi + shift) // n
    assert (mode == "exact") == (not wraps)
    assert mode != "mod"  # the range is known, so at most one wrap is ever needed
    assert ("%" in e.render()) == (mode == "mod")


def test_cyclic_without_bounds_takes_a_nonnegative_remainder():
    ctx = LowerContext("q_")
    e, mode = cyclic(Var("i"), -3, 10, ctx)
    assert mode == "mod" and ctx.params == [7, 10] and e.render() == "((i + q_p0) % q_p1)"


def test_lower_is_the_symbolic_transform():
    a = np.zeros((5, 6, 7))
    views = [project(a, 1, 4), cshift(a, 2, -3), interior(a, (1, 2, 0)), transpose(a, 0, 2),
             section(a, (1, 0, 2), (2, 3, 4)), co_map(a, lambda i: (i[1], i[0], 6 - i[0]), (3, 5))]
    for v in views:
        names = [f"i{k}" for k in range(v.rank)]
        ctx = LowerContext(literal=True)
        lowered = v.lower([Var(s) for s in names], ctx)
        for idx in itertools.product(*map(range, v.extent)):
            env = dict(zip(names, idx), **ctx.globals)
            got = tuple(eval(e.render(), {}, env) for e in lowered)
            assert got == tuple(v.transform(idx)), (v, idx)


# -- lowering -----------------------------------------------------------------------------
def index_function(low, use_numba=False):
    """def g(i0, .., params): return (root index expressions); optionally njit-compiled."""
    names = [f"i{k}" for k in range(low.rank)]
    body = ", ".join(low.index_source(names))
    src = f"def g({', '.join(names + list(low.param_names))}):\n    return ({body},)\n"
    namespace = {k: numba.njit(f) if use_numba else f for k, f in low.globals.items()}
    exec(src, namespace)
    return numba.njit(namespace["g"]) if use_numba else namespace["g"]


@settings(max_examples=150, deadline=None)
@given(chains())
def test_lowered_source_selects_the_numpy_oracle_indices(chain):
    root, view, ids, names = chain
    low = lowering(view, "v3_")
    assert low.root is root and low.rank == view.rank
    assert all(s.startswith("v3_") for s in list(low.param_names) + list(low.globals))
    g = index_function(low)
    for idx in np.ndindex(*ids.shape):
        got = g(*idx, *low.params)
        assert np.ravel_multi_index(got, root.shape) == ids[idx], (names, idx)


def test_same_structure_shares_key_and_source():
    def stencil(u, delta):
        return interior(transpose(cshift(u, 0, -1), 0, 1), delta)
    small = lowering(stencil(np.zeros((6, 6)), 1), "a_")
    big = lowering(stencil(np.zeros((9, 7)), 2), "a_")
    assert small.key == big.key and small.params != big.params
    names = ("i", "j")
    assert small.index_source(names) == big.index_source(names)
    assert "%" not in "".join(small.index_source(names)) and " if " not in "".join(
        small.index_source(names))


def test_guards_enter_the_key():
    u = np.zeros(10)
    narrow = lowering(section(cshift(u, 0, 3), (0,), (2,)), "p")  # i + 3 in [3, 5): no wrap
    wide = lowering(section(cshift(u, 0, 3), (0,), (8,)), "p")  # i + 3 reaches 10: one wrap
    assert narrow.key != wide.key
    assert narrow.index_source(("i",)) == ("((i + pp0) + pp1)",)
    assert " if " in wide.index_source(("i",))[0]
    f = lambda i: (i[0],)  # noqa: E731
    g = lambda i: (i[0],)  # noqa: E731
    assert lowering(co_map(u, f, (3,)), "p").key != lowering(co_map(u, g, (3,)), "p").key
    assert lowering(co_map(u, f, (3,)), "p").key == lowering(co_map(u, f, (5,)), "p").key


def test_arrays_lower_to_themselves_and_tiles_to_block_indices():
    a = np.zeros((4, 6))
    low = lowering(a, "x")
    assert low.index_source(("i", "j")) == ("i", "j") and low.params == ()
    t = transpose(tile(a, (2, 3)), 0, 1)
    low = lowering(t, "t_")
    assert low.rank == 4  # two tile indices, two indices inside the tile
    g = index_function(low)
    for idx in np.ndindex(3, 2, 2, 3):
        ti, tj, k, m = idx
        assert g(*idx, *low.params) == (tj * 2 + k, ti * 3 + m)


def test_lowering_errors():
    with pytest.raises(ShapeError, match=r"lowering: prefix '3x' does not start valid identifiers"):
        lowering(np.zeros(3), "3x")
    with pytest.raises(ShapeError, match=r"index_source: 1 index names \('i',\) for a view "
                       r"lowered with 2 index variables"):
        lowering(np.zeros((2, 2)), "v").index_source(("i",))


# -- Numba -----------------------------------------------------------------------------------
@numba.njit
def _reflect(i):
    return (4 - i[0], i[1])


def _kernel_cases():
    u = np.arange(30.0).reshape(5, 6)
    return [
        interior(cshift(u, 0, -1), 1),                       # exact: no wrap code
        cshift(transpose(section(u, (1, 0), (4, 6)), 0, 1), 1, 1),    # high
        cshift(u, 1, -2),                                     # low
        co_map(cshift(u, 0, 2), _reflect.py_func, (5, 6)),   # mod, through a co-map call
        project(tile(u, (5, 2)), 0, 0),                       # a row of tiles
    ]


def _compile_read(low, compile_fn, cast):
    names = [f"i{k}" for k in range(low.rank)]
    src = (f"def read(root, {', '.join(names + list(low.param_names))}):\n"
           f"    return root[{', '.join(low.index_source(names, cast))}]\n")
    namespace = {"np": np, **{k: numba.njit(f) for k, f in low.globals.items()}}
    exec(src, namespace)
    return compile_fn(namespace["read"])


@pytest.mark.parametrize("cast", [None, "np.uint64"])
@pytest.mark.parametrize("case", range(5))
def test_lowered_source_compiles_with_numba(case, cast):
    view = _kernel_cases()[case]
    low = lowering(view, "k_")
    read = _compile_read(low, numba.njit, cast)
    expect = view.numpy()
    for idx in np.ndindex(*expect.shape):
        assert read(low.root, *idx, *low.params) == expect[idx]
    modes = {entry[3] for entry in low.key[2] if entry[0] == "cshift"}
    assert modes == [{"exact"}, {"high"}, {"low"}, {"mod"}, set()][case]


def test_cast_wraps_each_root_index():
    low = lowering(section(np.zeros((4, 4)), (1, 2), (2, 2)), "s")
    assert low.index_source(("i", "j"), "u64") == ("u64((i + sp0))", "u64((j + sp1))")


def _cuda_reads(view, cast):
    """Every element of ``view`` read by a CUDA kernel built from the lowered source."""
    cuda = cuda_module()
    low = lowering(view, "k_")
    shape = tuple(view.extent) + tuple(view.element_extent)
    names = [f"i{k}" for k in range(low.rank)]
    strides = [int(np.prod(shape[k + 1:])) for k in range(len(shape))]
    unravel = "".join(f"        {v} = t // {s} % {n}\n" for v, s, n in zip(names, strides, shape))
    src = (f"def kern(root, out, {', '.join(low.param_names)}):\n"
           "    t = cuda.grid(1)\n"
           "    if t < out.size:\n" + unravel +
           f"        out[t] = root[{', '.join(low.index_source(names, cast))}]\n")
    namespace = {"np": np, "cuda": cuda,
                 **{k: cuda.jit(device=True)(f) for k, f in low.globals.items()}}
    exec(src, namespace)
    kern = cuda.jit(namespace["kern"])
    out = cuda.device_array(int(np.prod(shape)), dtype=view.dtype)
    kern[(out.size + 31) // 32, 32](cuda.to_device(low.root), out, *low.params)
    return out.copy_to_host().reshape(shape)


@pytest.mark.simgpu
@pytest.mark.parametrize("case", [0, 3, 4])
def test_lowered_source_runs_in_simulated_cuda_kernels(case):
    view = _kernel_cases()[case]
    assert np.array_equal(_cuda_reads(view, "np.uint64"), view.numpy())


@pytest.mark.gpu
@pytest.mark.parametrize("cast", [None, "np.uint64"])
@pytest.mark.parametrize("case", range(5))
def test_lowered_source_compiles_for_cuda(case, cast):
    view = _kernel_cases()[case]
    assert np.array_equal(_cuda_reads(view, cast), view.numpy())


def test_a_view_is_lowered_once_per_prefix_and_the_same_view_runs_again():
    import hetflow

    @hetflow.kernel
    def double(i, j, src, dst):
        dst[i, j] = 2.0 * src[i, j]

    a = np.arange(36.0).reshape(6, 6)
    out = np.zeros((6, 6))
    src, dst = interior(cshift(a, 0, 1), 1), interior(out, 1)
    first = lowering(src, "s_")
    assert lowering(src, "s_") is first and lowering(src, "t_") is not first
    for _ in range(2):
        out[...] = 0
        hetflow.forall(src.extent, double, src, dst)
        np.testing.assert_array_equal(out[1:-1, 1:-1], 2.0 * np.roll(a, -1, 0)[1:-1, 1:-1])


@pytest.mark.parametrize("make, box", [
    (lambda a: interior(a, 1), (slice(1, 5), slice(1, 7))),
    (lambda a: section(interior(a, 1), (1, 2), (2, 3)), (slice(2, 4), slice(3, 6))),
    (lambda a: interior(cshift(a, 0, 1), 1), (slice(2, 6), slice(1, 7))),   # cannot wrap
    (lambda a: cshift(a, 0, 1), None),                                       # wraps
    (lambda a: transpose(a, 0, 1), None),
    (lambda a: project(a, 0, 2), None),
])
def test_root_box_only_for_translations_and_it_matches_the_elements(make, box):
    a = np.arange(48.0).reshape(6, 8)
    view = make(a)
    assert view.root_box() == box
    if box is not None:
        np.testing.assert_array_equal(a[box], view.numpy())
        view.assign(-1.0)
        assert (a[box] == -1.0).all() and (a == -1.0).sum() == view.numpy().size
