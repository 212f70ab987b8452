"""Sweep of the dynamic IR: captured programs against their eager runs, errors during a
run, rule expressions that would grow without bound, rule-file checks, absurd splits."""
from __future__ import annotations

import numpy as np
import pytest

import hetflow
from hetflow import cshift, interior
from hetflow.errors import ArgumentError, KernelRaisedError, RuleError, RuleSyntaxError
from hetflow.ir import Monitor, RuleSet, rulefile
from hetflow.ir.expressions import Environment, parse
from hetflow.ir.graph import Node
from test_ir_fusion import scale, shift


@hetflow.kernel
def neighbour_sum(i, x, out):
    out[i] = x[i] + x[(i + 1) % x.shape[0]]


@hetflow.kernel
def copy2(i, j, x, out):
    out[i, j] = x[i, j]


@hetflow.kernel
def running_sum(i, j, a):
    if i > 0 and j > 0:
        a[i, j] = a[i - 1, j] + a[i, j - 1]


@hetflow.kernel
def average4(i, j, n, s, e, w, out):
    out[i, j] = 0.25 * (n[i, j] + s[i, j] + e[i, j] + w[i, j])


@hetflow.kernel
def fragile(i, x, out):
    if x[i] < 0:
        raise ValueError("negative input")
    out[i] = x[i]


@hetflow.kernel
def positive_part(i, x, out):
    if x[i] > 0:
        out[i] = x[i]


def rules(text: str, name: str = "sweep.toml") -> RuleSet:
    return RuleSet(rulefile.loads(text, name))


# -- captured programs against their eager runs ---------------------------------------------

def test_a_sweep_writing_in_place_stays_between_the_launches_around_it():
    # The wavefront writes a in place: fusing the launches around it must not move it after
    # the launch that reads a.
    n, x = 5, np.ones((5, 5))

    def program(a, y):
        hetflow.forall((n, n), copy2, x, a)
        hetflow.wavefront((n, n), running_sum, a)
        hetflow.forall((n, n), copy2, a, y)

    a, expected = np.zeros((n, n)), np.zeros((n, n))
    program(a, expected)
    a, y = np.zeros((n, n)), np.zeros((n, n))
    with hetflow.graph() as g:
        program(a, y)
    g.run()
    np.testing.assert_array_equal(y, expected)
    assert [node.op for node in g.current.nodes] == ["forall", "wavefront", "forall"]


def test_a_launch_reading_a_neighbour_of_what_the_one_before_wrote_is_not_fused():
    x, y = np.arange(8.0), np.zeros(8)
    with hetflow.graph() as g:
        t = hetflow.empty(8)
        hetflow.forall(8, scale, 2.0, x, t)
        hetflow.forall(8, neighbour_sum, t, y)
    g.run(iterations=2)
    np.testing.assert_array_equal(y, 2 * x + 2 * np.roll(x, -1))
    assert len(g.versions) == 1


def test_ping_pong_views_over_iterations_match_the_eager_loop():
    rng = np.random.default_rng(3)
    start = rng.random((6, 6))

    def step(u, v):
        near = [interior(cshift(u, d, k), 1) for d, k in ((0, -1), (0, 1), (1, 1), (1, -1))]
        hetflow.forall(interior(v, 1), average4, *near, interior(v, 1))

    ue, ve = start.copy(), start.copy()
    for _ in range(3):
        step(ue, ve)
        step(ve, ue)
    u, v = start.copy(), start.copy()
    with hetflow.graph() as g:
        step(u, v)
        step(v, u)
    g.run(iterations=3)
    np.testing.assert_array_equal(u, ue)
    np.testing.assert_array_equal(v, ve)


def test_reduce_scan_sort_see_host_arrays_changed_in_place_but_not_rebound_names_or_scalars():
    x, y = np.array([3.0, 1.0, 2.0]), np.zeros(3)
    a = 2.0
    with hetflow.graph() as g:
        total = hetflow.reduce(x, "sum")
        prefix = hetflow.scan(x, "sum")
        ordered = hetflow.sort(x)
        hetflow.forall(3, scale, a, x, y)
    g.run()
    x[:] = [5.0, 4.0, 6.0]          # seen: arrays are captured by reference
    a = 10.0                        # not seen: scalars are captured by value
    kept = x
    x = np.zeros(3)                 # not seen: the graph holds the array, not the name
    g.run()
    assert float(total) == 15.0 and a == 10.0
    np.testing.assert_array_equal(np.asarray(prefix), np.cumsum(kept))
    np.testing.assert_array_equal(np.asarray(ordered), np.sort(kept))
    np.testing.assert_array_equal(y, 2.0 * kept)


def test_a_lazy_array_with_a_fill_keeps_it_where_a_fused_chain_leaves_it_unwritten():
    x, y = np.array([1.0, -1.0, 2.0, -2.0]), np.zeros(4)
    with hetflow.graph() as g:
        t = g.record("alloc", shape=4, fill=5.0)
        hetflow.forall(4, positive_part, x, t)
        hetflow.forall(4, shift, t, 0.5, y)
    g.run()
    np.testing.assert_array_equal(y, np.where(x > 0, x, 5.0) + 0.5)
    assert "eliminated" not in g.current.nodes[-1].attrs


# -- errors during a run ----------------------------------------------------------------------

def test_a_kernel_raising_in_a_run_names_the_graph_version_and_node_and_leaves_the_graph_usable():
    x, y, z = np.array([1.0, 2.0, -3.0, 4.0]), np.zeros(4), np.zeros(4)
    with hetflow.graph("pipeline") as g:
        hetflow.forall(4, scale, 2.0, x, y)
        hetflow.forall(4, fragile, y, z)
    with pytest.raises(KernelRaisedError, match=r"^graph 'pipeline' v1, node #\d+ forall fused_scale_fragile "
                                                r"\(from #0, #1\): kernel 'fused_scale_fragile' raised ValueError"):
        g.run()
    x[2] = 3.0
    g.run()
    np.testing.assert_array_equal(z, 2.0 * x)


def test_a_result_after_a_failed_run_says_the_run_left_it_without_a_value():
    x, out = np.array([1.0, -1.0]), np.zeros(2)
    with hetflow.graph("s") as g:
        hetflow.forall(2, fragile, x, out)   # raises when it runs: the reduce after it never runs
        ordered = hetflow.reduce(out, "min")
    with pytest.raises(KernelRaisedError, match=r"^graph 's' v0, node #0 forall fragile: "):
        g.run()
    with pytest.raises(ArgumentError, match=r"reduce\d+ \(result of reduce\) has no value yet: its graph has not "
                                            r"computed it: run the graph \(g\.run\(\)\); a run that raised"):
        np.asarray(ordered)


def test_inspecting_a_graph_inside_its_own_capture_says_so():
    with hetflow.graph("c") as g:
        with pytest.raises(ArgumentError, match="graph 'c' is being captured: run or inspect it after its 'with' block"):
            g.describe()
        hetflow.forall(2, scale, 1.0, np.ones(2), np.zeros(2))


# -- rule expressions stay bounded ------------------------------------------------------------

@pytest.mark.parametrize("text, values, message", [
    ("x * x", {"x": 2 ** 1000}, "'*' would make an integer of more than 1024 bits at column 3"),
    ("x + x", {"x": 2 ** 1024 - 1}, "'+' made an integer of more than 1024 bits at column 3"),
    ("s + s", {"s": "a" * 40000}, "'+' would make a string of more than 65536 characters at column 3"),
    ("round(x, -1000000)", {"x": 3}, "round() failed: its digits must be from -400 to 400, not -1000000"),
    ("max(True, 2)", {}, "max() failed: it takes numbers, not a boolean True"),
    ("abs(b)", {"b": False}, "abs() failed: it takes numbers, not a boolean False"),
    ("min('a', 1)", {}, "min() failed: it takes numbers, not a string 'a'"),
])
def test_evaluation_that_would_grow_without_bound_or_mix_kinds_is_a_rule_error(text, values, message):
    with pytest.raises(RuleError) as info:
        parse(text).evaluate(Environment(values.__getitem__))
    assert message in str(info.value)


def test_bounded_values_still_evaluate():
    env = Environment({"x": 2 ** 500, "s": "ab"}.__getitem__)
    assert parse("x * x").evaluate(env) == 2 ** 1000
    assert parse("round(1234, -2) + round(2.5, 400)").evaluate(env) == 1202.5
    assert parse("max('a', s) + s").evaluate(env) == "abab"


def test_a_rule_squaring_a_variable_every_round_is_disabled_naming_its_file_rule_and_key():
    ruleset = rules('[[rule]]\nname = "grow"\nwhen = "defined(\'x\')"\n'
                    'then = [{action = "set", var = "x", value = "x * x"}]\n', "grow.toml")
    mon = Monitor()
    mon.set("x", 2)
    x, y = np.arange(4.0), np.zeros(4)
    with hetflow.graph(monitor=mon) as g:
        hetflow.forall(4, scale, 3.0, x, y)
    g.run(rules=ruleset, iterations=2)
    np.testing.assert_array_equal(y, 3.0 * x)
    error = ruleset.get("grow").error
    assert error.startswith("RuleError: grow.toml: rule 'grow', key 'then[0].value': '*' would make an integer "
                            "of more than 1024 bits")


# -- rule files -------------------------------------------------------------------------------

@pytest.mark.parametrize("body, key, message", [
    ('then = [{action = ["fuse"]}]', "then[0].action", "unknown action ['fuse']"),
    ('then = [{action = "fuse"}]\nmatch = {dtype = "float99"}', "match.dtype", "'float99' is not a NumPy dtype"),
    ('then = [{action = "fuse"}]\nmatch = {op = []}', "match.op", "is an empty list"),
    ('then = [{action = "fuse"}]\nmatch = {min_size = 5, max_size = 1}', "match.max_size",
     "must be >= match.min_size (5); got 1"),
])
def test_rule_file_values_that_could_never_work_fail_when_the_file_loads(body, key, message):
    with pytest.raises(RuleSyntaxError) as info:
        rulefile.loads(f'[[rule]]\nname = "r"\n{body}\n', "bad.toml")
    assert str(info.value).startswith(f"bad.toml: rule 'r', key '{key}': ")
    assert message in str(info.value)
    assert (info.value.rule, info.value.key) == ("r", key)


# -- splits -----------------------------------------------------------------------------------

def test_a_split_into_more_pieces_than_rows_makes_no_empty_pieces():
    x, y = np.arange(8.0), np.zeros(8)
    ruleset = rules('[[rule]]\nname = "cut"\nmatch = {op = "forall"}\n'
                    'then = [{action = "split", pieces = 64, place = false}]\n')
    with hetflow.graph() as g:
        hetflow.forall(8, scale, 2.0, x, y)
    g.run(rules=ruleset)
    np.testing.assert_array_equal(y, 2.0 * x)
    assert [node.extent for node in g.current.nodes] == [(1,)] * 8


def test_a_split_into_many_pieces_compares_each_firing_with_what_it_changed(monkeypatch):
    # Every piece is matched again at the next round: comparing the whole graph after
    # each firing made that quadratic (a split into 65536 pieces did not finish).
    pieces, calls = 1000, [0]
    signature = Node.signature

    def counted(node):
        calls[0] += 1
        return signature(node)

    ruleset = rules(f'[[rule]]\nname = "cut"\nmatch = {{op = "forall"}}\n'
                    f'then = [{{action = "split", pieces = {pieces}, place = false}}]\n')
    x, y = np.arange(2000.0), np.zeros(2000)
    with hetflow.graph() as g:
        hetflow.forall(2000, scale, 2.0, x, y)
    monkeypatch.setattr(Node, "signature", counted)
    version = g.adjust(ruleset)
    assert len(version.nodes) == pieces
    assert calls[0] < 10 * pieces


def test_describe_names_the_keyword_arguments_of_recorded_operations():
    x = np.arange(3.0)
    with hetflow.graph() as g:
        hetflow.reduce(x, "max")
    assert g.describe().splitlines()[1] == ("  #0 reduce reduce(x0:r, 'max', axis=None, device=None, "
                                            "commutative=True, identity=None) -> reduce0")


def test_versions_are_numbered_by_any_integer():
    @hetflow.kernel
    def twice(i, x, out):
        out[i] = 2.0 * x[i]

    x, y = np.arange(4.0), np.zeros(4)
    with hetflow.graph() as g:
        hetflow.forall(4, twice, x, y)
    g.run()
    assert g.version(np.int64(0)) is g.version(0)
    assert g.diff(np.int32(0), np.int64(0)) == g.diff(0, 0)
    np.testing.assert_array_equal(y, 2.0 * x)
