"""Integers in rule files are bounded where they are written: TOML integers and integer
literals of expressions beyond MAX_INT_BITS are refused when the file loads, naming the
file, the rule and the key (never a raw ValueError or OverflowError, nor a later hang)."""
import re

import pytest

from hetflow.errors import RuleSyntaxError
from hetflow.ir import rulefile
from hetflow.ir.expressions import MAX_INT_BITS, parse


def _set_rule(value: str) -> str:
    return f'[[rule]]\nname = "grow"\nthen = [{{ action = "set", var = "x", value = {value} }}]\n'


@pytest.mark.parametrize("digits", [400, 4000, 100_000])
def test_a_long_integer_literal_in_an_expression_is_refused_naming_rule_and_key(digits):
    with pytest.raises(RuleSyntaxError) as info:
        rulefile.loads(_set_rule('"' + "1" * digits + ' + 1"'), "r.toml")
    msg = str(info.value)
    assert msg.startswith("r.toml: rule 'grow', key 'then[0].value': ")
    assert f"{MAX_INT_BITS} bits" in msg
    assert len(msg) < 1000  # the expression is quoted cut, not whole
    assert (info.value.rule, info.value.key) == ("grow", "then[0].value")


def test_an_integer_literal_of_at_most_max_int_bits_is_kept():
    assert parse(str(2 ** MAX_INT_BITS - 1) + " // 2").evaluate(None) == (2 ** MAX_INT_BITS - 1) // 2


def test_a_long_literal_in_when_names_the_when_key():
    text = '[[rule]]\nname = "w"\nwhen = "x > ' + "9" * 500 + '"\nthen = [{ action = "fuse" }]\n'
    with pytest.raises(RuleSyntaxError, match=r"^r.toml: rule 'w', key 'when': the integer literal of \d+ bits"):
        rulefile.loads(text, "r.toml")


@pytest.mark.parametrize("digits", [400, 4000, 100_000])
def test_a_long_toml_integer_is_refused_naming_rule_and_key(digits):
    with pytest.raises(RuleSyntaxError) as info:
        rulefile.loads(_set_rule("1" * digits), "r.toml")
    assert str(info.value).startswith("r.toml: rule 'grow', key 'then[0].value': ")
    assert f"{MAX_INT_BITS} bits" in str(info.value)


@pytest.mark.parametrize("table, key", [
    ('priority = {n}\nthen = [{{ action = "fuse" }}]', "priority"),
    ('match = {{ op = "forall", chain = {n} }}\nthen = [{{ action = "fuse" }}]', "match.chain"),
    ('match = {{ min_size = {n} }}\nthen = [{{ action = "fuse" }}]', "match.min_size"),
    ('match = {{ place = {n} }}\nthen = [{{ action = "fuse" }}]', "match.place"),
    ('then = [{{ action = "split", pieces = {n} }}]', "then[0].pieces"),
    ('then = [{{ action = "partition", shares = {{ cpu0 = {n} }} }}]', "then[0].shares.cpu0"),
])
def test_every_integer_key_is_bounded(table, key):
    text = '[[rule]]\nname = "b"\n' + table.format(n="7" * 400) + "\n"
    with pytest.raises(RuleSyntaxError, match=rf"^r.toml: rule 'b', key {re.escape(repr(key))}: "
                                              r"an integer of \d+ bits is beyond"):
        rulefile.loads(text, "r.toml")


@pytest.mark.parametrize("table", [
    'match = {{ min_size = {n} }}\nthen = [{{ action = "fuse" }}]',
    'then = [{{ action = "split", pieces = {n} }}]',
    'then = [{{ action = "partition", shares = {{ cpu0 = {n} }} }}]',
])
def test_an_integer_too_large_for_a_float_is_a_rule_error(table):
    # 1024 bits: within the bound, beyond a float (math.isfinite raised OverflowError)
    text = '[[rule]]\nname = "f"\n' + table.format(n=2 ** 1024 - 1) + "\n"
    with pytest.raises(RuleSyntaxError, match=r"^r.toml: rule 'f', key "):
        rulefile.loads(text, "r.toml")


def test_a_long_toml_integer_in_a_rule_added_by_a_rule_names_the_outer_rule():
    text = ('[[rule]]\nname = "first"\nthen = [{ action = "fuse" }]\n'
            '[[rule]]\nname = "outer"\nthen = [{ action = "add_rule", rule = { name = "inner", priority = '
            + "3" * 5000 + ', then = [{ action = "fuse" }] } }]\n')
    with pytest.raises(RuleSyntaxError, match=r"^r.toml: rule 'outer', key 'then\[0\].rule.priority': an integer of more"):
        rulefile.loads(text, "r.toml")
