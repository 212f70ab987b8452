"""Rule files in TOML: what they load into, and errors with file, line and column."""
from pathlib import Path

import numpy as np
import pytest

import hetflow
from hetflow.errors import RuleError, RuleSyntaxError
from hetflow.ir import (AddRule, Chain, Fuse, Interpreter, Monitor, NodePattern, Partition, RuleSet, Set, Split,
                        Substitute, Topology, graph)
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
    return err


def test_toml_syntax_error_position():
    err = _error('[[rule]]\nname = "a"\nwhen = "x > 1\n')
    assert (err.lineno, err.offset) == (3, 14)
    assert str(err).startswith("rules.toml:3:14:")


def test_expression_error_position_in_file():
    err = _error('[[rule]]\nname = "a"\nwhen   =   "gpu.utilization >> 0.5"\nthen = [{action = "fuse"}]\n')
    # The second '>' of '>>' is the 30th character of line 3.
    assert (err.lineno, err.offset) == (3, 30)
    assert "expected a value" in str(err)
    assert err.text == 'when   =   "gpu.utilization >> 0.5"'


def test_expression_error_inside_a_share():
    err = _error('[[rule]]\nname = "p"\nthen = [\n  { action = "partition", shares = { gpu = "1 - - ", cpu = 1 } },\n]\n')
    assert (err.lineno, err.offset) == (4, 51)


def test_expression_error_in_an_added_rule():
    err = _error('[[rule]]\nname = "outer"\n[[rule.then]]\naction = "add_rule"\n'
                 'rule = { name = "inner", when = "a and", then = [{ action = "fuse" }] }\n')
    assert (err.lineno, err.offset) == (5, 39)


@pytest.mark.parametrize("text, line, fragment", [
    ('title = "x"\n', 1, "unknown top-level key 'title'"),
    ('rule = 3\n', 1, "must be an array of tables"),
    ('[[rule]]\nwhen = "true"\nthen = [{action = "fuse"}]\n', 1, "a rule needs a name"),
    ('[[rule]]\nname = "a"\n', 2, "needs 'then'"),
    ('[[rule]]\nname = "a"\nthen = []\n', 3, "'then' is empty"),
    ('[[rule]]\nname = "a"\nthen = [{action = "explode"}]\n', 3, "unknown action 'explode'"),
    ('[[rule]]\nname = "a"\nthen = [{action = "fuse", force = true}]\n', 3, "takes no key 'force'"),
    ('[[rule]]\nname = "a"\ncolour = 1\nthen = [{action = "fuse"}]\n', 3, "unknown rule key 'colour'"),
    ('[[rule]]\nname = "a"\npriority = "high"\nthen = [{action = "fuse"}]\n', 3, "priority must be an integer"),
    ('[[rule]]\nname = "a"\nmatch = { op = "forall", colour = 1 }\nthen = [{action = "fuse"}]\n', 3,
     "unknown match key 'colour'"),
    ('[[rule]]\nname = "a"\nmatch = { chain = 0 }\nthen = [{action = "fuse"}]\n', 3, "match.chain must be >= 1"),
    ('[[rule]]\nname = "a"\nmatch = { max_chain = 3 }\nthen = [{action = "fuse"}]\n', 3, "needs match.chain"),
    ('[[rule]]\nname = "a"\nmatch = { min_size = true }\nthen = [{action = "fuse"}]\n', 3, "not a boolean"),
    ('[[rule]]\nname = "a"\nthen = [{action = "set", var = "x"}]\n', 3, "set needs var and value"),
    ('[[rule]]\nname = "a"\nthen = [{action = "substitute", map = { k = 3 }}]\n', 3, "must be a string"),
    ('[[rule]]\nname = "a"\nthen = [{action = "fuse"}]\n[[rule]]\nname = "a"\nthen = [{action = "fuse"}]\n',
     5, "duplicate rule name 'a'"),
])
def test_bad_rule_files(text, line, fragment):
    err = _error(text)
    assert err.lineno == line, str(err)
    assert fragment in str(err)


def test_missing_file(tmp_path):
    with pytest.raises(RuleError, match="cannot read rule file"):
        RuleSet.load(tmp_path / "none.toml")
