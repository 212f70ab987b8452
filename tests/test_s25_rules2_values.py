"""Rule values are finite: an overflowing constant is refused when a rule is built or
loaded, a set that evaluates to nan or inf disables its rule, and a nan variable does
not make every safe point re-evaluate the rules."""
import itertools

import numpy as np
import pytest

from hetflow.errors import RuleError, RuleSyntaxError
from hetflow.ir import Interpreter, Monitor, Rule, RuleSet, Set, Topology, rulefile
from hetflow.ir.expressions import Where, parse
from hetflow.platform.devices import get_device


def interpreter():
    return Interpreter(Monitor(Topology([get_device("cpu0")]), sources=[]))


def adjust(interp, rules):
    return interp.adjust((), rules, new_id=itertools.count().__next__)


def one_rule(value, when=None):
    when = f'when = "{when}"\n' if when else ""
    return f'[[rule]]\nname = "grow"\n{when}then = [ {{ action = "set", var = "x", value = "{value}" }} ]\n'


# -- constants ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text, literal, column", [("1e400", "1e400", 1), ("y * -2E999", "2E999", 6),
                                                   ("  min(1.5e309, y)", "1.5e309", 7)])
def test_a_constant_beyond_the_float_range_is_refused(text, literal, column):
    assert float(literal) == float("inf")             # what Python would have made of it
    with pytest.raises(RuleSyntaxError) as info:
        parse(text, Where("r.toml", "grow", "then[0].value"))
    assert str(info.value) == (f"r.toml: rule 'grow', key 'then[0].value': the number {literal} overflows to "
                               f"inf (numbers must be finite) at column {column} of expression {text!r}")
    assert (info.value.offset, info.value.rule, info.value.key) == (column, "grow", "then[0].value")


def test_a_rule_file_with_an_overflowing_constant_does_not_load():
    with pytest.raises(RuleSyntaxError) as info:
        rulefile.loads(one_rule("1", when="y < 1e400"), "r.toml")
    assert str(info.value) == ("r.toml: rule 'grow', key 'when': the number 1e400 overflows to inf "
                               "(numbers must be finite) at column 5 of expression 'y < 1e400'")
    with pytest.raises(RuleSyntaxError, match=r"key 'then\[0\]\.value': the number 1e400 overflows"):
        rulefile.loads(one_rule("1e400"), "r.toml")


def test_a_python_rule_with_an_overflowing_constant_is_refused():
    with pytest.raises(RuleSyntaxError) as info:
        Rule("grow", when="y > -1e500", then=Set("x", 1))
    assert str(info.value) == ("rule 'grow', key 'when': the number 1e500 overflows to inf (numbers must be "
                               "finite) at column 6 of expression 'y > -1e500'")
    with pytest.raises(RuleSyntaxError) as info:
        Set("x", "9e999")
    assert str(info.value) == ("the number 9e999 overflows to inf (numbers must be finite) at column 1 of "
                               "expression '9e999'")


def test_the_largest_floats_still_parse():
    assert parse("1.7976931348623157e308 - 1e308").evaluate(None) == 1.7976931348623157e308 - 1e308
    assert parse("1e-400").evaluate(None) == 0.0


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -np.inf, np.float32("nan"), np.float64("inf")])
def test_set_refuses_a_non_finite_constant(value):
    with pytest.raises(RuleError) as info:
        Set("x", value)
    assert str(info.value) == (f"set 'x': value must be a finite number, a boolean or an expression; "
                               f"got {value!r}")


@pytest.mark.parametrize("value", [1e308, -3, np.float32(2.5), True])
def test_set_keeps_finite_constants(value):
    interp = interpreter()
    adjust(interp, RuleSet([Rule("grow", then=Set("x", value))]))
    assert interp.monitor["x"] == value


# -- values computed at run time ------------------------------------------------------------

@pytest.mark.parametrize("y, expr, got", [(10, "y * 1e308", "inf"), (-1e200, "y * 1e200", "-inf"),
                                          (float("inf"), "y - y", "nan")])
def test_a_set_that_computes_a_non_finite_number_disables_its_rule(y, expr, got):
    interp = interpreter()
    interp.monitor.set("y", y)
    rules = RuleSet([Rule("grow", when="y != 0", then=Set("x", expr)), Rule("ok", then=Set("z", 1))])
    assert adjust(interp, rules) is None                       # (no graph to change)
    grow = rules.get("grow")
    assert not grow.enabled
    assert grow.error == f"RuleError: set 'x': {expr} gave {got}, not a finite number"
    assert interp.monitor.get("x") is None and interp.monitor["z"] == 1
    assert not interp.due((), rules)                           # and it is over: nothing loops


def test_a_rule_files_set_that_overflows_names_file_rule_key_and_variable():
    (rule,) = rulefile.loads(one_rule("y * y"), "r.toml")
    interp, rules = interpreter(), RuleSet([rule])
    interp.monitor.set("y", 1e200)
    adjust(interp, rules)
    assert rules.get("grow").error == ("RuleError: r.toml: rule 'grow', key 'then[0].value': set 'x': "
                                       "y * y gave inf, not a finite number")
    assert interp.monitor.get("x") is None


def test_a_finite_computed_value_is_set():
    interp = interpreter()
    interp.monitor.set("y", 1e300)
    rules = RuleSet([Rule("grow", then=Set("x", "y * 100 - 1e302"))])
    adjust(interp, rules)
    assert rules.get("grow").enabled and interp.monitor["x"] == 1e300 * 100 - 1e302


# -- a nan the monitor holds -----------------------------------------------------------------

def test_a_nan_variable_does_not_make_every_safe_point_due():
    interp = interpreter()
    interp.monitor.set("load", float("nan"))
    rules = RuleSet([Rule("busy", when="load > 0.5", then=Set("busy", True))])
    adjust(interp, rules)
    revision = interp.monitor.revision
    assert not interp.due((), rules)                           # was due at every safe point
    adjust(interp, rules)
    assert interp.monitor.revision == revision and np.isnan(interp.monitor["load"])
    assert interp.monitor.get("busy") is None                  # nan > 0.5 is False, as in Python
