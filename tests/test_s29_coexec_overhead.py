"""What a co-executed launch teaches the performance model it cost beyond its work.

Oracle: the arithmetic by hand. A static split's imbalance is the split's, not a cost
of co-executing; counted as one, a badly split launch taught the model that the kernel
runs faster alone (bench/steal on the H200 host: stealing then ran on the GPU alone,
0.86x the ideal combined rate, where a split by hand gained on the GPU alone)."""
import numpy as np
import pytest

import hetflow
from hetflow.runtime import coexec, perfmodel
from hetflow.runtime.report import RunReport, WorkerStats


def _report(schedule, wall, *workers):
    return RunReport(n=sum(w.indices for w in workers), schedule=schedule, wall_s=wall, workers=list(workers))


def _worker(name, indices, busy, failed=False):
    device = name.split("/")[0]
    return WorkerStats(name=name, kind="cpu" if device.startswith("cpu") else "gpu", device_id=device,
                       chunks=1, indices=indices, busy_s=busy, failed=failed)


def test_a_static_split_costs_what_its_busiest_worker_did_not_account_for():
    # the CPU was handed 90% of the rows at a tenth of the GPU's speed: 0.9 s against 0.01 s
    report = _report("static", 0.92, _worker("cpu0/cores", 900, 0.9), _worker("gpu0", 100, 0.01))
    assert coexec.beyond_work(report, "static") == pytest.approx(0.02)


def test_stealing_costs_what_the_workers_rates_together_do_not_account_for():
    # 1000 rows at 1000 + 10000 rows/s together take 1/11 s; the launch took 0.1 s
    report = _report("steal", 0.1, _worker("cpu0/cores", 500, 0.5), _worker("gpu0", 500, 0.05))
    assert coexec.beyond_work(report, "steal") == pytest.approx(0.1 - 1000 / 11000)


def test_failed_workers_and_workers_that_ran_nothing_are_left_out():
    report = _report("static", 0.5, _worker("cpu0/cores", 400, 0.45), _worker("gpu0", 0, 0.0),
                     _worker("gpu1", 100, 0.49, failed=True))
    assert coexec.beyond_work(report, "static") == pytest.approx(0.05)
    assert coexec.beyond_work(_report("steal", 0.1, _worker("gpu0", 0, 0.0)), "steal") is None


@hetflow.kernel
def s29_scale(i, x, out):
    out[i] = 2.0 * x[i]


@pytest.mark.simgpu
def test_a_lopsided_static_launch_does_not_teach_a_large_overhead(gpu_device, tmp_path, monkeypatch):
    model = perfmodel.PerfModel(tmp_path / perfmodel.FILE_NAME, alpha=1.0)  # the last launch's figure
    monkeypatch.setattr(coexec, "perf_model", lambda: model)
    n = 2048
    x, out = np.random.default_rng(2).random(n), np.zeros(n)
    devices = ["cpu0", gpu_device.id]
    hetflow.forall(n, s29_scale, x, out, device=devices, schedule="static", shares=[0.5, 0.5])  # compiles
    report = hetflow.forall(n, s29_scale, x, out, device=devices, schedule="static", shares=[0.02, 0.98])
    np.testing.assert_array_equal(out, 2.0 * x)
    key = coexec.history_key(s29_scale, 1, (x, out), 1)
    busiest = max(w.busy_s for w in report.workers if w.indices)
    # the simulated GPU's 98% took far longer than the cores' 2%: that imbalance is not overhead
    assert model.overhead(key) <= max(0.0, report.wall_s - busiest) + 1e-9
