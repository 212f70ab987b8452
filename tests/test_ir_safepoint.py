"""The steady safe point of g.run(): no rule work while nothing changed, and every change
the rules read still seen."""
import numpy as np

import hetflow
from hetflow.ir import Interpreter, Monitor, NodePattern, Partition, Rule, RuleSet, Set, Topology, graph, runner
from hetflow.ir import interpreter as interp_module
from hetflow.ir import rules as rules_module
from hetflow.platform.devices import get_device


@hetflow.kernel
def scale(i, a, x, out):
    out[i] = a * x[i]


def two_launches():
    x, y, z = np.arange(8.0), np.zeros(8), np.zeros(8)
    mon = Monitor(Topology([get_device("cpu0")]), sources=[])
    with graph(interpreter=Interpreter(mon)) as g:
        hetflow.forall(8, scale, 2.0, x, y)
        hetflow.forall(8, scale, 3.0, x, z)
    return g, x, y, z


def counting(monkeypatch, owner, name):
    calls = []
    original = getattr(owner, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


def test_a_steady_safe_point_does_no_rule_work(monkeypatch):
    g, x, y, z = two_launches()
    g.run()
    adjusted = counting(monkeypatch, interp_module.Interpreter, "adjust")
    read = counting(monkeypatch, rules_module.Rule, "names")
    placed = counting(monkeypatch, runner, "placement")
    y[:] = z[:] = 0
    g.run(iterations=20)
    assert (len(adjusted), len(read), len(placed)) == (0, 0, 0)
    np.testing.assert_array_equal(y, 2.0 * x)
    np.testing.assert_array_equal(z, 3.0 * x)


def test_a_variable_the_rules_read_is_seen_after_unrelated_changes():
    g, _, _, _ = two_launches()
    rules = RuleSet([Rule("watch", when="defined('level') and level > 1", then=Set("fired", True))])
    g.run(rules=rules)
    for k in range(3):  # changes no rule reads: nothing to evaluate, nothing missed later
        g.monitor.set("noise", k)
        g.run(rules=rules)
    assert g.monitor.get("fired") is None
    g.monitor.set("level", 2)
    g.run(rules=rules)
    assert g.monitor["fired"] is True


def test_an_event_is_seen_at_the_next_safe_point():
    g, _, _, _ = two_launches()
    rules = RuleSet([Rule("react", when="happened('poke')", then=Set("poked", True))])
    g.run(rules=rules, iterations=3)
    g.monitor.inject("poke")
    g.run(rules=rules)
    assert g.monitor["poked"] is True


def test_placement_is_worked_out_again_when_the_device_table_changes(monkeypatch):
    g, x, y, _ = two_launches()
    rules = RuleSet([Rule("pin", match=NodePattern(op="forall"), then=Partition({"cpu0": 1}))])
    g.run(rules=rules)
    placed = counting(monkeypatch, runner, "placement")
    g.run(rules=rules)
    assert len(placed) == 0                       # same version, same device table
    table = runner.platform_devices()
    monkeypatch.setattr(runner, "platform_devices", lambda: table[:1] + table[1:])   # a new table
    y[:] = 0
    g.run(rules=rules)
    assert len(placed) == 2                       # one per launch
    np.testing.assert_array_equal(y, 2.0 * x)
    assert g.monitor["throughput.cpu0"] > 0       # placed launches still report their rate
