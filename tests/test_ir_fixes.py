"""Fixes of the graph IR: foreign lazy arrays, the shipped example with the defaults,
splits with the defaults, nesting, rule-file checks, misuse errors, split pieces' rows."""
from __future__ import annotations

import io
import logging
import math
from pathlib import Path

import numpy as np
import pytest

import hetflow
from hetflow.errors import ArgumentError, ArgumentTypeError, RuleSyntaxError
from hetflow.ir import Chain, Fuse, Monitor, NodePattern, Partition, Rule, RuleSet, Split, Topology, rulefile
from hetflow.ir import codegen
from hetflow.ir import runner
from hetflow.ir.values import concrete
from hetflow.platform.devices import get_device
from test_ir_fusion import scale, shift

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "rules" / "fuse_and_repartition.toml"


@hetflow.kernel
def neighbours(i, x, out):
    out[i] = x[i] + 0.5 * x[(i + 1) % x.shape[0]]


@hetflow.kernel
def ramp(i, j, x, out):
    out[i, j] = x[i, j] * 2 + i - j


def kernel_name(node):
    return node.kernel.name


# -- 1: a graph never eliminates another graph's lazy array ----------------------------------

def test_a_lazy_array_of_another_graph_is_written_not_fused_away():
    n = 8
    x, y = np.arange(n, dtype=float), np.zeros(n)
    with hetflow.graph() as g:
        t = hetflow.zeros(n)
        hetflow.forall(n, scale, 2.0, x, t)
    g.output(t)
    g.run()
    with hetflow.graph() as g2:
        hetflow.forall(n, scale, 3.0, x, t)
        hetflow.forall(n, scale, 1.0, t, y)
    g2.run()
    assert g2.current.nodes[0].attrs["fused"] == ("scale", "scale")   # still fused, t kept
    assert "eliminated" not in g2.current.nodes[0].attrs
    np.testing.assert_array_equal(np.asarray(t), 3.0 * x)
    np.testing.assert_array_equal(y, 3.0 * x)


# -- 2: the shipped example works with the defaults ------------------------------------------

@pytest.mark.simgpu
def not_idle(mon):
    """Every launch's devices ran rows lately, as far as drop-idle-devices knows."""
    for name in [k for k in mon.snapshot() if k.startswith("idle.")]:
        mon.set(name, 0)
    mon.set("devices.idle", 0)


def test_the_example_rules_run_with_the_defaults_again_and_again():
    n = 200
    x, y = np.random.default_rng(1).random(n), np.zeros(n)
    rules = RuleSet.default().extend(RuleSet.load(EXAMPLE))
    mon = Monitor()
    with hetflow.graph("f", monitor=mon) as g:
        hetflow.forall(n, scale, 2.0, x, y)
    mon.inject("utilization", device="gpu0", value=0.6)      # another process takes the GPU
    for _ in range(4):
        mon.set("throughput.cpu0", 30000.0)                  # far apart: rebalance would fire
        mon.set("throughput.gpu0", 6000.0)
        not_idle(mon)  # (the simulated GPU may have run no rows: the case below)
        y[:] = 0
        g.run(rules=rules)
        assert g.current.nodes[0].attrs["shares"] == {"cpu0": 0.6, "gpu0": 0.4}
        np.testing.assert_array_equal(y, 2.0 * x)
    for _ in range(runner.IDLE_RUNS):  # gpu0 runs nothing: drop-idle-devices wins, no fight
        runner._count_idle(mon, scale.name, {"cpu0": n, "gpu0": 0})
    y[:] = 0
    g.run(rules=rules)
    assert g.current.nodes[0].attrs["devices"] == ("cpu0",)
    np.testing.assert_array_equal(y, 2.0 * x)
    not_idle(mon)
    mon.inject("device_removed", device="gpu0")
    g.run(rules=rules)
    assert g.current.nodes[0].attrs["devices"] == ("cpu0",)
    mon.inject("device_added", device=get_device("gpu0"))
    not_idle(mon)
    y[:] = 0
    g.run(rules=rules)
    assert g.current.nodes[0].attrs["shares"] == {"cpu0": 0.6, "gpu0": 0.4}
    np.testing.assert_array_equal(y, 2.0 * x)


# -- 3: resplit-on-node-change re-cuts splits over nodes only ---------------------------------

def split_graph(nodes=1):
    n = 100
    x, y = np.random.default_rng(2).random(n), np.zeros(n)
    mon = Monitor(Topology([get_device("cpu0")], nodes=nodes), sources=[])
    with hetflow.graph(monitor=mon) as g:
        hetflow.forall(n, scale, 2.0, x, y)
    return g, x, y


@pytest.mark.parametrize("place", [False, True])
def test_a_user_split_not_over_nodes_is_left_alone_by_the_defaults(place):
    g, x, y = split_graph(nodes=2)
    rules = RuleSet.default().extend([Rule("cut-in-4", match=NodePattern(op="forall"),
                                           then=Split(pieces=4, place=place))])
    g.run(rules=rules, iterations=2)
    assert [n.attrs["piece"] for n in g.current.nodes] == [(0, 4), (1, 4), (2, 4), (3, 4)]
    np.testing.assert_array_equal(y, 2.0 * x)


def test_a_split_over_nodes_is_cut_again_when_the_node_count_changes():
    g, x, y = split_graph(nodes=2)
    rules = RuleSet.default().extend([Rule("per-node", match=NodePattern(op="forall"), then=Split(),
                                           when="node.pieces == 1")])
    g.run(rules=rules)
    assert [(n.attrs["place"], n.attrs["nodes"]) for n in g.current.nodes] == [(0, 2), (1, 2)]
    g.monitor.inject("node_added")
    y[:] = 0
    g.run(rules=rules)
    assert "resplit-on-node-change" in g.current.reason
    assert [(n.attrs["place"], n.attrs["nodes"]) for n in g.current.nodes] == [(0, 3), (1, 3), (2, 3)]
    np.testing.assert_array_equal(y, 2.0 * x)


# -- 4: graphs do not nest --------------------------------------------------------------------

def test_running_a_graph_inside_another_capture_is_refused():
    x = np.zeros(4)
    with hetflow.graph("inner") as g:
        hetflow.forall(4, scale, 2.0, np.ones(4), x)
    with pytest.raises(ArgumentError, match="graphs do not nest: graph 'inner' cannot run while "
                                            "graph 'outer' is being captured"):
        with hetflow.graph("outer"):
            g.run()
    np.testing.assert_array_equal(x, np.zeros(4))     # nothing ran
    assert hetflow.ir.current_graph() is None
    g.run()
    np.testing.assert_array_equal(x, np.full(4, 2.0))


# -- 5, 7: rule-file checks name the file, the rule and the key -------------------------------

def load_error(text) -> RuleSyntaxError:
    with pytest.raises(RuleSyntaxError) as info:
        rulefile.loads(text, "r.toml")
    return info.value


@pytest.mark.parametrize("share", ["-1", "inf", "nan"])
def test_a_bad_constant_share_names_its_key(share):
    err = load_error(f'[[rule]]\nname = "gpu-busy"\nthen = [ {{ action = "partition", shares = {{ cpu = 1, '
                     f'gpu = {share} }} }} ]\n')
    assert (err.rule, err.key) == ("gpu-busy", "then[0].shares.gpu")
    assert str(err).startswith("r.toml: rule 'gpu-busy', key 'then[0].shares.gpu': partition: share of 'gpu'")


@pytest.mark.parametrize("when, fragment", [
    ("min() > 0", "min() takes 2 or more argument(s), 0 given at column 1"),
    ("max(1) > 0", "max() takes 2 or more argument(s), 1 given"),
    ("count('gpu', 2) > 0", "count() takes 1 argument(s), 2 given"),
    ("round(1, 2, 3) > 0", "round() takes 1 to 2 argument(s), 3 given"),
    ("node.bogus > 1", "unknown node field 'bogus' (node fields: id, op,"),
])
def test_expressions_that_could_only_fail_when_run_fail_when_loaded(when, fragment):
    err = load_error(f'[[rule]]\nname = "r"\nwhen = "{when}"\nmatch = {{ op = "forall" }}\n'
                     f'then = [ {{ action = "fuse" }} ]\n')
    assert (err.rule, err.key) == ("r", "when")
    assert fragment in str(err) and str(err).startswith("r.toml: rule 'r', key 'when': ")


def test_substitute_of_an_unknown_kernel_fails_when_loaded():
    text = ('[[rule]]\nname = "subst"\nmatch = { op = "forall" }\n'
            'then = [ { action = "substitute", map = { scale = "no_such_kernel" } } ]\n')
    err = load_error(text)
    assert (err.rule, err.key) == ("subst", "then[0].map.scale")
    assert "no kernel 'no_such_kernel' in hetflow.library (add, axpy" in str(err)
    assert rulefile.loads(text, "r.toml", kernels={"no_such_kernel": shift})   # given: fine


def test_every_node_field_an_expression_may_name_has_a_value():
    g, _, _ = split_graph()
    node = g.current.nodes[0]
    from hetflow.ir.expressions import NODE_FIELDS
    from hetflow.ir.interpreter import _node_variable
    assert {f: _node_variable(node, f) for f in NODE_FIELDS}["nodes"] == 0


@pytest.mark.parametrize("action, key, fragment", [
    ('{ action = "split", pieces = "node.size / 7" }', "then[0].pieces",
     "split needs a whole number of pieces from 1 to 65536; node.size / 7 gave 14.285714285714286"),
    ('{ action = "partition", shares = { cpu = "0 - 1" } }', "then[0].shares.cpu",
     "partition: share of 'cpu' must be a finite number >= 0; got -1 from 0 - 1"),
])
def test_action_values_out_of_bounds_at_run_time_name_file_rule_and_key(action, key, fragment, caplog):
    rules = RuleSet(rulefile.loads(f'[[rule]]\nname = "r"\nmatch = {{ op = "forall" }}\nthen = [ {action} ]\n',
                                   "r.toml"))
    g, x, y = split_graph()
    with caplog.at_level(logging.CRITICAL, logger="hetflow.ir"):
        g.run(rules=rules)
    assert rules.get("r").error == f"RuleError: r.toml: rule 'r', key '{key}': {fragment}"
    np.testing.assert_array_equal(y, 2.0 * x)


# -- 6: lazy arrays outside their capture -------------------------------------------------------

def test_a_computed_lazy_array_runs_eagerly_as_its_array_and_a_pending_one_says_run_first():
    n = 8
    x, y = np.arange(n, dtype=float), np.zeros(n)
    with hetflow.graph("producer") as g:
        t = hetflow.empty(n)
        hetflow.forall(n, scale, 2.0, x, t)
    with pytest.raises(ArgumentError, match="lazy array t0 of graph 'producer' has not been computed "
                                            r"yet: run the graph first \(g.run\(\)\)"):
        concrete((1.0, t, y))
    with pytest.raises(ArgumentError, match="lazy array t0 of graph 'producer' has not been computed"):
        hetflow.forall(n, scale, 1.0, t, y)
    g.output(t)
    g.run()
    args = concrete((1.0, t, y))
    assert args[1] is np.asarray(t)
    hetflow.forall(n, scale, 1.0, t, y)   # eagerly, as the array it stands for
    np.testing.assert_array_equal(y, 2.0 * x)
    plain = (1.0, x, y)
    assert concrete(plain) is plain


def test_a_pending_lazy_array_used_by_another_graph_names_its_graph():
    with hetflow.graph("first") as g:
        t = hetflow.empty(4)
        hetflow.forall(4, scale, 2.0, np.ones(4), t)
    with hetflow.graph("second") as g2:
        hetflow.forall(4, scale, 2.0, t, np.zeros(4))
    with pytest.raises(ArgumentError, match="lazy array t0 of graph 'first' has not been computed yet"):
        g2.run()
    assert g is not g2


# -- 8: misuse ----------------------------------------------------------------------------------

def test_iterations_may_be_a_numpy_integer():
    x = np.zeros(4)
    with hetflow.graph() as g:
        hetflow.forall(4, shift, x, 1.0, x)
    g.run(iterations=np.int64(2))
    np.testing.assert_array_equal(x, np.full(4, 2.0))
    with pytest.raises(ArgumentError, match="iterations must be an integer >= 1; got np.True_|got True"):
        g.run(iterations=np.bool_(True))


def test_removing_or_failing_an_unknown_device_is_refused_alike():
    mon = Monitor(Topology([get_device("cpu0")]), sources=[])
    for kind in ("device_removed", "device_failed"):
        with pytest.raises(ArgumentError, match=f"{kind} names 'gpu7', which is not in the topology"):
            mon.inject(kind, device="gpu7")
    assert mon.drain() == ()


@pytest.mark.parametrize("k, error, fragment", [
    (math.nan, ArgumentError, "finite non-negative amount, got nan"),
    (math.inf, ArgumentError, "finite non-negative amount, got inf"),
    (-1, ArgumentError, "finite non-negative amount, got -1"),
    ("2", ArgumentTypeError, "progress advances by a number, got str '2'"),
    (None, ArgumentTypeError, "progress advances by a number, got NoneType None"),
])
def test_progress_advances_by_finite_non_negative_numbers_only(k, error, fragment):
    with hetflow.trace.progress(5, "x", file=io.StringIO()) as bar:
        with pytest.raises(error, match=fragment):
            bar.advance(k)
        bar.advance(np.float64(1.5))
    assert bar.completed == 1.5


# -- 9: the timeline's message when there is nothing to draw ----------------------------------

def test_an_empty_trace_says_that_every_recorded_loop_counts(tmp_path):
    with pytest.raises(ArgumentError) as info:
        hetflow.trace.timeline.plot_timeline([], tmp_path / "empty.png")
    assert "on one device or several" in str(info.value) and "Only co-executed" not in str(info.value)
    with hetflow.trace.record() as rec:
        hetflow.forall(100, scale, 2.0, np.ones(100), np.zeros(100), device="cpu0")
    rec.plot(tmp_path / "one.png")                        # one-device launches draw
    assert (tmp_path / "one.png").stat().st_size > 0


# -- 10: split pieces keep writing only their own rows ----------------------------------------

def test_row_sliced_finds_the_parameters_to_cut():
    assert codegen.row_sliced(scale, 1) == {"x", "out"}
    assert codegen.row_sliced(neighbours, 1) is None     # reads other rows
    assert codegen.row_sliced(ramp, 2) is None           # uses its row index as a value


def run_split(rules, kernels, eager):
    n = 120
    rng = np.random.default_rng(3)
    data = [rng.random(n), np.zeros(n), np.zeros(n)]
    expected = [a.copy() for a in data]
    eager(*expected)
    with hetflow.graph() as g:
        eager(*data)
    g.run(rules=RuleSet(rules), iterations=2)
    eager(*expected)
    for got, want in zip(data, expected):
        np.testing.assert_array_equal(got, want)
    return g


def test_split_pieces_run_the_kernel_on_their_rows_where_they_can():
    def program(x, y, z):
        hetflow.forall(120, scale, 2.0, x, y)
        hetflow.forall(120, neighbours, y, z)
    g = run_split([Rule("sp", match=NodePattern(op="forall"), then=Split(pieces=3, place=False))],
                  None, program)
    pieces = g.current.nodes
    assert [kernel_name(n) for n in pieces] == ["scale"] * 3 + ["neighbours_at"] * 3
    assert [n.extent for n in pieces[:3]] == [(40,)] * 3
    assert "out" in scale.access(1).rows


@pytest.mark.simgpu
def test_fused_split_pieces_co_execute_without_falling_back(caplog):
    def program(x, y, z):
        t = hetflow.empty(120) if hetflow.ir.current_graph() else np.empty(120)
        hetflow.forall(120, scale, 2.0, x, t)
        hetflow.forall(120, shift, t, 1.0, y)
    rules = [Rule("f", match=Chain(NodePattern(op="forall")), then=Fuse(), priority=9),
             Rule("p", match=NodePattern(op="forall"),
                  then=[Partition(shares={"cpu": 1, "gpu": 2}), Split(pieces=2, place=False)], priority=1)]
    with caplog.at_level(logging.INFO, logger="hetflow"):
        g = run_split(rules, None, program)
    assert [kernel_name(n) for n in g.current.nodes] == ["fused_scale_shift"] * 2
    assert "outside the rows" not in caplog.text
