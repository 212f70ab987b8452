"""The monitor (variables, events, sources, modes) and the guarded variant cache."""
import threading
import time

import numpy as np
import pytest

import hetflow
from hetflow.errors import ArgumentError, DeviceError
from hetflow.ir import Monitor, MonitorEvent, Rule, RuleSet, Set, Topology, VariantCache, graph, simulated_device
from hetflow.ir.monitor import StatusSource
from hetflow.platform.devices import get_device


class Script:
    """A source replaying fixed readings (the way a sensor would report them)."""

    name = "script"

    def __init__(self, *readings):
        self.readings = list(readings)
        self.calls = 0
        self.sampled = threading.Event()

    def sample(self):
        self.calls += 1
        self.sampled.set()
        return self.readings[min(self.calls - 1, len(self.readings) - 1)]


def monitor(*sources, **kw):
    return Monitor(Topology([get_device("cpu0")]), sources=list(sources), **kw)


def test_device_events_change_the_topology():
    mon = monitor()
    gpu = simulated_device("gpu", 0)
    mon.inject("device_added", device=gpu)
    assert mon.topology.count("gpu") == 1 and mon.topology.kinds() == {"cpu", "gpu"}
    mon.inject("device_failed", device="gpu0")
    assert mon.topology.count("gpu") == 0 and mon.topology.failed == {"gpu0"}
    mon.inject("device_added", device=gpu)      # it came back
    mon.inject("device_removed", device=gpu)
    assert mon.topology.count("device") == 1
    mon.inject("node_added")
    mon.inject("node_added", count=5)
    mon.inject("node_removed")
    assert mon.topology.count("node") == 4
    assert [e.kind for e in mon.drain()] == ["device_added", "device_failed", "device_added", "device_removed",
                                              "node_added", "node_added", "node_removed"]
    assert mon.drain() == ()


def test_feedback_events_set_variables():
    mon = monitor()
    mon.topology.add(simulated_device("gpu", 0))
    mon.topology.add(simulated_device("gpu", 1))
    mon.inject("utilization", device="gpu1", value=0.6)
    mon.inject("utilization", device="gpu0", value=0.2)
    assert (mon["gpu0.utilization"], mon["gpu1.utilization"], mon["gpu.utilization"]) == (0.2, 0.6, 0.6)
    mon.inject("memory_pressure", free=123)
    assert mon["free_memory"] == 123 and mon["memory.pressure"] is True
    mon.inject("input_changed", size=10, dtype=np.float32)
    assert (mon["input.size"], mon["input.dtype"]) == (10, "float32")
    mon.inject("complexity_changed", value=3)
    assert mon["complexity"] == 3
    custom = mon.inject(MonitorEvent("checkpoint", {"step": 4}))
    assert mon.pending()[-1] is custom


@pytest.mark.parametrize("kind, data, fragment", [
    ("device_added", {"device": "gpu9"}, "device record with id and kind"),
    ("device_failed", {"device": "gpu9"}, "not in the topology"),
    ("device_removed", {}, "needs device="),
    ("node_added", {"count": 0}, "integer >= 1"),
    ("utilization", {"device": "gpu0", "value": 1.5}, "in [0, 1]"),
    ("memory_pressure", {"free": -1}, "needs free="),
    ("input_changed", {}, "needs size="),
    ("input_changed", {"size": 1, "dtype": "nope"}, "is not a dtype"),
    ("complexity_changed", {}, "needs value="),
    ("", {}, "non-empty kind"),
])
def test_malformed_events(kind, data, fragment):
    with pytest.raises(ArgumentError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        monitor().inject(kind, **data)


def test_other_bad_monitor_input():
    with pytest.raises(ArgumentError, match="mode must be one of"):
        monitor(mode="sometimes")
    with pytest.raises(ArgumentError, match="period must be positive"):
        monitor(period=0)
    with pytest.raises(ArgumentError, match="needs mode='continuous'"):
        monitor().start()
    with pytest.raises(ArgumentError, match="non-empty string"):
        monitor().set("", 1)
    with pytest.raises(ArgumentError, match="either a MonitorEvent or a kind"):
        monitor().inject(MonitorEvent("x"), extra=1)


def test_variables_and_change_tracking():
    mon = monitor()
    rev = mon.revision
    assert mon.set("a", 1) and not mon.set("a", 1) and mon.set("a", 1.0)   # 1.0 is another value
    assert mon.changed_since(rev, {"a"}) and not mon.changed_since(mon.revision, {"a"})
    assert not mon.changed_since(rev, {"b"})
    assert mon.get("b", "none") == "none" and mon.snapshot()["a"] == 1.0


def test_sampling_turns_steps_into_events():
    script = Script({"gpu0.utilization": 0.1, "free_memory": 10 ** 12},
                    {"gpu0.utilization": 0.15, "free_memory": 10 ** 12},
                    {"gpu0.utilization": 0.7, "free_memory": 100})
    mon = monitor(script, memory_pressure=1000, utilization_step=0.2)
    assert mon["gpu0.utilization"] == 0.1 and mon.pending() == ()
    mon.sample()
    assert mon["gpu0.utilization"] == 0.15 and mon.pending() == ()   # below the step
    mon.sample()
    kinds = [e.kind for e in mon.drain()]
    assert kinds == ["utilization", "memory_pressure"]
    assert mon["gpu.utilization"] == 0.7 and mon["memory.pressure"] is True


def test_a_failing_source_is_skipped(caplog):
    class Broken:
        name = "broken"

        def sample(self):
            raise OSError("sensor unplugged")

    mon = monitor(Broken(), Script({"x": 1}))
    assert mon["x"] == 1
    assert "monitor source broken failed: sensor unplugged" in caplog.text


def test_status_source_reads_the_host_as_psutil_does():
    import psutil

    values = StatusSource([get_device("cpu0")]).sample()
    assert 0.0 <= values["cpu0.utilization"] <= 1.0
    assert abs(values["free_memory"] - psutil.virtual_memory().available) < 2**30  # same reading, moments apart


@pytest.mark.gpu
def test_status_source_reads_the_gpus_through_nvml():
    import pynvml

    pynvml.nvmlInit()
    values = StatusSource().sample()
    total = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).total
    assert 0.0 <= values["gpu0.utilization"] <= 1.0 and 0 < values["gpu0.free_memory"] <= total
    assert 0.0 <= values["gpu0.device_utilization"] <= 1.0
    mon = Monitor()                                # the default sources include NVML here
    assert 0.0 <= mon["gpu.utilization"] <= 1.0 and mon["gpu0.free_memory"] > 0


def test_topology_lookups():
    topo = Topology([get_device("cpu0"), simulated_device("gpu", 4)], nodes=2)
    assert topo.get("gpu4").simulated and topo.of_kind("gpu")[0].id == "gpu4"
    assert (topo.count("cpu"), topo.count("gpu"), topo.count("device"), topo.count("node")) == (1, 1, 2, 2)
    with pytest.raises(DeviceError, match="no device 'gpu7' in the topology \\(devices: cpu0, gpu4\\)"):
        topo.get("gpu7")


def test_periodic_mode_samples_at_safe_points_after_a_period():
    script = Script({"x": 1})
    mon = monitor(script, mode="periodic", period=0.05)
    calls = script.calls
    mon.poll()
    assert script.calls == calls               # the period has not passed
    time.sleep(0.06)
    mon.poll()
    assert script.calls == calls + 1


def test_continuous_mode_samples_in_the_background_until_stopped():
    script = Script({"x": 1})
    with monitor(script, mode="continuous", period=0.01) as mon:
        script.sampled.clear()
        assert script.sampled.wait(5)
        assert mon._thread is not None and mon._thread.is_alive()
    assert mon._thread is None
    calls = script.calls
    time.sleep(0.05)
    assert script.calls == calls


def test_run_reports_become_throughput():
    mon = monitor()
    mon.record_run({"cpu0": 0.25, "gpu0": 0.75}, items=1000, seconds=0.5)
    assert mon["throughput.cpu0"] == 500.0 and mon["throughput.gpu0"] == 1500.0


@hetflow.kernel
def double(i, x, out):
    out[i] = 2.0 * x[i]


def test_runs_report_throughput_and_input_changes():
    x, y = np.ones(8), np.zeros(8)
    with graph(monitor=monitor()) as g:
        hetflow.forall(8, double, x, y, device="cpu0")
    rules = RuleSet([Rule("seen", when="happened('input_changed')", then=Set("reshaped", True))])
    g.run(rules=rules)
    assert g.monitor["input.size"] == 16 and g.monitor["input.dtype"] == "float64"
    assert g.monitor["throughput.cpu0"] > 0
    assert g.monitor.get("reshaped") is None
    x.resize((2, 4), refcheck=False)              # the input changed shape in place
    y.resize((2, 4), refcheck=False)
    g.monitor.drain()
    g.adjust(rules)
    assert g.monitor["reshaped"] is True


# -- the variant cache -----------------------------------------------------------------------------

def test_variant_cache_counts_hits_and_misses():
    cache = VariantCache()
    built = []

    def build():
        built.append(1)
        return object()

    a = cache.get_or_build(("fuse", "k"), ("cpu", "x86"), {"ndim": 1, "dtype": "f8"}, build)
    b = cache.get_or_build(("fuse", "k"), ("cpu", "x86"), {"dtype": "f8", "ndim": 1}, build)
    c = cache.get_or_build(("fuse", "k"), ("gpu", "sm_90"), {"ndim": 1, "dtype": "f8"}, build)
    assert a is b and a is not c and len(built) == 2
    assert cache.stats() == {"entries": 2, "hits": 1, "misses": 2}
    assert cache.lookup(("fuse", "k"), ("gpu", "sm_90"), {"ndim": 1, "dtype": "f8"}) is c
    assert cache.lookup(("fuse", "other")) is None
    assert (cache.hits, cache.misses) == (2, 3)
    assert VariantCache.guard(("fuse", "k"), ("cpu", "x86"), {"ndim": 1, "dtype": "f8"}) in cache
    cache.clear()
    assert len(cache) == 0
