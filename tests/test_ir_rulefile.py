"""Rule files in TOML: what they load into, and errors with file, line and column."""
from pathlib import Path

import numpy as np
import pytest

import hetflow
from hetflow.errors import RuleError, RuleSyntaxError
from hetflow.ir import (AddRule, Chain, Fuse, Interpreter, Monitor, NodePattern, Partition, RuleSet, Set, Split,
                        Substitute, Topology, graph)
from hetflow.ir.expressions import Environment
from hetflow.ir.rulefile import loads
from hetflow.platform.devices import get_device

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "rules" / "fuse_and_repartition.toml"


@hetflow.kernel
def twice(i, x, out):
    out[i] = 2.0 * x[i]


@hetflow.kernel
def thrice(i, x, out):
    out[i] = 3.0 * x[i]


def test_example_file_loads():
    rules = RuleSet.load(EXAMPLE)
    assert rules.names() == ["fuse-gpu-chains", "watch-gpu-sharing", "rebalance-by-throughput"]
    fuse = rules.get("fuse-gpu-chains")
    assert fuse.pattern == Chain(NodePattern(op="forall", device_kinds=("gpu",)), min_len=2)
    assert fuse.actions == (Fuse(),) and fuse.priority == 110
    watch = rules.get("watch-gpu-sharing")
    added = [a.rule for a in watch.actions if isinstance(a, AddRule)]
    assert [r.name for r in added] == ["share-busy-gpu", "gpu-free-again"]
    assert isinstance(added[0].actions[0], Partition)
    assert isinstance(watch.actions[-1], Set)


def test_all_actions_and_match_keys(tmp_path):
    path = tmp_path / "all.toml"
    path.write_text('''
[[rule]]
name = "everything"
priority = -3
enabled = false
when = "input.size > 1e6"
match = { op = ["forall"], kernel = "twice", dtype = "float64", min_size = 10, max_size = 1e9, place = 0 }

[[rule.then]]
action = "split"
pieces = 4
place = false

[[rule.then]]
action = "substitute"
map = { twice = "thrice" }

[[rule.then]]
action = "compile"
kinds = "cpu"

[[rule.then]]
action = "remove_rule"
name = "x"

[[rule.then]]
action = "change_rule"
name = "y"
priority = 2
enabled = true
when = "x > 1"
''')
    rule = RuleSet.load(path, kernels={"thrice": thrice}).get("everything")
    assert not rule.enabled and rule.priority == -3
    assert rule.pattern == NodePattern(op=("forall",), kernel="twice", dtype="float64", min_size=10,
                                       max_size=1e9, place=0)
    assert rule.conditions[0].expr.text == "input.size > 1e6"
    assert [type(a).__name__ for a in rule.actions] == ["Split", "Substitute", "Compile", "RemoveRule",
                                                         "ChangeRule"]
    assert rule.actions[0] == Split(pieces=4, place=False)
    assert rule.actions[1] == Substitute({"twice": "thrice"}, {"thrice": thrice})


def test_loaded_substitution_runs():
    rules = loads('''
[[rule]]
name = "use-thrice"
match = { kernel = "twice" }
then = [ { action = "substitute", map = { twice = "thrice" } } ]
''', kernels={"thrice": thrice})
    x, y = np.arange(4.0), np.zeros(4)
    with graph(interpreter=Interpreter(Monitor(Topology([get_device("cpu0")]), sources=[]))) as g:
        hetflow.forall(4, twice, x, y)
    g.run(rules=RuleSet(rules))
    np.testing.assert_array_equal(y, 3.0 * x)


def _error(text):
    with pytest.raises(RuleSyntaxError) as info:
        loads(text, "rules.toml")
    err = info.value
    assert err.filename == "rules.toml"
    assert str(err).startswith("rules.toml")
    return err


def test_toml_syntax_error_position():
    err = _error('[[rule]]\nname = "a"\nwhen = "x > 1\n')
    assert (err.lineno, err.offset) == (3, 14)
    assert str(err).startswith("rules.toml:3:14:")


def test_expression_error_names_rule_key_and_column():
    err = _error('[[rule]]\nname = "a"\nwhen   =   "gpu.utilization >> 0.5"\nthen = [{action = "fuse"}]\n')
    assert (err.rule, err.key, err.offset) == ("a", "when", 17)   # the '>>'
    assert str(err).startswith("rules.toml: rule 'a', key 'when': operator '>>' is not allowed")


def test_expression_error_inside_a_share():
    err = _error('[[rule]]\nname = "p"\nthen = [\n  { action = "fuse" },\n'
                 '  { action = "partition", shares = { gpu = "1 - - ", cpu = 1 } },\n]\n')
    assert (err.rule, err.key) == ("p", "then[1].shares.gpu")
    assert "incomplete expression" in str(err)


def test_expression_error_in_an_added_rule():
    err = _error('[[rule]]\nname = "outer"\n[[rule.then]]\naction = "add_rule"\n'
                 'rule = { name = "inner", when = "a and", then = [{ action = "fuse" }] }\n')
    assert (err.rule, err.key) == ("outer", "then[0].rule.when")


@pytest.mark.parametrize("text, rule, key, fragment", [
    ('title = "x"\n', None, None, "unknown top-level key 'title'"),
    ('rule = 3\n', None, None, "must be an array of tables"),
    ('[[rule]]\nwhen = "True"\nthen = [{action = "fuse"}]\n', 1, None, "rule #1: a rule needs a name"),
    ('[[rule]]\nname = "a"\n', "a", None, "needs 'then'"),
    ('[[rule]]\nname = "a"\nthen = []\n', "a", "then", "is empty"),
    ('[[rule]]\nname = "a"\nthen = [{action = "explode"}]\n', "a", "then[0].action", "unknown action 'explode'"),
    ('[[rule]]\nname = "a"\nthen = [{action = "fuse", force = true}]\n', "a", "then[0].force",
     "takes no key 'force'"),
    ('[[rule]]\nname = "a"\ncolour = 1\nthen = [{action = "fuse"}]\n', "a", None, "unknown rule key 'colour'"),
    ('[[rule]]\nname = "a"\npriority = "high"\nthen = [{action = "fuse"}]\n', "a", "priority",
     "must be an integer"),
    ('[[rule]]\nname = "a"\nmatch = { op = "forall", colour = 1 }\nthen = [{action = "fuse"}]\n', "a", "match",
     "unknown match key 'colour'"),
    ('[[rule]]\nname = "a"\nmatch = { chain = 0 }\nthen = [{action = "fuse"}]\n', "a", "match.chain",
     "must be >= 1"),
    ('[[rule]]\nname = "a"\nmatch = { chain = 3, max_chain = 2 }\nthen = [{action = "fuse"}]\n', "a",
     "match.max_chain", "must be >= match.chain (3)"),
    ('[[rule]]\nname = "a"\nmatch = { max_chain = 3 }\nthen = [{action = "fuse"}]\n', "a", "match.max_chain",
     "needs match.chain"),
    ('[[rule]]\nname = "a"\nmatch = { min_size = true }\nthen = [{action = "fuse"}]\n', "a", "match.min_size",
     "not a boolean"),
    ('[[rule]]\nname = "a"\nmatch = { max_size = -1 }\nthen = [{action = "fuse"}]\n', "a", "match.max_size",
     "must be a number >= 0"),
    ('[[rule]]\nname = "a"\nthen = [{action = "set", var = "x"}]\n', "a", "then[0]", "set needs var and value"),
    ('[[rule]]\nname = "a"\nthen = [{action = "substitute", map = { k = 3 }}]\n', "a", "then[0].map.k",
     "must be a string"),
    ('[[rule]]\nname = "a"\nthen = [{action = "fuse"}]\n[[rule]]\nname = "a"\nthen = [{action = "fuse"}]\n',
     2, None, "duplicate rule name 'a'"),
])
def test_bad_rule_files(text, rule, key, fragment):
    err = _error(text)
    assert (err.rule, err.key) == (rule, key), str(err)
    assert fragment in str(err)


@pytest.mark.parametrize("action, key, fragment", [
    ('{ action = "split", pieces = 1e9 }', "then[0].pieces", "pieces from 1 to 65536; got 1000000000.0"),
    ('{ action = "split", pieces = 0 }', "then[0].pieces", "pieces from 1 to 65536; got 0"),
    ('{ action = "split", pieces = 2.5 }', "then[0].pieces", "whole number of pieces"),
    ('{ action = "split", pieces = nan }', "then[0].pieces", "whole number of pieces"),
    ('{ action = "partition", shares = { gpu = -1 } }', "then[0].shares.gpu", "share of 'gpu' must be a finite number >= 0"),
    ('{ action = "partition", shares = { gpu = inf } }', "then[0].shares.gpu", "share of 'gpu' must be a finite number >= 0"),
    ('{ action = "set", var = "", value = 1 }', "then[0]", "set needs a variable name"),
])
def test_action_parameters_have_bounds(action, key, fragment):
    err = _error(f'[[rule]]\nname = "big"\nthen = [ {action} ]\n')
    assert (err.rule, err.key) == ("big", key)
    assert fragment in str(err)


def test_a_split_into_too_many_pieces_by_expression_disables_the_rule():
    rules = RuleSet(loads('[[rule]]\nname = "huge"\nmatch = { op = "forall" }\n'
                          'then = [ { action = "split", pieces = "count(\'node\') * 1e9" } ]\n'))
    x, y = np.arange(4.0), np.zeros(4)
    with graph(interpreter=Interpreter(Monitor(Topology([get_device("cpu0")]), sources=[]))) as g:
        hetflow.forall(4, twice, x, y)
    g.run(rules=rules)
    assert "pieces from 1 to 65536" in rules.get("huge").error and len(g.versions) == 1
    np.testing.assert_array_equal(y, 2.0 * x)


def _nested(depth):
    return "(" * depth + "x" + " + 1)" * depth + " > 0"


def test_deep_nesting_works_or_is_a_rule_error():
    rules = loads(f'[[rule]]\nname = "deep"\nwhen = "{_nested(100)}"\nthen = [ {{ action = "fuse" }} ]\n')
    assert rules[0].conditions[0].expr.evaluate(Environment({"x": -100}.__getitem__)) is False
    assert rules[0].conditions[0].expr.evaluate(Environment({"x": -99}.__getitem__)) is True
    for when in (_nested(1000), "not " * 5000 + "x", "-" * 100000 + "1 > 0", " + ".join(["1"] * 50000) + " > 0"):
        err = _error(f'[[rule]]\nname = "deeper"\nwhen = "{when}"\nthen = [ {{ action = "fuse" }} ]\n')
        assert (err.rule, err.key) == ("deeper", "when")


def test_missing_file(tmp_path):
    with pytest.raises(RuleError, match="cannot read rule file"):
        RuleSet.load(tmp_path / "none.toml")


def _many_rules(count):
    """``count`` rules, each with its own expressions (no two share a compiled form)."""
    return "".join(
        f'[[rule]]\nname = "r{k}"\npriority = {k % 5}\nwhen = "gpu.utilization > {k} and count(\'gpu\') > 0"\n'
        f'match = {{ op = "forall", chain = 2 }}\n'
        f'then = [ {{ action = "partition", shares = {{ cpu = "gpu.utilization * {k}", gpu = {k + 1} }} }} ]\n'
        for k in range(count))


def _calls(fn) -> int:
    """Python and C function calls made by ``fn()`` (the work done, independent of the
    machine's speed and load)."""
    import sys

    made = [0]

    def count(frame, event, arg):
        if event in ("call", "c_call"):
            made[0] += 1

    sys.setprofile(count)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return made[0]


def test_loading_is_linear_in_the_number_of_rules():
    from hetflow.ir import expressions

    # Compiled expressions are cached by text: other loads of these rules earlier in the
    # process (hetflow bench dir's rule-file section, run by the bench smoke test) would
    # make the small file's load a cache hit and the ratio meaningless.
    expressions._compiled.cache_clear()
    small, large = _many_rules(200), _many_rules(2000)
    work_small = _calls(lambda: RuleSet(loads(small)))
    work_large = _calls(lambda: RuleSet(loads(large)))
    # Ten times the rules: ten times the work (it was quadratic: a search of the text per
    # rule and key, and a scan of the rule set per added rule).
    assert work_large <= 10.5 * work_small, (work_small, work_large)


def test_ten_thousand_rules_load():
    rules = RuleSet(loads(_many_rules(10_000)))
    assert len(rules) == 10_000
    rule = rules.get("r9876")
    assert rule.conditions[0].expr.text == "gpu.utilization > 9876 and count('gpu') > 0"
    assert rule.pattern == Chain(NodePattern(op="forall"), min_len=2)
    assert dict(rule.actions[0].shares)["gpu"] == 9877
    assert rules.names()[:3] == ["r4", "r9", "r14"]    # priority 4 first, in file order


def test_rules_adding_rules_nested_deeply_is_a_rule_error():
    def nested(depth):
        rule = '{ name = "leaf", then = [ { action = "fuse" } ] }'
        for k in range(depth):
            rule = f'{{ name = "r{k}", then = [ {{ action = "add_rule", rule = {rule} }} ] }}'
        return f'[[rule]]\nname = "top"\nthen = [ {{ action = "add_rule", rule = {rule} }} ]\n'

    assert loads(nested(20))[0].actions[0].rule.name == "r19"
    with pytest.raises(RuleSyntaxError, match="nested too deeply"):
        loads(nested(2000), "rules.toml")
