"""Rule expressions: Python's syntax, a restricted set of nodes, errors with their origin."""
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetflow.errors import RuleError, RuleSyntaxError
from hetflow.ir import expressions
from hetflow.ir.expressions import Environment, UnknownName, Where, parse


def env(values=None, **functions):
    values = dict(values or {})
    return Environment(values.__getitem__, functions)


def ev(text, values=None, **functions):
    return parse(text).evaluate(env(values, **functions))


@pytest.mark.parametrize("text, expected", [
    ("1 + 2 * 3", 7),
    ("(1 + 2) * 3", 9),
    ("7 / 2", 3.5),
    ("7 // 2", 3),
    ("7 % 4", 3),
    ("-2 * -3", 6),
    ("2e9", 2e9),
    ("1_000 + .5", 1000.5),
    ("1 < 2 < 3", True),
    ("1 < 3 < 2", False),
    ("not 1 > 2", True),
    ("True and not False", True),
    ("'a' + \"b\" == 'ab'", True),
    ("'abc' < 'abd'", True),
    ("max(1, 5, 3) - min(4, 2) + abs(-1)", 4),
    ("round(2.6) + floor(1.9) + ceil(1.1)", 6),
    ("  1 + 1", 2),
])
def test_constant_expressions(text, expected):
    assert ev(text) == expected


def test_dotted_names_and_functions():
    values = {"gpu.utilization": 0.7, "free_memory": 1e9, "gpu0.free_memory": 5, "idle.k.gpu0": 3}
    assert ev("gpu.utilization > 0.5 and free_memory < 2e9", values) is True
    assert ev("gpu0.free_memory * 2 + idle.k.gpu0", values) == 13
    assert ev("count('gpu') + 1", count=lambda kind: {"gpu": 2}[kind]) == 3


def test_short_circuit_does_not_read_the_other_side():
    # 'missing' is never looked up: evaluation stops at the first operand.
    assert ev("False and missing > 1") is False
    assert ev("True or missing > 1") is True


def test_names_lists_variables():
    assert parse("a.b + max(c, 1) > d and defined('e.f')").names() == {"a.b", "c", "d", "e.f"}


@pytest.mark.parametrize("text, column, fragment", [
    ("1 +", 4, "incomplete expression"),
    ("a b", 3, "invalid syntax"),
    ("(1 + 2", 1, "'(' was never closed"),
    ("x $ 2", 3, "invalid syntax"),
    ("", 1, "empty expression"),
    ("x ** 2", 3, "operator '**' is not allowed"),
    ("x @ 2", 3, "operator '@' is not allowed"),
    ("~x", 1, "operator '~' is not allowed"),
    ("x in 'abc'", 3, "comparison 'in' is not allowed"),
    ("x[0]", 1, "subscripts are not allowed"),
    ("(lambda: 1)()", 1, "unknown function"),
    ("[1, 2]", 1, "lists are not allowed"),
    ("1 if x else 2", 1, "conditional expressions are not allowed"),
    ("__import__('os')", 1, "unknown function '__import__'"),
    ("x.__class__.mro()", 1, "unknown function 'x.__class__.mro'"),
    ("max(1).real", 1, "attributes are read from variable names only"),
    ("max(a=1)", 1, "positional arguments only"),
    ("None == x", 1, "the constant None is not allowed"),
    ("1j", 1, "the constant 1j is not allowed"),
    ("true", 1, "write True, as in Python"),
    ("(y := 2)", 2, "assignments are not allowed"),
    ("f'{x}'", 1, "f-strings are not allowed"),
])
def test_syntax_errors_name_the_column(text, column, fragment):
    with pytest.raises(RuleSyntaxError) as info:
        parse(text)
    assert info.value.offset == column, str(info.value)
    assert fragment in str(info.value)


def test_errors_name_where_the_expression_was_written():
    where = Where("rules.toml", "gpu-busy", "then[0].shares.gpu")
    with pytest.raises(RuleSyntaxError) as info:
        parse("a >> 1", where)
    err = info.value
    assert (err.filename, err.rule, err.key, err.offset) == ("rules.toml", "gpu-busy", "then[0].shares.gpu", 3)
    assert str(err).startswith("rules.toml: rule 'gpu-busy', key 'then[0].shares.gpu': operator '>>'")
    with pytest.raises(RuleError, match=r"^rules.toml: rule 'gpu-busy', key 'then\[0\].shares.gpu': division by zero"):
        parse("1 / x", where).evaluate(env({"x": 0}))


def test_an_expression_over_lines_needs_parentheses():
    assert ev("(a > 1 and\n  b < 2)", {"a": 2, "b": 1}) is True
    with pytest.raises(RuleSyntaxError, match="needs parentheses, as in Python"):
        parse("a > 1 and\n  b < 2")


@pytest.mark.parametrize("text, values, fragment", [
    ("'a' + 1", {}, "needs numbers"),
    ("'a' * 3", {}, "needs numbers"),
    ("1 / 0", {}, "division by zero in '/' at column 3"),
    ("x % 0", {"x": 1}, "division by zero in '%'"),
    ("1 < 'a'", {}, "cannot order"),
    ("1 and True", {}, "'and' needs booleans"),
    ("not 1", {}, "'not' needs a boolean"),
    ("-x", {"x": "s"}, "needs a number"),
    ("max(x, 1)", {"x": "s"}, "max() failed"),
    ("count('gpu')", {}, "count() is not available here"),
    ("x / 3", {"x": 10 ** 400}, "'/' failed"),
])
def test_evaluation_errors(text, values, fragment):
    with pytest.raises(RuleError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        ev(text, values)


def test_unknown_variable_is_its_own_error():
    with pytest.raises(UnknownName) as info:
        ev("gpu.utilization > 0.5")
    assert info.value.name == "gpu.utilization"
    assert isinstance(info.value, RuleError)


def test_parse_rejects_non_strings():
    with pytest.raises(RuleSyntaxError, match="must be a string"):
        parse(3)


@pytest.mark.parametrize("depth", [10, 100, expressions.MAX_DEPTH - 3])
def test_nesting_up_to_the_bound_works(depth):
    text = "(" * depth + "x" + " + 1)" * depth
    assert ev(text, {"x": 1}) == depth + 1


@pytest.mark.parametrize("text", [
    "(" * 500 + "x" + ")" * 500,                              # Python's parser: too many parentheses
    "(" * 150 + "x" + " + 1)" * 150 + " + " + "(" * 150 + "x" + " + 1)" * 150 + " > (" + "-" * 300 + "x)",
    "not " * 20000 + "x",                                     # Python's parser runs out of stack
    " + ".join(["x"] * 100000),                               # too deep for its syntax tree
    "max(" * 300 + "x" + ")" * 300,
])
def test_deeper_nesting_is_a_rule_syntax_error_not_a_recursion_error(text):
    with pytest.raises(RuleSyntaxError):
        parse(text, Where("f.toml", "deep", "when"))


# -- property: arithmetic agrees with Python's on the same text ------------------------------

_leaf = st.one_of(st.integers(0, 50).map(str), st.sampled_from(["a", "b", "c"]))


def _tree(children):
    binary = st.tuples(children, st.sampled_from(["+", "-", "*"]), children).map(lambda t: f"({t[0]} {t[1]} {t[2]})")
    unary = children.map(lambda c: f"(-{c})")
    call = st.tuples(st.sampled_from(["min", "max"]), children, children).map(lambda t: f"{t[0]}({t[1]}, {t[2]})")
    return st.one_of(binary, unary, call)


_arith = st.recursive(_leaf, _tree, max_leaves=12)
_bool = st.recursive(
    st.tuples(_arith, st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), _arith).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
    lambda c: st.one_of(st.tuples(c, st.sampled_from(["and", "or"]), c).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
                        c.map(lambda x: f"(not {x})")),
    max_leaves=6)


@settings(max_examples=200, deadline=None)
@given(_arith, st.integers(-9, 9), st.integers(-9, 9), st.integers(-9, 9))
def test_arithmetic_matches_python(text, a, b, c):
    values = {"a": a, "b": b, "c": c}
    assert ev(text, values) == eval(text, {"min": min, "max": max}, values)  # the oracle, in a test


@settings(max_examples=200, deadline=None)
@given(_bool, st.integers(-9, 9), st.integers(-9, 9), st.integers(-9, 9))
def test_logic_matches_python(text, a, b, c):
    values = {"a": a, "b": b, "c": c}
    assert ev(text, values) is bool(eval(text, {"min": min, "max": max}, values))


def test_float_literals_round_trip():
    assert math.isclose(ev("1.5e-3 * 2"), 3e-3)


def test_a_stack_near_its_limit_gives_a_rule_error():
    import sys

    text = "(" * 150 + "near_the_limit" + " + 1)" * 150   # a text no other test compiles (cached)

    def deep(k, fn):
        return fn() if k == 0 else deep(k - 1, fn)

    limit = sys.getrecursionlimit()
    with pytest.raises(RuleSyntaxError, match="nested too deeply"):
        deep(limit - 250, lambda: parse(text + " > 0"))
    compiled = parse(text)
    with pytest.raises(RuleError, match="nested too deeply"):
        deep(limit - 100, lambda: compiled.evaluate(env({"near_the_limit": 1})))
