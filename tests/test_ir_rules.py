"""Rules, patterns, actions and the interpreter's evaluation (rounds, errors, loops)."""
import functools
import logging

import numpy as np
import pytest

import hetflow
from hetflow.errors import RuleError, RuleSyntaxError
from hetflow.ir import (AddRule, Chain, ChangeRule, Compile, Interpreter, Monitor, NodePattern, Partition,
                        RemoveRule, Rule, RuleSet, Set, Split, Substitute, Topology, TopologyPattern, graph,
                        runner, simulated_device)
from hetflow.platform.devices import get_device


@hetflow.kernel
def scale(i, a, x, out):
    out[i] = a * x[i]


@hetflow.kernel
def my_axpy(i, a, x, y, out):
    out[i] = a * x[i] + y[i]


@hetflow.kernel
def rowsum(i, j, x, out):
    out[i, j] = x[i, j] + i * 10 + j


def machine(*extra, nodes=1):
    """An interpreter over cpu0 plus simulated devices, with no sampled sources."""
    topo = Topology([get_device("cpu0"), *extra], nodes=nodes)
    return Interpreter(Monitor(topo, sources=[]))


def one_launch(interp=None, n=16, kernel=scale):
    x, y = np.arange(n, dtype=float), np.zeros(n)
    with graph(interpreter=interp or machine()) as g:
        hetflow.forall(n, kernel, 2.0, x, y)
    return g, x, y


# -- rules and rule sets -------------------------------------------------------------------

def test_rule_set_editing_and_priority_order():
    a = Rule("a", then=Set("x", 1), priority=1)
    b = Rule("b", then=Set("x", 2), priority=5)
    c = Rule("c", then=Set("x", 3), priority=1)
    rules = RuleSet([a, b, c])
    assert rules.names() == ["b", "a", "c"]
    assert "a" in rules and len(rules) == 3
    rules.remove("a")
    rules.replace(Rule("c", then=Set("x", 4), priority=9))
    assert rules.names() == ["c", "b"]
    copy = rules.copy()
    copy.get("c").disable("test")
    assert rules.get("c").enabled
    with pytest.raises(RuleError, match="already has a rule named 'b'"):
        rules.add(Rule("b", then=Set("y", 1)))
    with pytest.raises(RuleError, match="no rule named 'zz' \\(rules: c, b\\)"):
        rules.remove("zz")
    with pytest.raises(RuleError, match="holds Rule objects"):
        rules.add("rule")


@pytest.mark.parametrize("kwargs, fragment", [
    ({"name": ""}, "non-empty name"),
    ({"name": "r", "then": ()}, "has no action"),
    ({"name": "r", "then": Set("x", 1), "priority": 1.5}, "priority must be an integer"),
    ({"name": "r", "then": Set("x", 1), "when": [NodePattern(), Chain()]}, "at most one graph pattern"),
    ({"name": "r", "then": Set("x", 1), "when": 3}, "cannot use 3 as a rule predicate"),
    ({"name": "r", "then": "fuse"}, "cannot use 'fuse' as a rule action"),
])
def test_bad_rules(kwargs, fragment):
    with pytest.raises(RuleError, match=fragment):
        Rule(**kwargs)


def test_bad_expression_in_a_rule():
    with pytest.raises(RuleSyntaxError, match="column 5"):
        Rule("r", when="a > > 1", then=Set("x", 1))


def test_rule_replace():
    rule = Rule("r", when="x > 1", then=Set("y", 1), priority=2)
    new = rule.replace(priority=7, when="x > 2")
    assert (new.priority, new.conditions[0].expr.text, rule.priority) == (7, "x > 2", 2)
    with pytest.raises(RuleError, match="cannot change name"):
        rule.replace(name="s")


# -- patterns -------------------------------------------------------------------------------

def test_node_patterns_on_functions_and_parameters():
    x32, y = np.ones(100, dtype=np.float32), np.zeros(100, dtype=np.float32)
    with graph(interpreter=machine()) as g:
        hetflow.forall(100, scale, 2.0, x32, y)
        hetflow.forall(10, my_axpy, 1.0, x32, x32, y)
    first, second = g.current.nodes
    topo = g.interpreter.topology
    assert NodePattern(kernel="scale").test(first, topo)
    assert NodePattern(kernel=("scale", "my_axpy"), dtype="float32").test(second, topo)
    assert not NodePattern(dtype="float64").test(first, topo)
    assert NodePattern(min_size=50).test(first, topo) and not NodePattern(min_size=50).test(second, topo)
    assert not NodePattern(max_size=50).test(first, topo)
    assert NodePattern(device_kinds=("cpu",)).test(first, topo)
    assert not NodePattern(device_kinds=("gpu",)).test(first, topo)
    assert NodePattern(where=lambda n: n.size == 10).test(second, topo)
    assert NodePattern(attrs={"place": None}).test(first, topo)


def test_topology_patterns():
    interp = machine(simulated_device("gpu", 0), simulated_device("gpu", 1), nodes=3)
    g, _, _ = one_launch(interp)
    ctx = type("Ctx", (), {"topology": interp.topology})()
    assert TopologyPattern(at_least={"gpu": 2, "node": 3})(ctx)
    assert not TopologyPattern(at_most={"device": 2})(ctx)


def test_chain_pattern_groups_producer_consumer_runs():
    x = np.ones(8)
    with graph(interpreter=machine()) as g:
        a, b, c = hetflow.empty(8), hetflow.empty(8), np.zeros(8)
        hetflow.forall(8, scale, 1.0, x, a)     # 0
        hetflow.forall(8, scale, 1.0, x, b)     # 1: independent of 0
        hetflow.forall(8, scale, 1.0, a, c)     # 2: consumes 0
    launches = [n for n in g.current.nodes if n.op == "forall"]
    found = list(Chain().matches(g.current.nodes, g.interpreter.topology))
    assert [m.ids for m in found] == [(launches[0].id, launches[2].id)]


# -- actions ----------------------------------------------------------------------------------

def test_split_cuts_and_recuts_a_launch():
    x = np.arange(24.0).reshape(6, 4)
    y = np.zeros((6, 4))
    with graph(interpreter=machine(nodes=3)) as g:
        hetflow.forall((6, 4), rowsum, x, y)
    rules = RuleSet([Rule("split", match=NodePattern(op="forall"), then=Split())])
    g.run(rules=rules)
    pieces = g.current.nodes
    assert [n.attrs["piece"] for n in pieces] == [(0, 3), (1, 3), (2, 3)]
    assert [n.attrs["place"] for n in pieces] == [0, 1, 2]
    assert [n.extent for n in pieces] == [(2, 4)] * 3
    expected = x + np.arange(6)[:, None] * 10 + np.arange(4)[None, :]
    np.testing.assert_array_equal(y, expected)
    g.monitor.inject("node_added")            # 4 nodes: cut again from the original launch
    y[:] = 0
    g.run(rules=rules)
    assert [n.extent[0] for n in g.current.nodes] == [1, 2, 1, 2]
    np.testing.assert_array_equal(y, expected)
    assert g.interpreter.cache.hits >= 1      # the offset kernel was reused


def test_substitute_by_name_with_the_library():
    n = 32
    x, y, out = np.arange(n, dtype=float), np.ones(n), np.zeros(n)
    with graph(interpreter=machine()) as g:
        hetflow.forall(n, my_axpy, 3.0, x, y, out)
    g.run(rules=RuleSet([Rule("lib", match=NodePattern(op="forall"), then=Substitute({"my_axpy": "axpy"}))]))
    node = g.current.nodes[0]
    assert node.kernel is hetflow.library.axpy and node.attrs["substituted"] == "my_axpy"
    np.testing.assert_array_equal(out, 3.0 * x + y)


def test_substitute_an_operation():
    x = np.arange(5.0)
    with graph(interpreter=machine()) as g:
        total = g.record("reduce", fn=sum, args=(x,))
    g.run(rules=RuleSet([Rule("np", match=NodePattern(op="reduce"), then=Substitute({"reduce": np.sum}))]))
    assert g.current.nodes[0].attrs["fn"] is np.sum and float(total) == 10.0


def test_substitute_errors_disable_the_rule():
    g, x, y = one_launch()
    rules = RuleSet([Rule("bad", match=NodePattern(op="forall"), then=Substitute({"scale": "axpy"})),
                     Rule("missing", match=NodePattern(op="forall"), then=Substitute({"scale": "nope"}))])
    g.run(rules=rules)
    assert "takes 4 data arguments, 'scale' takes 3" in rules.get("bad").error
    assert "no library kernel 'nope'" in rules.get("missing").error
    assert len(g.versions) == 1
    np.testing.assert_array_equal(y, 2.0 * x)


def test_partition_with_expressions_kinds_and_missing_devices():
    interp = machine(simulated_device("gpu", 8), simulated_device("gpu", 9))
    g, x, y = one_launch(interp)
    interp.monitor.set("gpu.utilization", 0.75)
    shares = {"cpu": "gpu.utilization", "gpu": "1 - gpu.utilization", "fpga": 1.0}
    g.run(rules=RuleSet([Rule("p", match=NodePattern(op="forall"), then=Partition(shares))]))
    node = g.current.nodes[0]
    assert node.attrs["devices"] == ("cpu0", "gpu8", "gpu9")
    assert node.attrs["shares"] == {"cpu0": 0.75, "gpu8": 0.125, "gpu9": 0.125}
    np.testing.assert_array_equal(y, 2.0 * x)   # the simulated GPUs are planned for, not run on


def test_partition_evenly_and_bad_shares():
    interp = machine(simulated_device("cpu", 1))
    g, _, _ = one_launch(interp)
    rules = RuleSet([Rule("even", match=NodePattern(op="forall"), then=Partition(kinds=["cpu"])),
                     Rule("neg", match=NodePattern(op="forall"), then=Partition({"cpu0": "0 - 1"}), priority=-1)])
    g.run(rules=rules)
    assert g.current.nodes[0].attrs["shares"] == {"cpu0": 0.5, "cpu1": 0.5}
    assert "share of 'cpu0' must be a finite number >= 0; got -1" in rules.get("neg").error
    for bad in (-1, float("inf"), float("nan"), True):   # constants are checked when the action is made
        with pytest.raises(RuleError, match="share of 'cpu0' must be a finite number >= 0"):
            Partition({"cpu0": bad})


def test_compile_produces_executables_once(tmp_path, monkeypatch):
    monkeypatch.setenv("HETFLOW_CACHE_DIR", str(tmp_path))
    g, x, y = one_launch()
    rules = RuleSet([Rule("compile", match=NodePattern(op="forall"), then=Compile(kinds=["cpu"]))])
    g.run(rules=rules)
    assert g.current.nodes[0].attrs["compiled"] == ("cpu0",)
    stored = hetflow.platform.repository.repository().entries(scale)
    assert len(stored) == 1 and stored[0].name.startswith("cpu-1d-")
    assert (stored[0] / "module.py").exists()
    misses = g.interpreter.cache.misses
    g.run(rules=RuleSet())
    g.run(rules=rules)                           # derived again: the executable is reused
    assert g.interpreter.cache.misses == misses and g.interpreter.cache.hits >= 1
    np.testing.assert_array_equal(y, 2.0 * x)


def test_set_triggers_further_rules():
    g, _, _ = one_launch()
    rules = RuleSet([
        Rule("count-up", when="defined('level') and level < 3", then=Set("level", "level + 1")),
        Rule("start", when="not defined('level')", then=Set("level", 0)),
        Rule("done", when="level == 3", then=Set("finished", True)),
    ])
    g.run(rules=rules)
    assert (g.monitor["level"], g.monitor["finished"]) == (3, True)


def test_rules_add_remove_and_change_rules():
    g, _, _ = one_launch()
    late = Rule("late", when="stage == 1", then=Set("stage", 2))
    rules = RuleSet([
        Rule("adder", when="not defined('stage')", then=[AddRule(late), Set("stage", 1)]),
        Rule("remover", when="stage == 2", then=[RemoveRule("adder"), ChangeRule("late", priority=5, enabled=False)]),
    ])
    g.run(rules=rules)
    assert rules.names() == ["late", "remover"]
    assert rules.get("late").priority == 5 and not rules.get("late").enabled
    assert g.monitor["stage"] == 2


def test_change_rule_of_a_missing_rule_fails():
    g, _, _ = one_launch()
    rules = RuleSet([Rule("changer", then=ChangeRule("ghost", priority=1))])
    g.run(rules=rules)
    assert "no rule named 'ghost'" in rules.get("changer").error


def test_callbacks_rewrite_or_leave_alone():
    g, x, y = one_launch()

    def double_scale(ctx, match):
        node = match.node
        if node.args[0] == 4.0:
            return None                          # already rewritten: no rewrite
        return node.evolve(args=(4.0,) + node.args[1:])

    rules = RuleSet([Rule("double", match=NodePattern(op="forall"), then=double_scale)])
    g.run(rules=rules)
    assert len(g.versions) == 2 and rules.get("double").enabled
    np.testing.assert_array_equal(y, 4.0 * x)
    bad = RuleSet([Rule("bad", match=NodePattern(op="forall"), then=lambda ctx, m: 42)])
    g.run(rules=bad)
    assert "returned 42; expected None, a Node or a list of Nodes" in bad.get("bad").error


# -- the interpreter ---------------------------------------------------------------------------

def test_failing_action_is_undone_and_disabled(caplog):
    g, x, y = one_launch()

    def explode(ctx, match):
        raise ValueError("boom")

    rules = RuleSet([
        Rule("partition", match=NodePattern(op="forall"), then=[Partition({"cpu": 1}), explode]),
        Rule("ok", then=Set("seen", 1), priority=-1),
    ])
    with caplog.at_level(logging.ERROR, logger="hetflow.ir"):
        g.run(rules=rules)
    assert not rules.get("partition").enabled
    assert rules.get("partition").error == "ValueError: boom"
    assert "rule partition raised and was disabled" in caplog.text
    assert len(g.versions) == 1 and "devices" not in g.current.nodes[0].attrs   # partition undone
    assert g.monitor["seen"] == 1                                                # others went on
    np.testing.assert_array_equal(y, 2.0 * x)


def test_rules_that_keep_triggering_each_other_stop():
    g, _, _ = one_launch(Interpreter(Monitor(Topology([get_device("cpu0")]), sources=[]), max_rounds=5))
    g.monitor.set("x", 0)
    g.monitor.set("y", 0)
    rules = RuleSet([Rule("ping", when="x <= y", then=Set("x", "y + 1")),
                     Rule("pong", when="y <= x", then=Set("y", "x + 1")),
                     Rule("calm", then=Set("z", 1))])
    with pytest.raises(RuleError, match="for 5 rounds without settling: ping, pong"):
        g.run(rules=rules)
    assert g.monitor.get("z") is None          # nothing of the failed evaluation was kept


def test_unknown_variables_do_not_fire(caplog):
    g, _, _ = one_launch()
    rules = RuleSet([Rule("waits", when="gpu7.utilization > 0.5", then=Set("fired", True))])
    with caplog.at_level(logging.WARNING, logger="hetflow.ir"):
        g.run(rules=rules)
    assert g.monitor.get("fired") is None and rules.get("waits").enabled
    assert "reads gpu7.utilization, which is not set" in caplog.text
    g.monitor.set("gpu7.utilization", 0.9)
    g.run(rules=rules)
    assert g.monitor["fired"] is True


def test_attached_rules_see_only_their_node():
    x, y, z = np.ones(4), np.zeros(4), np.zeros(4)
    with graph(interpreter=machine()) as g:
        hetflow.forall(4, scale, 2.0, x, y)
        hetflow.forall(4, scale, 3.0, x, z)
        g.attach(Rule("pin", then=Partition({"cpu0": 1})))
    g.run(rules=RuleSet())
    first, second = g.current.nodes
    assert "devices" not in first.attrs and second.attrs["devices"] == ("cpu0",)
    assert second.rules[0].name == "pin"


def test_evaluation_happens_only_when_something_changed():
    g, _, _ = one_launch()
    calls = []
    rules = RuleSet([Rule("watch", when=[lambda ctx, m: calls.append(1) or False, "level > 1"],
                          then=Set("x", 1))])
    g.monitor.set("level", 0)
    g.run(rules=rules, iterations=3)
    assert len(calls) == 1
    g.monitor.set("level", 5)
    g.run(rules=rules)
    assert len(calls) == 2


def test_local_interpreters_need_a_place_and_rules():
    with pytest.raises(RuleError, match="needs place= and its own rules="):
        machine().add_child(machine())
    with pytest.raises(RuleError, match="max_rounds must be >= 1"):
        Interpreter(Monitor(sources=[]), max_rounds=0)


def test_default_rules_drop_a_device_that_keeps_running_nothing():
    # gpu8 is planned for, not run on, so only the counts given here reach the monitor
    interp = machine(simulated_device("gpu", 8))
    g, x, y = one_launch(interp)
    rules = RuleSet.default()
    rules.add(Rule("both", match=NodePattern(op="forall", attrs={"devices": None}),
                   then=Partition(kinds=["cpu", "gpu"]), priority=10))
    g.run(rules=rules)
    assert g.current.nodes[0].attrs["devices"] == ("cpu0", "gpu8")
    count = functools.partial(runner._count_idle, interp.monitor, scale.name)
    for ran in ({"cpu0": 16, "gpu8": 0}, {"cpu0": 16, "gpu8": 0}, {"cpu0": 8, "gpu8": 8}):
        count(ran)  # a device that ran some indices starts again from zero
    for _ in range(runner.IDLE_RUNS - 1):
        count({"cpu0": 16, "gpu8": 0})
    count({"cpu0": 0, "gpu8": 0})  # nothing ran (an empty launch): not counted
    g.run(rules=rules)
    assert g.current.nodes[0].attrs["devices"] == ("cpu0", "gpu8")
    count({"cpu0": 16, "gpu8": 0})
    assert interp.monitor["devices.idle"] == 1
    y[:] = 0
    g.run(rules=rules)
    node = g.current.nodes[0]
    assert "drop-idle-devices" in g.current.reason
    assert node.attrs["devices"] == ("cpu0",) and node.attrs["shares"] == {"cpu0": 1.0}
    np.testing.assert_array_equal(y, 2.0 * x)
    count({"cpu0": 10, "gpu8": 6})  # it ran again (placed there by another rule)
    assert interp.monitor["devices.idle"] == 0
