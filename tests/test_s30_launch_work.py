"""What a launch worked, as a distributed program's ranks report it (their rates), and
the halo exchange of coherent blocks on two GPUs.

A rank's rate was its rows over the host's time for an iteration, less the halo
exchanges: on a GPU, where a step takes tens of microseconds, the host's own time
between launches outweighed the work, a rank's rate grew with its rows, and two equal
GPUs were cut 4:1. Now it counts each launch's work: its host time, or the GPU's time
of what it enqueued where that is more.
"""
import time

import numpy as np
import pytest
from test_distributed import run_script

import hetflow
from hetflow import RuleSet
from hetflow.ir.runner import run_version


@hetflow.kernel
def s30_scale(i, x):
    x[i] = 3.0 * x[i]


SPIN = 2_000_000  # steps of a dependent chain per index: milliseconds on a GPU


@hetflow.kernel
def s30_spin(i, x):
    acc = x[i]
    for k in range(SPIN):
        acc = acc * 0.999999 + 1e-9 * k
    x[i] = acc


def test_a_version_s_work_counts_its_launches_not_what_runs_between():
    x = np.arange(8.0)
    with hetflow.graph("between") as g:
        hetflow.forall(8, s30_scale, x)
        g.record("sleep", fn=time.sleep, args=(0.3,))
        hetflow.forall(8, s30_scale, x)
    version = g.run(RuleSet())  # compiles
    x[:] = np.arange(8.0)
    work = []
    started = time.perf_counter()
    run_version(version, g.monitor, g.name, work)
    elapsed = time.perf_counter() - started
    np.testing.assert_array_equal(x, 9.0 * np.arange(8.0))
    assert len(work) == 2  # one per launch, none for the sleep
    assert elapsed >= 0.3 and sum(w.seconds() for w in work) < 0.1, [w.seconds() for w in work]


@pytest.mark.gpu
def test_a_gpu_launch_s_work_is_the_gpu_s_time(gpu_device):
    n = 4096
    x = hetflow.array(np.ones(n))
    with hetflow.graph("spin") as g:
        hetflow.forall(n, s30_spin, x, device=gpu_device.id)
    version = g.run(RuleSet())  # compiles, moves x to the GPU
    gpu_device.synchronize()
    work = []
    started = time.perf_counter()
    run_version(version, g.monitor, g.name, work)
    gpu_device.synchronize()
    window = time.perf_counter() - started
    (launch,) = work
    # the launch returned once enqueued; the GPU's time lies within what the host saw
    assert launch.wall < launch.seconds() <= window, (launch.wall, launch.seconds(), window)
    assert launch.seconds() > 10 * launch.wall, (launch.wall, launch.seconds())
    expected = 1.0  # every index starts at 1 and ran twice (g.run, then run_version)
    for _ in range(2):
        for k in range(SPIN):
            expected = expected * 0.999999 + 1e-9 * k
    np.testing.assert_allclose(x.read(), expected, rtol=1e-9)  # a GPU may contract into FMAs


@pytest.mark.mpi
@pytest.mark.gpu
@pytest.mark.skipif(sum(d.kind == "gpu" and not d.simulated for d in hetflow.devices()) < 2,
                    reason="needs two real GPUs")
def test_two_equal_gpu_ranks_keep_equal_rows_and_exchange_halos_between_gpus():
    output = run_script(2, "s30_two_gpus.py", timeout=240)
    assert "rank 0: two gpus ok" in output and "rank 1: two gpus ok" in output, output


def test_a_rank_keeps_few_launches_work_between_reports():
    """A rank sums its finished launches' work as it goes (a GPU's holds CUDA events), so
    a long report period keeps little; its report counts every row and launch."""
    import sys
    from pathlib import Path

    from hetflow import cluster
    from hetflow.cluster.local import KEPT_WORK

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    import heat_distributed as heat

    n, iterations = 12, 60

    def body():
        program, u, v = heat.setup(n, devices=["cpu0"], report_every=1000)
        program.run(iterations)
        local = program.local
        kept = len(local._window[2])
        rows_per_iteration = 2 * (n - 2)  # two launches over the interior rows
        report = local.report()
        return kept, report, rows_per_iteration

    kept, report, rows_per_iteration = cluster.run_distributed(body)
    assert kept <= KEPT_WORK + 2
    # the early report, before iteration 3, took iterations 1 and 2 (iteration 0, the
    # first after the parts were made, is not counted): this one the 57 after them
    assert report["rows"] == (iterations - 3) * rows_per_iteration, report
    assert 0.0 < report["seconds"] < 60.0
