"""Co-execution only where it pays: a launch runs on its fastest device alone when the
performance model says that finishes sooner than every device together plus what
co-execution costs beyond the work."""
import numpy as np
import pytest

import hetflow
from hetflow.runtime import coexec, perfmodel
from hetflow.runtime.report import LaunchReport, RunReport


@pytest.fixture(autouse=True)
def fresh_history(tmp_path, monkeypatch):
    """A performance model of each test's own: what earlier runs left in the cache
    directory must not decide (nor be erased: it may be a user's)."""
    model = perfmodel.PerfModel(tmp_path / perfmodel.FILE_NAME)
    monkeypatch.setattr(coexec, "perf_model", lambda: model)


@hetflow.kernel
def triple(i, x, out):
    out[i] = 3.0 * x[i]


@hetflow.kernel
def treble(i, x, out):
    out[i] = x[i] * 3.0


def _names(devices) -> list:
    """The workers' model keys of a launch co-executed beside a GPU: a CPU's cores as a team."""
    return [coexec._device_key(d) + (coexec.TEAM if d.kind == "cpu" else "") for d in devices]


def _teach(kernel, rates: dict, overhead: float, n: int, alone=None):
    """Give the model the history of ``kernel`` over ``n`` rows: rates in co-execution
    beside a GPU, and alone (default: the same)."""
    model = coexec.perf_model()
    key = coexec.history_key(kernel, 1, (np.zeros(1),), 1)  # NumPy arrays beside a GPU
    for dev, rate in rates.items():
        model.observe(key, _names([hetflow.get_device(dev)])[0], rate)
    for dev, rate in (rates if alone is None else alone).items():
        model.observe(key, coexec._device_key(hetflow.get_device(dev)) + coexec.ALONE, rate)
    model.observe_overhead(key, overhead)
    coexec._launches_alone.pop(key, None)
    return key


@pytest.mark.simgpu
def test_a_launch_runs_alone_where_co_execution_costs_more_than_it_gains(gpu_device, monkeypatch):
    n = 4096
    x, out = np.random.default_rng(0).random(n), np.zeros(n)
    # one GPU worth a thousand cores, and a millisecond of co-execution overhead
    _teach(triple, {"cpu0": 1e6, gpu_device.id: 1e9}, 1e-3, n)
    report = hetflow.forall(n, triple, x, out, device=["cpu0", gpu_device.id])
    assert isinstance(report, LaunchReport) and report.workers[0].device_id == gpu_device.id
    np.testing.assert_array_equal(out, 3.0 * x)
    # once in a while a launch co-executes anyway, to measure again
    monkeypatch.setattr(coexec, "probe_interval", lambda together, alone: 2)
    report = hetflow.forall(n, triple, x, out, device=["cpu0", gpu_device.id])
    assert isinstance(report, RunReport) and not isinstance(report, LaunchReport)


@pytest.mark.simgpu
def test_devices_of_like_speed_co_execute(gpu_device):
    n = 4096
    x, out = np.random.default_rng(1).random(n), np.zeros(n)
    _teach(treble, {"cpu0": 1e4, gpu_device.id: 1e4}, 1e-6, n)
    report = hetflow.forall(n, treble, x, out, device=["cpu0", gpu_device.id])
    assert {w.device_id for w in report.workers} == {"cpu0", gpu_device.id}
    np.testing.assert_array_equal(out, 3.0 * x)


@hetflow.kernel
def thrice(i, x, out):
    out[i] = x[i] + x[i] + x[i]


@pytest.mark.simgpu
def test_a_gpu_runs_alone_once_then_the_fastest_alone_runs(gpu_device):
    """Chunked co-execution can undersell a GPU: once co-execution has shown its cost, a
    GPU runs one launch alone, and its rate alone decides after that; a CPU's rate alone
    is its team's rate until it has run alone."""
    n = 4096
    x, out = np.random.default_rng(2).random(n), np.zeros(n)
    key = _teach(thrice, {"cpu0": 1e7, gpu_device.id: 1e6}, 1e-3, n, alone={})
    model = coexec.perf_model()
    solo = {d: coexec._device_key(hetflow.get_device(d)) + coexec.ALONE for d in ("cpu0", gpu_device.id)}
    hetflow.forall(n, thrice, x, out, device=gpu_device.id)  # compiled: its time alone is the GPU's own
    first = hetflow.forall(n, thrice, x, out, device=["cpu0", gpu_device.id]).workers[0].device_id
    assert first == gpu_device.id and model.throughput(key, solo[gpu_device.id]) > 0
    assert model.throughput(key, solo["cpu0"]) is None  # never ran alone: not needed to decide
    second = hetflow.forall(n, thrice, x, out, device=["cpu0", gpu_device.id]).workers[0].device_id
    assert second == "cpu0"  # 1e7 against a simulated GPU
    model.observe(key, solo[gpu_device.id], 1e14)  # as if the GPU alone were far faster
    model.observe(key, solo[gpu_device.id], 1e14)
    report = hetflow.forall(n, thrice, x, out, device=["cpu0", gpu_device.id])
    assert report.workers[0].device_id == gpu_device.id
    np.testing.assert_allclose(out, 3 * x)


@hetflow.kernel
def quadruple(i, x, out):
    out[i] = 4.0 * x[i]


def test_probing_costs_a_small_share_of_the_time_alone_and_comes_within_probe_seconds():
    # a co-executed launch costing 300 launches alone (a memory-bound stencil on an H100):
    # a probe costs the 299 beyond the one it replaces
    alone = 1.3e-4
    k = coexec.probe_interval(300 * alone, alone)
    assert 299 * alone / (k * alone) <= coexec.PROBE_SHARE * 1.001
    assert 299 * alone / ((k + 1) * alone) < coexec.PROBE_SHARE <= 299 * alone / ((k - 1) * alone)
    # one 4% dearer than the launch alone (a slow one tipped the history): every 4 launches
    assert coexec.probe_interval(1.04 * 0.025, 0.025) == 4
    assert coexec.probe_interval(0.025, 0.025) == 1
    # a co-executed launch of seconds: probed once in PROBE_SECONDS of launches alone
    assert coexec.probe_interval(5.0, alone) * alone <= coexec.PROBE_SECONDS
    assert coexec.probe_interval(5.0, alone) * alone > 0.99 * coexec.PROBE_SECONDS
    # launches alone of seconds each: every few
    assert coexec.probe_interval(40.0, 4.0) == 2


@pytest.mark.simgpu
def test_what_co_execution_last_cost_spaces_the_probes(gpu_device):
    """The model may think co-executing cheap where its last run was dear (rows that had
    to cross the bus): the launches alone between probes follow the dearer figure."""
    n = 4096
    targets = [hetflow.get_device("cpu0"), gpu_device]
    counts = [1, 1]
    model = coexec.perf_model()

    def launches_alone_before_a_probe(limit):
        coexec._launches_alone.pop(key, None)
        for k in range(limit):
            if coexec._alone(model, key, targets, _names(targets), counts, n) is None:
                return k
        return limit

    key = _teach(quadruple, {"cpu0": 1e6, gpu_device.id: 1e9}, 1e-6, n)
    coexec._probe_cost.pop(key, None)
    cheap = launches_alone_before_a_probe(100_000)
    coexec._probe_cost[key] = 1e-3
    dear = launches_alone_before_a_probe(100_000)
    alone = n / 1e9
    assert cheap == coexec.probe_interval(n / (1e6 + 1e9) + 1e-6, alone) - 1
    assert dear == coexec.probe_interval(1e-3, alone) - 1 > 10 * cheap


@hetflow.kernel
def quintuple(i, x, out):
    out[i] = 5.0 * x[i]


@pytest.mark.simgpu
def test_a_gpu_that_ran_no_rows_co_executing_is_measured_alone_instead(gpu_device):
    """A first co-executed launch may leave a GPU without a rate (it compiled while the
    CPUs took every row): the GPU is then measured alone rather than co-executed again,
    and its rate alone decides."""
    n = 4096
    targets = [hetflow.get_device("cpu0"), gpu_device]
    key = _teach(quintuple, {"cpu0": 1e6}, 1e-3, n, alone={})
    model = coexec.perf_model()
    assert coexec._alone(model, key, targets, _names(targets), [1, 1], n) is gpu_device  # to measure it
    model.observe(key, coexec._device_key(gpu_device) + coexec.ALONE, 1e9)
    assert coexec._alone(model, key, targets, _names(targets), [1, 1], n) is gpu_device  # far faster alone
    for _ in range(40):  # the moving average forgets 1e9
        model.observe(key, coexec._device_key(gpu_device) + coexec.ALONE, 1e3)
    assert coexec._alone(model, key, targets, _names(targets), [1, 1], n).id == "cpu0"  # the GPU now far slower


@hetflow.kernel
def sextuple(i, x, out):
    out[i] = 6.0 * x[i]


@pytest.mark.simgpu
def test_a_launch_alone_by_a_small_margin_is_probed_again_within_a_few_launches(gpu_device):
    """One slow co-executed launch can tip a history that favoured co-executing: where
    together costs only a little more than alone, the next probe comes soon (a probe
    costs only the difference)."""
    n = 4096
    targets = [hetflow.get_device("cpu0"), gpu_device]
    alone = n / 1e9
    key = _teach(sextuple, {"cpu0": 1e6, gpu_device.id: 1e9}, 1.045 * alone - n / (1e6 + 1e9), n)
    coexec._probe_cost.pop(key, None)
    model = coexec.perf_model()
    decisions = [coexec._alone(model, key, targets, _names(targets), [1, 1], n) for _ in range(5)]
    assert decisions == [gpu_device] * 3 + [None, gpu_device]


@hetflow.kernel
def septuple(i, x, out):
    out[i] = 7.0 * x[i]


@pytest.mark.simgpu
def test_a_launch_alone_that_compiles_teaches_no_rate_the_next_one_does(gpu_device):
    """A GPU's first launch of a kernel compiles its entry: timed, it would tell a GPU
    seconds slow alone, and the model would co-execute the kernel for good (the demo
    did, after an example had run the same kernel). The next launch alone is timed."""
    n = 4096
    x, out = np.random.default_rng(7).random(n), np.zeros(n)
    key = _teach(septuple, {"cpu0": 1e6, gpu_device.id: 1e6}, 1e-3, n, alone={})
    model = coexec.perf_model()
    solo = coexec._device_key(gpu_device) + coexec.ALONE
    devices = ["cpu0", gpu_device.id]
    assert hetflow.forall(n, septuple, x, out, device=devices).workers[0].device_id == gpu_device.id
    assert model.throughput(key, solo) is None  # it compiled: measured again next time
    assert hetflow.forall(n, septuple, x, out, device=devices).workers[0].device_id == gpu_device.id
    assert model.throughput(key, solo) > 0
    np.testing.assert_array_equal(out, 7.0 * x)


@hetflow.kernel
def octuple(i, x, out):
    out[i] = 8.0 * x[i]


def test_host_arrays_beside_a_gpu_keep_a_history_apart_from_resident_data():
    """A GPU copies host NumPy arrays in and out each launch; coherent arrays stay on it.
    Their histories are kept apart, so a NumPy run cannot teach a coherent one that its
    GPU is slow alone."""
    x = np.zeros(8)
    plain = perfmodel.kernel_key(octuple, 1)
    resident = coexec.history_key(octuple, 1, (hetflow.array(x), 2.0), 1)
    staged = coexec.history_key(octuple, 1, (hetflow.interior(x, 1), hetflow.array(x)), 1)
    assert resident == plain and staged == plain + coexec.STAGED
    assert coexec.history_key(octuple, 1, (x,), 0) == plain  # no GPU: nothing is staged


@hetflow.kernel
def nonuple(i, x, out):
    out[i] = 9.0 * x[i]


@pytest.mark.simgpu
def test_a_history_that_tells_a_gpu_slow_alone_is_rechecked_at_a_small_cost(gpu_device):
    """A GPU timed alone while another program loaded it looks slow alone for good: the
    kernel co-executes, and nothing would time the GPU alone again. Now and then it runs
    alone once more and is timed; where the history was right, that costs at most
    PROBE_SHARE of the time co-executing."""
    n = 4096
    targets = [hetflow.get_device("cpu0"), gpu_device]
    key = _teach(nonuple, {"cpu0": 1e6, gpu_device.id: 1e6}, 0.0, n, alone={"cpu0": 5e5, gpu_device.id: 8e5})
    coexec._launches_together.pop(key, None)
    model = coexec.perf_model()
    together, alone = n / 2e6, n / 8e5
    decisions = [coexec._alone(model, key, targets, _names(targets), [1, 1], n) for _ in range(2000)]
    rechecks = [k for k, d in enumerate(decisions) if d is not None]
    assert rechecks and all(decisions[k] is gpu_device for k in rechecks)
    gap = rechecks[1] - rechecks[0] if len(rechecks) > 1 else rechecks[0] + 1
    assert (alone - together) / (gap * together) <= coexec.PROBE_SHARE  # what rechecking costs
    assert (alone - together) / ((gap - 1) * together) > coexec.PROBE_SHARE  # and no rarer than that
    # the recheck is timed (a GPU with a figure alone is otherwise timed once in 8 launches)
    x, out = np.random.default_rng(9).random(n), np.zeros(n)
    hetflow.forall(n, nonuple, x, out, device=gpu_device.id)  # compiled: a time alone is the GPU's
    coexec._retime.add(key)
    coexec._run_alone(model, key, hetflow.runtime.launch.bind(nonuple, n, (x, out), gpu_device))
    assert key not in coexec._retime and model.throughput(key, coexec._device_key(gpu_device) + coexec.ALONE) != 8e5
    np.testing.assert_array_equal(out, 9.0 * x)
