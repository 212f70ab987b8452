"""Capturing programs as DIR graphs: nodes, dependencies, lazy values, versions, drawing."""
import re

import numpy as np
import pytest

import hetflow
from hetflow.errors import ArgumentError, ArgumentTypeError, ShapeError
from hetflow.ir import LazyArray, RuleSet, current_graph, graph
from hetflow.ir.graph import dependencies


@hetflow.kernel
def scale(i, a, x, out):
    out[i] = a * x[i]


@hetflow.kernel
def add(i, x, y, out):
    out[i] = x[i] + y[i]


@hetflow.kernel
def inc(i, x):
    x[i] += 1.0


@hetflow.kernel
def shift_left(i, x, out):
    out[i] = x[i + 1] if i + 1 < x.shape[0] else x[i]


def test_capture_records_instead_of_running():
    x = np.arange(8.0)
    y = np.zeros(8)
    with graph() as g:
        assert current_graph() is g
        hetflow.forall(8, scale, 3.0, x, y)
    assert current_graph() is None
    assert not y.any()                      # nothing ran while capturing
    assert [n.op for n in g.current.nodes] == ["forall"]
    g.run(rules=RuleSet())
    np.testing.assert_array_equal(y, 3.0 * x)


def test_dependencies_follow_reads_and_writes():
    x, y, z = np.ones(4), np.zeros(4), np.zeros(4)
    with graph() as g:
        hetflow.forall(4, scale, 2.0, x, y)     # n0 writes y
        hetflow.forall(4, add, y, x, z)         # n1 reads y         (RAW on n0)
        hetflow.forall(4, inc, x)               # n2 writes x        (WAR on n0, n1)
        hetflow.forall(4, scale, 1.0, z, y)     # n3 reads z, writes y (RAW n1, WAW n0, WAR n1)
    ids = [n.id for n in g.current.nodes]
    deps = g.current.dependencies()
    assert deps[ids[0]] == set()
    assert deps[ids[1]] == {ids[0]}
    assert deps[ids[2]] == {ids[0], ids[1]}
    assert deps[ids[3]] == {ids[0], ids[1]}


def test_numpy_views_share_their_base():
    base = np.zeros(10)
    with graph() as g:
        hetflow.forall(5, scale, 1.0, np.ones(5), base[:5])
        hetflow.forall(5, scale, 1.0, base[5:], np.zeros(5))
    a, b = g.current.nodes
    assert dependencies(g.current.nodes)[b.id] == {a.id}


def test_lazy_arrays_materialise_on_first_need():
    x = np.arange(6.0)
    with graph() as g:
        t = hetflow.zeros(6)
        assert isinstance(t, LazyArray) and t.shape == (6,) and t.dtype == np.float64
        with pytest.raises(ArgumentError, match="being captured"):
            np.asarray(t)
        hetflow.forall(6, add, x, t, t)          # t = x + t (t zero-filled)
    with pytest.raises(ArgumentError, match="run the graph first|read it after g.run"):
        t.materialize()
    g.output(t)
    g.run(rules=RuleSet())
    np.testing.assert_array_equal(np.asarray(t), x)
    g.run(rules=RuleSet())                       # zeros again at each run, as the program says
    np.testing.assert_array_equal(np.asarray(t), x)
    assert t[2] == 2.0 and len(t) == 6 and t.size == 6 and t.ndim == 1


def test_handles_of_other_operations():
    x = np.arange(5.0)
    with graph() as g:
        total = g.record("reduce", fn=np.sum, args=(x,))
        with pytest.raises(ArgumentError, match="no value yet"):
            float(total)
        out = np.zeros(5)
        hetflow.forall(5, scale, total, x, out)   # a result used as a scalar argument
    nodes = g.current.nodes
    assert dependencies(nodes)[nodes[1].id] == {nodes[0].id}
    g.run(rules=RuleSet())
    assert float(total) == 10.0
    np.testing.assert_array_equal(out, 10.0 * x)


def test_keyword_arguments_and_in_place_writes():
    x = np.array([3.0, 1.0, 2.0])
    out = np.zeros(3)
    with graph() as g:
        g.record("sort", fn=np.sort, args=(x,), kwargs={"kind": "stable"})
        g.record("copy", fn=np.copyto, args=(out, x), writes=(0,))
        hetflow.forall(3, inc, out)
    assert [n.modes for n in g.current.nodes[1:]] == [("rw", "r"), ("rw",)]
    g.run(rules=RuleSet())
    np.testing.assert_array_equal(out, [4.0, 2.0, 3.0])
    assert list(g.current.nodes[0].result.result()) == [1.0, 2.0, 3.0]


def test_view_nodes_alias_their_parent():
    with graph() as g:
        t = hetflow.zeros(6)
        v = g.record("view", fn=lambda a: a[2:], args=(t,), alias=0)
        hetflow.forall(4, inc, v)
    g.output(t)
    g.run(rules=RuleSet())
    np.testing.assert_array_equal(np.asarray(t), [0, 0, 1, 1, 1, 1])
    deps = dependencies(g.current.nodes)
    alloc, view, launch = g.current.nodes
    assert deps[launch.id] == {alloc.id, view.id}


def test_run_again_and_iterations():
    x = np.zeros(4)
    with graph() as g:
        hetflow.forall(4, inc, x)
    g.run(rules=RuleSet())
    g.run(rules=RuleSet(), iterations=3)
    np.testing.assert_array_equal(x, 4.0)


def test_versions_diff_and_dot():
    x, y = np.ones(16), np.zeros(16)
    with graph("chain") as g:
        t = hetflow.empty(16)
        hetflow.forall(16, scale, 2.0, x, t)
        hetflow.forall(16, add, t, x, y)
    assert len(g.versions) == 1 and g.current.number == 0
    g.run()                                     # default rules fuse the chain
    assert [v.number for v in g.versions] == [0, 1]
    assert g.current.parent == 0 and "fuse-elementwise" in g.current.reason
    text = g.diff(0, 1)
    assert "- #1 forall scale(2.0, x0:r, t0:w)" in text
    assert "- #2 forall add(t0:r, x0:r, x1:w)" in text
    assert re.search(r"\+ #\d+ forall fused_scale_add\(2\.0, x0:r, x1:w\)", text)
    assert "eliminated=(t0)" in text
    assert g.diff() == text                     # default: the last change
    dot = g.to_dot(0)
    assert dot.startswith('digraph "chain v0"') and dot.rstrip().endswith("}")
    assert dot.count("shape=box") == 3 and "t0" in dot
    assert g.to_dot().count("shape=box") == 1
    np.testing.assert_array_equal(y, 3.0)


def test_diff_shows_changed_attributes():
    x = np.ones(4)
    with graph() as g:
        hetflow.forall(4, inc, x)
    rule = hetflow.ir.Rule("place", match=hetflow.ir.NodePattern(op="forall"),
                           then=hetflow.ir.Partition({"cpu": 1}))
    g.run(rules=RuleSet([rule]))
    assert "~ #0 forall inc: devices: none -> (cpu0); shares: none -> {cpu0: 1}" in g.diff(0, 1)
    assert "(no changes)" in g.diff(1, 1)


# -- bad input -------------------------------------------------------------------------------

def test_graphs_do_not_nest():
    with graph():
        with pytest.raises(ArgumentError, match="do not nest"):
            with graph():
                pass


def test_a_graph_is_captured_once():
    g = graph()
    with g:
        pass
    with pytest.raises(ArgumentError, match="already captured"):
        with g:
            pass


def test_record_outside_capture_and_run_inside():
    g = graph()
    with pytest.raises(ArgumentError, match="not capturing"):
        g.record("forall", extent=1, kernel=inc, args=(np.zeros(1),))
    with pytest.raises(ArgumentError, match="empty: capture it"):
        g.run()
    with g:
        with pytest.raises(ArgumentError, match="being captured"):
            g.run()


def test_failed_capture_cannot_run():
    g = graph()
    with pytest.raises(ZeroDivisionError):
        with g:
            hetflow.forall(1, inc, np.zeros(1))
            1 / 0
    with pytest.raises(ArgumentError, match="capture of graph 'graph' raised"):
        g.run()
    assert current_graph() is None


def test_bad_launches_fail_at_record_time():
    with graph() as g:
        with pytest.raises(ArgumentTypeError, match="takes 3 data argument"):
            hetflow.forall(4, scale, np.ones(4), np.ones(4))
        with pytest.raises(ArgumentTypeError, match="not a hetflow kernel"):
            g.record("forall", extent=4, kernel=lambda i: None, args=())
        with pytest.raises(ShapeError, match="negative"):
            hetflow.forall(-1, inc, np.ones(4))
        with pytest.raises(ArgumentError, match="fn must be callable"):
            g.record("reduce", fn=3, args=())
        with pytest.raises(ArgumentError, match="'out', which was not given"):
            g.record("copy", fn=np.copyto, args=(np.ones(1),), writes=("out",))


def test_bad_run_arguments_and_versions():
    with graph() as g:
        hetflow.forall(1, inc, np.zeros(1))
    with pytest.raises(ArgumentError, match="iterations must be an integer >= 1"):
        g.run(iterations=0)
    with pytest.raises(ArgumentError, match="RuleSet or None"):
        g.run(rules=[])
    with pytest.raises(ArgumentError, match=r"no version 5 \(versions 0..0\)"):
        g.diff(0, 5)


def test_output_and_attach_errors():
    with graph() as g:
        with pytest.raises(ArgumentError, match="nothing has been recorded"):
            g.attach(hetflow.ir.Rule("r", then=hetflow.ir.Fuse()))
        t = hetflow.empty(2)
        with pytest.raises(ArgumentError, match="attach\\(\\) takes a Rule"):
            g.attach("rule")
        with pytest.raises(ArgumentError, match="no node 99"):
            g.attach(hetflow.ir.Rule("r", then=hetflow.ir.Fuse()), 99)
    with pytest.raises(ArgumentError, match="lazy arrays allocated in graph"):
        g.output(np.zeros(2))
    with pytest.raises(ArgumentError, match="while capturing"):
        g.attach(hetflow.ir.Rule("r", then=hetflow.ir.Fuse()), t)


def test_placement_given_by_the_program_is_kept():
    x, y = np.arange(6.0), np.zeros(6)
    with graph() as g:
        g.record("forall", extent=6, kernel=scale, args=(2.0, x, y), device=["cpu0"], shares=[1.0],
                 schedule="static")
    node = g.current.nodes[0]
    assert (node.attrs["devices"], node.attrs["shares"], node.attrs["schedule"]) == (("cpu0",), {"cpu0": 1.0},
                                                                                      "static")
    g.run(rules=RuleSet())
    np.testing.assert_array_equal(y, 2.0 * x)


def test_running_with_a_rule_file_s_path_says_how_to_load_it(tmp_path):
    x, y = np.arange(8.0), np.zeros(8)
    with graph() as g:
        hetflow.forall(8, scale, 3.0, x, y)
    path = tmp_path / "rules.toml"
    with pytest.raises(ArgumentError, match=re.escape(f"got str; load the file once with "
                                                      f"hetflow.RuleSet.load({str(path)!r}) and pass that")):
        g.run(rules=str(path))
    with pytest.raises(ArgumentError, match=r"rules must be a RuleSet or None; got int$"):
        g.run(rules=3)
    assert not y.any()
