"""hetflow's rule expression language: parsing, evaluation and error positions."""
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetflow.errors import RuleError, RuleSyntaxError
from hetflow.ir import lang


def env(values=None, **functions):
    values = dict(values or {})
    return lang.Environment(values.__getitem__, functions)


def ev(text, values=None, **functions):
    return lang.parse(text).evaluate(env(values, **functions))


@pytest.mark.parametrize("text, expected", [
    ("1 + 2 * 3", 7),
    ("(1 + 2) * 3", 9),
    ("7 / 2", 3.5),
    ("7 % 4", 3),
    ("-2 * -3", 6),
    ("2e9", 2e9),
    ("1_000 + .5", 1000.5),
    ("1 < 2 < 3", True),
    ("1 < 3 < 2", False),
    ("not 1 > 2", True),
    ("true and not false", True),
    ("'a' + \"b\" == 'ab'", True),
    ("'abc' < 'abd'", True),
    ("max(1, 5, 3) - min(4, 2) + abs(-1)", 4),
    ("round(2.6) + floor(1.9) + ceil(1.1)", 6),
])
def test_constant_expressions(text, expected):
    assert ev(text) == expected


def test_dotted_names_and_functions():
    values = {"gpu.utilization": 0.7, "free_memory": 1e9, "gpu0.free_memory": 5}
    assert ev("gpu.utilization > 0.5 and free_memory < 2e9", values) is True
    assert ev("gpu0.free_memory * 2", values) == 10
    assert ev("count('gpu') + 1", count=lambda kind: {"gpu": 2}[kind]) == 3


def test_short_circuit_does_not_read_the_other_side():
    # 'missing' is never looked up: evaluation stops at the first operand.
    assert ev("false and missing > 1") is False
    assert ev("true or missing > 1") is True


def test_names_lists_variables():
    assert lang.parse("a.b + max(c, 1) > d").names() == {"a.b", "c", "d"}


@pytest.mark.parametrize("text, column, fragment", [
    ("1 +", 4, "expected a value"),
    ("a b", 3, "unexpected 'b'"),
    ("(1 + 2", 7, "expected ')'"),
    ("x @ 2", 3, "unexpected character '@'"),
    ("", 1, "empty expression"),
    ("max(1,", 7, "expected a value"),
])
def test_syntax_errors_name_the_column(text, column, fragment):
    with pytest.raises(RuleSyntaxError) as info:
        lang.parse(text)
    assert info.value.offset == column
    assert fragment in str(info.value)


def test_syntax_error_positions_inside_a_file():
    where = lang.Where("rules.toml", line=4, column=9, source_line='when = "a >> 1"')
    with pytest.raises(RuleSyntaxError) as info:
        lang.parse("a >> 1", where)
    err = info.value
    assert (err.filename, err.lineno, err.offset) == ("rules.toml", 4, 12)
    assert str(err).startswith("rules.toml:4:12:")


def test_syntax_error_on_a_later_line_of_a_multiline_expression():
    where = lang.Where("r.toml", line=2, column=10)
    with pytest.raises(RuleSyntaxError) as info:
        lang.parse("a > 1 and\n  b >", where)
    assert (info.value.lineno, info.value.offset) == (3, 6)


@pytest.mark.parametrize("text, values, fragment", [
    ("'a' + 1", {}, "needs numbers"),
    ("1 / 0", {}, "division by zero"),
    ("1 < 'a'", {}, "cannot order"),
    ("1 and true", {}, "expected a boolean"),
    ("nope(1)", {}, "unknown function 'nope'"),
    ("-x", {"x": "s"}, "needs numbers"),
    ("max()", {}, "max() failed"),
])
def test_evaluation_errors(text, values, fragment):
    with pytest.raises(RuleError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        ev(text, values)


def test_unknown_variable_is_its_own_error():
    with pytest.raises(lang.UnknownName) as info:
        ev("gpu.utilization > 0.5")
    assert info.value.name == "gpu.utilization"
    assert isinstance(info.value, RuleError)


def test_parse_rejects_non_strings():
    with pytest.raises(RuleSyntaxError, match="must be a string"):
        lang.parse(3)


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
