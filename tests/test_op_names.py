"""One vocabulary of operation names for the call sites (reduce, scan) and the
collectives (allreduce, reduce across processes): every name works in both.

Oracle: a Python fold of the elements with the operation written out here.
"""
import itertools
import operator

import numpy as np
import pytest

import hetflow
from hetflow import collectives, interior
from hetflow.collectives.ops import resolve_op
from hetflow.errors import ArgumentTypeError
from hetflow.runtime import binops

# name: (the element operation, kinds a call site takes, kinds a collective takes)
NAMES = {
    "sum": (operator.add, "biufc", "iufc"),
    "prod": (operator.mul, "biufc", "iufc"),
    "min": (min, "biuf", "biuf"),
    "max": (max, "biuf", "biuf"),
    "and": (operator.and_, "biu", "biu"),
    "or": (operator.or_, "biu", "biu"),
    "xor": (operator.xor, "biu", "biu"),
    "land": (operator.and_, "biu", "biu"),  # on truth values (_elements)
    "lor": (operator.or_, "biu", "biu"),
    "lxor": (operator.xor, "biu", "biu"),
}
LOGICAL = {"land", "lor", "lxor"}
ALIASES = {"band": "and", "bor": "or", "bxor": "xor"}  # MPI's names, the collectives' old ones
SPELLINGS = [*NAMES, *ALIASES, "SUM", "Land", "BXOR"]
DTYPES = {"b": np.bool_, "i": np.int16, "u": np.uint8, "f": np.float64, "c": np.complex128}


def _name(spelling):
    return ALIASES.get(spelling.lower(), spelling.lower())


def _meaning(spelling):
    return NAMES[_name(spelling)]


def _elements(x, spelling):
    """x's elements as Python values; truth values for the logical operations."""
    return [bool(v) for v in x.tolist()] if _name(spelling) in LOGICAL else x.tolist()


def _data(kind, seed, n=9):
    rng = np.random.default_rng(seed)
    if kind == "b":
        return rng.random(n) < 0.6
    values = rng.integers(0 if kind == "u" else -3, 4, n)  # zeros included: logical ops see them
    return values.astype(DTYPES[kind]) + (1j if kind == "c" else 0)


def _cases(which):
    return [(s, k) for s in SPELLINGS for k in DTYPES if k in _meaning(s)[which]]


def test_the_names_are_the_documented_ones():
    assert set(binops.OPS) == set(NAMES) and set(collectives.BUILTIN_OPS) == set(NAMES)
    assert set(binops.SPELLINGS) == set(NAMES) | set(ALIASES)


@pytest.mark.parametrize("spelling,kind", _cases(1))
def test_every_name_reduces_and_scans_at_a_call_site(spelling, kind):
    fn = _meaning(spelling)[0]
    x = _data(kind, seed=len(spelling))
    items = _elements(x, spelling)
    assert hetflow.reduce(x, spelling) == fn_reduce(fn, items)
    np.testing.assert_array_equal(hetflow.scan(x, spelling), list(itertools.accumulate(items, fn)))


def fn_reduce(fn, items):
    return list(itertools.accumulate(items, fn))[-1]


@pytest.mark.parametrize("name", ["land", "lor", "lxor"])
def test_logical_names_compile_for_views(name):
    fn = NAMES[name][0]
    x = np.array([0, 3, 0, -2, 5, 0, 7, 1], np.int32)
    inner = _elements(x[1:-1], name)
    assert hetflow.reduce(interior(x, 1), name) == fn_reduce(fn, inner)
    np.testing.assert_array_equal(hetflow.scan(interior(x, 1), name), list(itertools.accumulate(inner, fn)))


@pytest.mark.parametrize("spelling,kind", _cases(2))
def test_every_name_combines_in_a_collective(spelling, kind):
    fn = _meaning(spelling)[0]
    a, b = _data(kind, seed=1), _data(kind, seed=2)
    op = resolve_op(spelling)
    assert op.name == _name(spelling)  # what ranks compare
    out = np.empty_like(a)
    op.check(a.dtype)
    op.combine(a, b, out)
    want = np.array([fn(p, q) for p, q in zip(_elements(a, spelling), _elements(b, spelling))]).astype(a.dtype)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(collectives.world().allreduce(a, op=spelling), a)  # one process: a copy


@pytest.mark.parametrize("name", ["sum", "prod"])
def test_a_collective_refuses_what_it_cannot_widen_in_place(name):
    with pytest.raises(ArgumentTypeError, match=f"op '{name}' does not apply to dtype bool"):
        collectives.world().allreduce(np.ones(3, bool), op=name)
    assert hetflow.reduce(np.ones(3, bool), name) == (3 if name == "sum" else 1)  # a call site widens


def test_errors_quote_the_name_as_written():
    with pytest.raises(ArgumentTypeError, match="op 'band' does not apply to dtype float64"):
        hetflow.reduce(np.ones(3), "band")
    with pytest.raises(ArgumentTypeError, match="op 'AND' does not apply to dtype float64"):
        collectives.world().allreduce(np.ones(3), op="AND")
    with pytest.raises(hetflow.errors.ArgumentError, match=r"'lxor' \(also 'band', 'bor', 'bxor' for"):
        hetflow.reduce(np.ones(3), "mean")


@pytest.mark.mpi
def test_every_name_and_mixed_spellings_across_ranks():
    from test_collectives import run_mpi

    output = run_mpi(3, "op_names.py")
    assert "op names ok" in output, output
