"""Rule files saved with a byte-order mark load; non-finite numbers are refused where they load."""
import pytest

from hetflow.errors import RuleSyntaxError
from hetflow.ir import actions as A, rulefile

RULES = '[[rule]]\nname = "mark"\nthen = [ { action = "set", var = "x", value = 2.5 } ]\n'


def test_a_rule_file_with_a_byte_order_mark_loads_as_without(tmp_path):
    plain, marked = tmp_path / "plain.toml", tmp_path / "marked.toml"
    plain.write_text(RULES, encoding="utf-8")
    marked.write_text(RULES, encoding="utf-8-sig")     # what Windows editors save
    assert marked.read_bytes().startswith(b"\xef\xbb\xbf")
    (got,), (want,) = rulefile.load(marked), rulefile.load(plain)
    assert (got.name, got.actions) == (want.name, want.actions) == ("mark", (A.Set("x", 2.5),))


def test_a_byte_order_mark_does_not_shift_where_a_bad_byte_is(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_bytes(b"\xef\xbb\xbf" + RULES.encode() + b"# \xff\n")
    with pytest.raises(RuleSyntaxError) as info:
        rulefile.load(path)
    assert str(info.value) == f"{path}:4:3: the rule file is not UTF-8 (byte 0xff)"


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "+nan"])
def test_set_refuses_a_non_finite_value(value):
    text = f'[[rule]]\nname = "mark"\nthen = [ {{ action = "set", var = "x", value = {value} }} ]\n'
    with pytest.raises(RuleSyntaxError) as info:
        rulefile.loads(text, "r.toml")
    got = float(value)
    assert str(info.value) == (f"r.toml: rule 'mark', key 'then[0].value': must be a finite number, "
                               f"a boolean or an expression; got {got!r}")
    assert (info.value.rule, info.value.key) == ("mark", "then[0].value")


@pytest.mark.parametrize("value, kept", [("1e308", 1e308), ("-3", -3), ("false", False), ('"x + 1"', None)])
def test_set_keeps_finite_numbers_booleans_and_expressions(value, kept):
    text = f'[[rule]]\nname = "mark"\nthen = [ {{ action = "set", var = "y", value = {value} }} ]\n'
    (rule,) = rulefile.loads(text, "r.toml")
    (action,) = rule.actions
    if kept is None:
        assert action.value.text == "x + 1"
    else:
        assert action.value == kept and type(action.value) is type(kept)


@pytest.mark.parametrize("key", ["min_size", "max_size"])
@pytest.mark.parametrize("value", ["inf", "nan"])
def test_match_sizes_are_finite(key, value):
    text = f'[[rule]]\nname = "big"\nmatch = {{ {key} = {value} }}\nthen = [ {{ action = "fuse" }} ]\n'
    with pytest.raises(RuleSyntaxError) as info:
        rulefile.loads(text, "r.toml")
    assert str(info.value) == f"r.toml: rule 'big', key 'match.{key}': must be a number >= 0 and finite; got {value}"
