"""The acceptance scenarios of SPEC §4.5, in one process.

Simulated nodes are the topology's node count; simulated devices are device records
injected into the topology the interpreter plans for. Work always runs for real on
this host (planned devices it does not have are left out by the runner), and every
result is checked against NumPy.
"""
from pathlib import Path

import numpy as np
import pytest

import hetflow
from hetflow.ir import (Compile, Interpreter, Monitor, NodePattern, Partition, Rule, RuleSet, Split, Topology,
                        graph, simulated_device)
from hetflow.platform.devices import devices, get_device
from hetflow.platform.repository import repository

EXAMPLE_RULES = Path(__file__).resolve().parents[1] / "examples" / "rules" / "fuse_and_repartition.toml"
MOVE_RULES = EXAMPLE_RULES.with_name("move_off_busy_gpu.toml")


@hetflow.kernel
def saxpy(i, a, x, y, out):
    out[i] = a * x[i] + y[i]


@hetflow.kernel
def scale(i, a, x, out):
    out[i] = a * x[i]


@hetflow.kernel
def shift(i, x, b, out):
    out[i] = x[i] + b


@hetflow.kernel
def square(i, x, out):
    out[i] = x[i] * x[i]


def interpreter(*devs, nodes=1, **kw):
    return Interpreter(Monitor(Topology(list(devs) or [get_device("cpu0")], nodes=nodes), sources=[]), **kw)


def saxpy_graph(interp, n=1000):
    rng = np.random.default_rng(7)
    x, y, out = rng.random(n), rng.random(n), np.zeros(n)
    with graph("saxpy", interpreter=interp) as g:
        hetflow.forall(n, saxpy, 2.5, x, y, out)
    return g, out, 2.5 * x + y


def placements(g):
    return [(n.attrs.get("place"), n.attrs.get("devices"), n.attrs.get("shares")) for n in g.current.nodes]


def test_1_node_added_repartitions_over_the_new_count():
    g, out, expected = saxpy_graph(interpreter(nodes=2))
    rules = RuleSet.default().extend([
        Rule("split-over-nodes", match=NodePattern(op="forall"),
             when="count('node') > 1 and node.pieces != count('node')", then=Split())])
    g.run(rules=rules)
    assert [n.attrs["piece"] for n in g.current.nodes] == [(0, 2), (1, 2)]
    np.testing.assert_array_equal(out, expected)

    g.monitor.inject("node_added")                      # a third node joins
    out[:] = 0
    g.run(rules=rules)
    pieces = g.current.nodes
    assert [(n.attrs["place"], n.extent) for n in pieces] == [(0, (333,)), (1, (333,)), (2, (334,))]
    assert "events: node_added" in g.current.reason
    assert g.diff().count("\n- ") == 2 and g.diff().count("\n+ ") == 3
    np.testing.assert_array_equal(out, expected)


def test_2_load_statistics_crossing_a_threshold_rebalance():
    interp = interpreter(get_device("cpu0"), simulated_device("gpu", 0))
    g, out, expected = saxpy_graph(interp, n=64)   # under the CUDA simulator gpu0 really runs: keep it small
    rules = RuleSet.load(EXAMPLE_RULES)
    rules.add(Rule("spread", match=NodePattern(op="forall", attrs={"devices": None}), then=Partition()))
    g.run(rules=rules)                                  # measured: throughput.cpu0 from the run report
    assert placements(g) == [(None, ("cpu0", "gpu0"), {"cpu0": 0.5, "gpu0": 0.5})]
    measured = g.monitor["throughput.cpu0"]
    assert measured > 0

    g.monitor.set("throughput.gpu0", 1.2 * measured)    # the other device's statistics: similar
    g.adjust(rules)
    assert placements(g)[0][2] == {"cpu0": 0.5, "gpu0": 0.5}

    g.monitor.set("throughput.gpu0", 4.0 * measured)    # now far apart: past the threshold
    g.adjust(rules)
    assert "rebalance-by-throughput" in g.current.reason
    assert placements(g)[0][2] == pytest.approx({"cpu0": 0.2, "gpu0": 0.8}, abs=1e-6)
    out[:] = 0
    g.run(rules=rules)
    np.testing.assert_array_equal(out, expected)


def test_3_missing_compiled_operation_is_compiled_stored_and_run(tmp_path, monkeypatch):
    monkeypatch.setenv("HETFLOW_CACHE_DIR", str(tmp_path))
    assert repository().entries(saxpy) == []             # this node has no executable of saxpy
    g, out, expected = saxpy_graph(interpreter())
    rules = RuleSet([Rule("compile-missing", match=NodePattern(op="forall"), when="not compiled('cpu')",
                          then=Compile(kinds=["cpu"]))])
    g.adjust(rules)
    assert g.current.nodes[0].attrs["compiled"] == ("cpu0",)
    stored = repository().entries(saxpy)
    assert len(stored) == 1 and (stored[0] / "module.py").is_file() and (stored[0] / "description.json").is_file()
    assert "def __hf_entry(" in (stored[0] / "module.py").read_text()  # the entry calling saxpy
    assert repository().compiled == 1
    g.run(rules=rules)
    np.testing.assert_array_equal(out, expected)
    assert repository().compiled == 1                    # the run used the stored executable


def test_4_gpu_shared_with_another_process_adds_a_rule_at_run_time():
    gpu = simulated_device("gpu", 3)
    interp = interpreter(get_device("cpu0"), gpu)
    g, out, expected = saxpy_graph(interp)
    rules = RuleSet.default().extend(RuleSet.load(EXAMPLE_RULES))
    g.run(rules=rules)
    assert "share-busy-gpu" not in rules and len(g.versions) == 1

    interp.monitor.inject("utilization", device="gpu3", value=0.6)     # another process took the GPU
    out[:] = 0
    g.run(rules=rules)
    assert "share-busy-gpu" in rules and "gpu-free-again" in rules      # added at run time
    assert "share-busy-gpu" in g.current.reason
    assert placements(g)[0][2] == {"cpu0": 0.6, "gpu3": 0.4}
    np.testing.assert_array_equal(out, expected)

    interp.monitor.inject("utilization", device="gpu3", value=0.05)    # it left
    g.run(rules=rules)
    assert placements(g)[0][2] == {"cpu0": 0.1, "gpu3": 0.9}
    interp.monitor.inject("utilization", device="gpu3", value=0.8)     # and came back
    out[:] = 0
    g.run(rules=rules, iterations=2)
    assert placements(g)[0][2] == {"cpu0": 0.8, "gpu3": 0.2}
    assert [v.number for v in g.versions] == [0, 1, 2, 3]
    np.testing.assert_array_equal(out, expected)


def test_4_launches_leave_a_gpu_another_process_takes_and_come_back():
    gpu = simulated_device("gpu", 3)
    interp = interpreter(get_device("cpu0"), gpu)
    g, out, expected = saxpy_graph(interp)
    rules = RuleSet.load(MOVE_RULES)
    for value, kind in ((0.0, "gpu3"), (0.9, "cpu0"), (0.1, "gpu3")):   # free, taken, left again
        interp.monitor.inject("utilization", device="gpu3", value=value)
        out[:] = 0
        g.run(rules=rules, iterations=2)
        assert placements(g)[0][1] == (kind,)
        np.testing.assert_array_equal(out, expected)
    assert [v.reason for v in g.versions[1:]] == [
        "rules: run-on-free-gpu; events: utilization", "rules: leave-busy-gpu; events: utilization",
        "rules: run-on-free-gpu; events: utilization"]


def test_5_coarse_partition_is_refined_by_each_node():
    central = interpreter(nodes=2)                       # knows the node count, not their processors
    local_rules = lambda: RuleSet.default().extend([     # noqa: E731
        Rule("use-my-devices", match=NodePattern(op="forall", attrs={"devices": None}), then=Partition())])
    node0 = Interpreter(Monitor(Topology([get_device("cpu0")]), sources=[]), rules=local_rules(), place=0)
    gpu = simulated_device("gpu", 5)
    node1 = Interpreter(Monitor(Topology([get_device("cpu0"), gpu]), sources=[]), rules=local_rules(), place=1)
    central.add_child(node0)
    central.add_child(node1)
    g, out, expected = saxpy_graph(central)
    rules = RuleSet([Rule("split-over-nodes", match=NodePattern(op="forall"),
                          when="node.pieces != count('node')", then=Split())])
    g.run(rules=rules)
    assert placements(g) == [(0, ("cpu0",), {"cpu0": 1.0}),
                             (1, ("cpu0", "gpu5"), {"cpu0": 0.5, "gpu5": 0.5})]
    assert "use-my-devices@1" in g.current.reason
    np.testing.assert_array_equal(out, expected)

    node1.monitor.inject("device_failed", device="gpu5")   # local feedback on node 1 only
    out[:] = 0
    g.run(rules=rules)
    assert placements(g)[1] == (1, ("cpu0",), {"cpu0": 1.0})
    assert "drop-lost-devices@1" in g.current.reason
    np.testing.assert_array_equal(out, expected)


def abc_program(n, interp, device):
    rng = np.random.default_rng(3)
    x, y = rng.random(n), np.zeros(n)
    with graph("abc", interpreter=interp) as g:
        t0 = hetflow.empty(n)
        t1 = hetflow.empty(n)
        hetflow.forall(n, scale, 3.0, x, t0, device=device)    # a
        hetflow.forall(n, shift, t0, -1.0, t1, device=device)  # b
        hetflow.forall(n, square, t1, y, device=device)        # c
    return g, y, (t0, t1), (3.0 * x - 1.0) ** 2


def check_abc_fused_into_d(interp, device, n, exact=True):
    rules = RuleSet.default().extend(RuleSet.load(EXAMPLE_RULES))
    g, y, temps, expected = abc_program(n, interp, device)
    g.run(rules=rules)
    (d,) = g.current.nodes
    assert d.attrs["fused"] == ("scale", "shift", "square") and d.attrs["eliminated"] == ("t0", "t1")
    assert "fuse-gpu-chains" in g.current.reason          # the added, algorithm-specific rule
    # A GPU compiler may contract t * t - x into one FMA (one rounding fewer than NumPy).
    tol = dict(rtol=1e-12) if exact else dict(rtol=1e-12, atol=1e-12 * float(np.abs(expected).max()))
    np.testing.assert_allclose(y, expected, **tol)
    assert not any(t.materialized for t in temps)          # intermediates never allocated
    plain, y_plain, _, _ = abc_program(n, interpreter(*interp.topology.devices), device)
    plain.run(rules=RuleSet())
    if exact:
        np.testing.assert_array_equal(y, y_plain)          # identical to the unfused run
    else:
        np.testing.assert_allclose(y, y_plain, **tol)


def test_7_abc_on_a_gpu_fused_into_d():
    check_abc_fused_into_d(interpreter(get_device("cpu0"), simulated_device("gpu", 9)), "gpu9", 10_000)


@pytest.mark.simgpu
def test_7_abc_on_the_simulated_gpu_fused_into_d(gpu_device):
    check_abc_fused_into_d(interpreter(get_device("cpu0"), gpu_device), gpu_device.id, 64)


@pytest.mark.gpu
def test_7_abc_on_a_real_gpu_fused_into_d(gpu_device):
    check_abc_fused_into_d(interpreter(get_device("cpu0"), gpu_device), gpu_device.id, 1 << 20, exact=False)


@pytest.mark.simgpu
def test_6_new_kind_of_processor_gets_code_stored_and_run(gpu_device, tmp_path, monkeypatch):
    monkeypatch.setenv("HETFLOW_CACHE_DIR", str(tmp_path))
    interp = interpreter(get_device("cpu0"))             # the GPU is not there yet
    g, out, expected = saxpy_graph(interp, n=64)
    rules = RuleSet.default()
    rules.replace(Rule("adopt-new-devices", when="happened('device_added')", match=NodePattern(op="forall"),
                       then=[Compile(), Partition(kinds=["gpu"])], priority=80))
    g.run(rules=rules)
    assert interp.topology.kinds() == {"cpu"} and repository().entries(saxpy)[0].name.startswith("cpu-")

    interp.monitor.inject("device_added", device=gpu_device)   # a new kind of processor
    out[:] = 0
    g.run(rules=rules)
    node = g.current.nodes[0]
    assert node.attrs["compiled"] == ("cpu0", gpu_device.id)
    assert node.attrs["devices"] == (gpu_device.id,)
    kinds = sorted(p.name.split("-")[0] for p in repository().entries(saxpy))
    assert kinds == ["cpu", "gpu"]                         # generated and stored for the GPU
    np.testing.assert_array_equal(out, expected)           # and run there


def test_simulated_gpu_is_in_the_platform_table_only_under_the_simulator():
    # Scenario 6 needs a GPU the runtime can run on: the simulator's, marked simgpu above.
    assert all(d.simulated for d in devices() if d.kind == "gpu") or not any(d.simulated for d in devices())
