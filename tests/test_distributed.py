"""Running graphs across processes (SPEC §4.4): distributed arrays, halos, the central and
local interpreters, and stopping every rank when one fails.

Runs on several ranks go through mpiexec (scripts in tests/mpi/distributed_*.py, marked
``mpi``); results are checked against NumPy and against the one-process run. The
one-process behaviour, the interpreters' decisions and every bad input are checked
here in-process (a run not started by mpiexec is a run of one rank).
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from launcher import mpiexec as _mpiexec

import hetflow
from hetflow import cluster
from hetflow.cluster import central, darray, launch, local
from hetflow.errors import ArgumentError, ArgumentTypeError, DeviceError, RuleError, RuleSyntaxError, ShapeError
from hetflow.ir import runner, simulated_device

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = Path(__file__).parent / "mpi"
sys.path.insert(0, str(ROOT / "examples"))

import heat_distributed as heat  # noqa: E402


@hetflow.kernel
def stencil(i, out, left, centre, right):
    out[i] = left[i] + 10.0 * centre[i] + 100.0 * right[i]


@hetflow.kernel
def copy(i, out, src):
    out[i] = src[i]


@hetflow.kernel
def ahead(i, out, src):
    out[i] = src[i + 1]


@hetflow.kernel
def peek(i, src):
    t = src[i]  # noqa: F841  (reads, writes nothing)


@hetflow.kernel
def copy2d(i, j, out, src):
    out[i, j] = src[i, j]


# -- one process ------------------------------------------------------------------------

def test_heat_one_process_matches_numpy():
    grid = heat.solve(24, 7)
    np.testing.assert_allclose(grid, heat.numpy_solve(24, 7), rtol=0, atol=1e-12)


def test_periodic_stencil_wraps_through_the_halo():
    x = np.random.default_rng(1).random(19)
    u = cluster.asarray(x)
    y = cluster.zeros_like(u)
    cluster.forall(19, stencil, y, cluster.cshift(u, 0, -1), u, cluster.cshift(u, 0, 1))
    np.testing.assert_allclose(y.gather(), np.roll(x, 1) + 10 * x + 100 * np.roll(x, -1), rtol=1e-15)


def test_arrays_gather_reduce_and_views_on_one_rank():
    x = np.arange(24.0).reshape(6, 4)
    a = cluster.asarray(x, halo=2)
    assert a.local.shape == (10, 4) and a.block.shape == (6, 4) and (a.start, a.stop) == (0, 6)
    np.testing.assert_array_equal(a.gather(), x)
    np.testing.assert_array_equal(a.allgather(), x)
    assert a.sum() == x.sum() and a.min() == 0 and a.max() == 23
    view = hetflow.interior(hetflow.cshift(a, 1, 1), 1)  # one view API for every array
    assert isinstance(view, darray.DistView) and view.shape == (4, 2) and view.root is a
    assert view.ops == (("cshift", 1, 1), ("interior", (1, 1)))
    assert cluster.interior(cluster.cshift(a, 1, 1), 1).ops == view.ops  # the old spelling
    assert hetflow.section(a, (1, 0), (2, 4)).ops == (("section", (1, 0), (2, 4)),)
    assert cluster.cshift(x, 0, 1).shape == (6, 4)  # plain arrays get hetflow's own views
    b = cluster.zeros_like(a, shape=(6, 2))
    assert b.distribution is a.distribution and b.sum() == 0
    # NumPy wrapped a distributed array in a 0-d array of objects, silently
    with pytest.raises(ArgumentTypeError, match=r"darray\d+ is spread over the ranks: take darray\d+\.gather\(\)"):
        np.asarray(a)


def test_program_versions_on_one_rank():
    program, u, v = heat.setup(20, report_every=2)
    program.run(3)
    assert program.partitions == [(0, (20,))]
    first = program.central.versions[1]
    assert [n.attrs["rows"] for n in first.nodes] == [(0, 18), (0, 18)]
    assert "split-over-ranks" in first.reason
    ops = [n.op for n in program.local.current.nodes]
    assert ops == ["forall", "forall"]  # interiors never reach past the array: no halo needed
    assert all(n.attrs["devices"] == ("cpu0",) for n in program.local.current.nodes)
    np.testing.assert_allclose(u.gather(), heat.numpy_solve(20, 6), rtol=0, atol=1e-12)


def test_read_only_array_has_its_halo_exchanged_once_per_run():
    x = np.arange(8.0)
    src = cluster.asarray(x)
    out = cluster.zeros_like(src)
    with hetflow.graph("shift") as g:
        cluster.forall(8, copy, out, cluster.cshift(src, 0, 1))
    program = cluster.DistributedProgram(g)
    program.run(2)
    halo_nodes = [n for n in program.local.current.nodes if n.op == "halo"]
    assert len(halo_nodes) == 1 and halo_nodes[0].attrs["once"] is True
    np.testing.assert_array_equal(out.gather(), np.roll(x, -1))
    src.block[...] = x * 10  # changed between runs: the next run exchanges again
    program.run(1)
    np.testing.assert_array_equal(out.gather(), np.roll(x * 10, -1))


def test_a_captured_schedule_holds_for_each_ranks_part():
    """schedule='steal' co-executes a rank's part (the worker machinery's report per
    launch); without it one device runs the part whole (a one-device report)."""
    x = np.arange(64.0)
    ran = []
    for schedule in ("steal", None):
        src = cluster.asarray(x)
        out = cluster.zeros_like(src)
        with hetflow.graph("copy") as g:
            cluster.forall(64, copy, out, src, schedule=schedule)
        program = cluster.DistributedProgram(g)
        with hetflow.trace.record() as rec:
            program.run(2)
        np.testing.assert_array_equal(out.gather(), x)
        ran.append([(lp.report.n, lp.report.schedule) for lp in rec.loops])
    assert ran == [[(64, "steal")] * 2, [(64, "one-device")] * 2]


def test_rule_file_from_rank_0_joins_the_local_rules(tmp_path):
    path = tmp_path / "extra.toml"
    path.write_text('[[rule]]\nname = "mark"\nthen = [ { action = "set", var = "rank.marked", value = 2 } ]\n')
    program, _, _ = heat.setup(12, rule_file=path)
    program.run(1)
    assert "mark" in program.local.rules and program.monitor["rank.marked"] == 2
    path.write_text('[[rule]]\nname = "broken"\nwhen = "1 +"\nthen = [ { action = "fuse" } ]\n')
    with pytest.raises(RuleSyntaxError, match="extra.toml"):
        heat.setup(12, rule_file=path)
    with pytest.raises(RuleError, match=r"cannot read rule file .*missing.toml"):  # was FileNotFoundError
        heat.setup(12, rule_file=tmp_path / "missing.toml")


def test_run_distributed_in_one_process():
    assert cluster.run_distributed(lambda a, b: a + b, 2, b=3) == 5
    with pytest.raises(ZeroDivisionError):
        cluster.run_distributed(lambda: 1 / 0)
    assert cluster.asarray(np.ones(3)).sum() == 3.0  # nobody else to stop: still usable


@pytest.mark.simgpu
def test_heat_with_blocks_on_the_simulated_gpu(gpu_device):
    grid = heat.solve(10, 3, devices=[gpu_device.id])
    np.testing.assert_allclose(grid, heat.numpy_solve(10, 3), rtol=0, atol=1e-12)


# -- the interpreters' decisions -----------------------------------------------------------

def test_apportion_and_imbalance():
    assert darray.apportion(64, [3, 1], 1) == (48, 16)
    assert darray.apportion(10, [100, 1, 1], 2) == (6, 2, 2)  # the minimum comes from the largest
    assert central.imbalance((10, 10), (1.0, 1.0)) == 0.0
    assert central.imbalance((10, 10), (2.0, 1.0)) == pytest.approx(10 / 7.5 - 1)
    with pytest.raises(ShapeError, match="cannot give every one of 3 ranks 4 of 10 rows"):
        darray.apportion(10, [1, 1, 1], 4)
    with pytest.raises(ShapeError, match="positive finite weights"):
        darray.apportion(10, [1, float("nan")], 1)


def test_central_partitions_and_rebalances_four_ranks():
    program, _, _ = heat.setup(64)
    c = central.CentralInterpreter(program.nodes, 4, 64, 1)
    c.capacities([{"capacity": 1}] * 4)
    c.adjust()
    description = c.description()
    assert description["sizes"] == (16, 16, 16, 16)
    # launch rows i write global row i + 1 (interior): owners computed by hand
    rows = [(0, 15), (15, 31), (31, 47), (47, 62)]
    assert [p[1:] for p in description["pieces"][0]] == list(enumerate(rows))
    c.report([{"rows": 100, "seconds": 1.0, "available": 1.0}] * 4)
    assert c.adjust().number == 1  # balanced: nothing to do
    c.report([{"rows": 100, "seconds": 1.0, "available": a} for a in (1, 1, 1, 0.25)])
    version = c.adjust()
    assert version.number == 2 and "rebalance-ranks" in version.reason
    # 64 * [1, 1, 1, 0.25] / 3.25 = 19.69 x3, 4.92: largest remainders give 20, 20, 19, 5
    assert c.description()["sizes"] == (20, 20, 19, 5)
    assert c.monitor["ranks.imbalance"] < 0.1
    rebuilt = central.partial_version(c.description(), program.nodes)
    assert [(n.attrs["place"], n.attrs["rows"]) for n in rebuilt.nodes][:4] == [
        (0, (0, 19)), (1, (19, 39)), (2, (39, 58)), (3, (58, 62))]


def one_rank_on_cpu_and_gpu7():
    """(local interpreter, its first version): the heat program on one rank whose
    devices are cpu0 and a simulated gpu7."""
    program, u, _ = heat.setup(16)
    c = central.CentralInterpreter(program.nodes, 1, 16, 1)
    c.capacities([{"capacity": 1}])
    c.adjust()
    mine = local.LocalInterpreter(0, [hetflow.get_device("cpu0"), simulated_device("gpu", 7)])
    version = mine.materialise(central.partial_version(c.description(), program.nodes),
                               u.distribution.bounds)
    return mine, version


def test_local_rules_place_on_every_device_and_follow_utilization():
    mine, version = one_rank_on_cpu_and_gpu7()
    # every device, no shares: the runtime's model splits the launch or picks one device
    assert [(n.attrs["devices"], n.attrs.get("shares")) for n in version.nodes] == [(("cpu0", "gpu7"), None)] * 2
    assert version.nodes[0].attrs["compiled"] == ("cpu0", "gpu7")
    assert mine.monitor["rank.available"] == 1.0
    mine.monitor.inject("utilization", device="gpu7", value=0.6)  # another process took 60%
    version = mine.adjust()
    assert "share-busy-devices" in version.reason and "events: utilization" in version.reason
    # shares in proportion to what is left: 1.0 and 0.4
    assert version.nodes[0].attrs["shares"] == {"cpu0": 0.714286, "gpu7": 0.285714}
    assert mine.monitor["rank.available"] == 0.7
    assert mine.capacity(4) == {"capacity": 5, "devices": ["cpu0", "gpu7"]}


# -- bad input -----------------------------------------------------------------------------

def test_launch_errors():
    u = cluster.asarray(np.zeros(10))
    y = cluster.zeros_like(u)
    other = cluster.zeros(10)
    with pytest.raises(ShapeError, match="argument src is a ndarray, not a distributed array"):
        cluster.forall(10, copy, y, np.zeros(10))
    with pytest.raises(ShapeError, match="2 different distributions"):
        cluster.forall(10, copy, y, other)
    with pytest.raises(ShapeError, match=r"subscripts src other than at the launch's row index"):
        cluster.forall(9, ahead, y, u)
    with pytest.raises(ShapeError, match="writes no distributed array"):
        cluster.forall(10, peek, u)
    with pytest.raises(ShapeError, match="writes out through a cshift that wraps"):
        cluster.forall(10, copy, cluster.cshift(y, 0, 1), u)
    with pytest.raises(ShapeError, match="wraps inside a part of the array"):
        cluster.forall(8, copy, cluster.interior(y, 1), cluster.cshift(cluster.interior(u, 1), 0, 1))
    with pytest.raises(ShapeError, match="give the array a halo of at least 2"):
        cluster.forall(10, copy, y, cluster.cshift(u, 0, 2))
    with pytest.raises(ShapeError, match="launch of 'copy' over 10 rows, but src has only 8"):
        cluster.forall(10, copy, y, cluster.interior(u, 1))
    with pytest.raises(ArgumentTypeError, match="takes 2 data argument"):
        cluster.forall(10, copy, y)
    with pytest.raises(ArgumentTypeError, match="not a hetflow kernel"):
        cluster.forall(10, lambda i, a: None, y)
    wide = cluster.zeros((4, 6), dim=1)
    with pytest.raises(ShapeError, match="distribute along dim 0"):
        cluster.forall((4, 6), copy2d, wide, cluster.zeros_like(wide))


def test_array_errors():
    with pytest.raises(ShapeError, match="every rank needs at least 1"):
        cluster.zeros((0, 3))
    with pytest.raises(ShapeError, match="halo must be a whole number >= 0"):
        cluster.zeros(5, halo=-1)
    with pytest.raises(ArgumentTypeError, match="a shape must be an int or a tuple of ints"):
        cluster.zeros("abc")
    with pytest.raises(ShapeError, match="at least one dimension"):
        cluster.zeros(())
    with pytest.raises(ShapeError, match="dim 2 is out of range"):
        cluster.zeros((3, 3), dim=2)
    with pytest.raises(ShapeError, match=r"parts must give one share per rank \(1\)"):
        cluster.zeros(5, parts=[1, 1])
    a = cluster.zeros((6, 2))
    with pytest.raises(ArgumentError, match="root must be a rank in 0..0, not 3"):
        a.gather(root=3)
    with pytest.raises(ShapeError, match="needs extent 6 along dim 0"):
        cluster.zeros_like(a, shape=(5, 2))
    with pytest.raises(ArgumentTypeError, match="empty_like needs a DistArray"):
        cluster.empty_like(np.zeros(3))
    with pytest.raises(DeviceError, match="no device with id 'tpu0'"):
        cluster.zeros(4, device="tpu0")
    with pytest.raises(ShapeError, match="needs 1 sizes adding up to 6"):
        a.distribution.resize((3, 3))
    with pytest.raises(ShapeError, match=r"one weight per rank \(1\)"):
        a.distribution.apportion([1.0, 1.0])
    with pytest.raises(ArgumentTypeError, match="'band' does not apply to dtype float64"):
        a.reduce("band")
    with pytest.raises(ArgumentError, match="unknown reduction op 'median'"):
        a.reduce("median")
    with pytest.raises(ShapeError, match="interior: delta"):
        cluster.interior(a, 4)


def test_program_and_session_errors(monkeypatch):
    x = np.zeros(6)
    with hetflow.graph() as g:
        hetflow.forall(6, copy, x, x)
    with pytest.raises(ArgumentError, match="is not a launch over distributed arrays"):
        cluster.DistributedProgram(g)
    program, _, _ = heat.setup(8)
    with pytest.raises(ArgumentError, match="report_every must be an integer >= 1"):
        cluster.DistributedProgram(hetflow.graph(), report_every=0)
    with pytest.raises(ArgumentError, match="is empty"):
        cluster.DistributedProgram(hetflow.graph())
    with pytest.raises(ArgumentError, match="iterations must be an integer >= 0"):
        program.run(-1)
    with pytest.raises(ArgumentError, match="comm must be a hetflow communicator"):
        cluster.session("world")
    monkeypatch.setenv("HETFLOW_CPU_THREADS", "many")
    with pytest.raises(ArgumentError, match="HETFLOW_CPU_THREADS must be a whole number >= 1"):
        launch.share_cores(0, 1)
    with pytest.raises(RuleError, match="which this rank did not capture"):
        central.partial_version({"version": 1, "reason": "", "pieces": {999: ()}}, program.nodes)
    with pytest.raises(RuleError, match="weight must be 'capacity' or 'speed'"):
        central.Apportion("luck")


def test_cpu_threads_setting(monkeypatch):
    import numba

    before = numba.get_num_threads()
    monkeypatch.setenv("HETFLOW_CPU_THREADS", "1")
    try:
        assert launch.share_cores(0, 1) == (1, None, False)
        assert numba.get_num_threads() == 1
    finally:
        numba.set_num_threads(before)


# -- under mpiexec -----------------------------------------------------------------------------



def _environment():
    environment = dict(os.environ)
    package_root = str(Path(hetflow.__file__).parents[1])
    environment["PYTHONPATH"] = os.pathsep.join(
        [package_root] + [p for p in [environment.get("PYTHONPATH")] if p])
    return environment


def run_script(ranks, script, *args, timeout=90):
    """tests/mpi/SCRIPT under mpiexec -n RANKS (0: plain python, no launcher)."""
    cmd = [sys.executable, str(SCRIPTS / script), *map(str, args)]
    if ranks:
        cmd = _mpiexec() + ["-n", str(ranks)] + cmd
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_environment())
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{output}"
    return output


@pytest.fixture(scope="module")
def one_process_grid(tmp_path_factory):
    out = tmp_path_factory.mktemp("heat") / "one.npy"
    assert "distributed ok on 1 ranks" in run_script(0, "distributed_check.py", out)
    return np.load(out)


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_same_result_on_any_number_of_ranks(ranks, one_process_grid, tmp_path):
    out = tmp_path / f"ranks{ranks}.npy"
    assert f"distributed ok on {ranks} ranks" in run_script(ranks, "distributed_check.py", out)
    np.testing.assert_allclose(np.load(out), one_process_grid, rtol=0, atol=1e-12)


@pytest.mark.mpi
@pytest.mark.parametrize("mode,ranks", [("raise", 3), ("reduce", 2), ("timeout", 2)])
def test_a_failing_rank_stops_every_rank(mode, ranks):
    output = run_script(ranks, "distributed_failures.py", mode)
    for rank in range(ranks):
        assert f"rank {rank}: {mode} ok" in output, output


@pytest.mark.mpi
def test_injected_feedback_rebalances_rows():
    output = run_script(2, "distributed_rebalance.py")
    assert "rank 0: rebalance ok" in output and "rank 1: rebalance ok" in output, output


@pytest.mark.mpi
def test_the_early_report_replaces_a_poor_first_guess():
    output = run_script(2, "distributed_rebalance.py", "early")
    assert "rank 0: rebalance ok" in output and "rank 1: rebalance ok" in output, output


@pytest.mark.mpi
@pytest.mark.simgpu
def test_rebalance_moves_rows_between_simulated_gpus():
    output = run_script(2, "distributed_rebalance.py", "sim")
    assert "rank 0: rebalance ok" in output and "rank 1: rebalance ok" in output, output


@pytest.mark.mpi
@pytest.mark.gpu
@pytest.mark.skipif(sum(d.kind == "gpu" and not d.simulated for d in hetflow.devices()) < 2,
                    reason="needs two real GPUs (one per rank)")
def test_rebalance_moves_rows_between_real_gpus():
    output = run_script(2, "distributed_rebalance.py", "own")
    assert "rank 0: rebalance ok" in output and "rank 1: rebalance ok" in output, output


@pytest.mark.mpi
def test_bench_quick_runs_under_mpiexec():
    cmd = _mpiexec() + ["-n", "2", sys.executable, str(ROOT / "bench" / "distributed.py"), "--quick", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=90, env=_environment())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    import json

    rows = json.loads(proc.stdout)["rows"]
    assert [r["ranks"] for r in rows if ", cpu" in r["name"]] == [1, 2, 1, 2]
    assert all(r["ratio"] > 0 and r["eff_hetflow"] > 0 for r in rows)


def test_a_program_run_one_iteration_at_a_time_is_measured():
    # as hetflow demo drives it: run(1) per step. Only the first iteration after the
    # parts are made is left out of the rates the ranks report (none was reported before).
    program, _, _ = heat.setup(16)
    for _ in range(3):  # iterations 0-2, before the early report at iteration 3
        program.run(1)
    report = program.local.report()
    assert report["rows"] == 2 * 2 * 14 and report["seconds"] > 0, report  # 2 steps of 14 rows each


def test_local_rules_drop_a_device_that_keeps_running_nothing():
    mine, _ = one_rank_on_cpu_and_gpu7()
    mine.monitor.inject("utilization", device="gpu7", value=0.6)  # share-busy-devices active too
    for _ in range(runner.IDLE_RUNS):  # gpu7's copies outlast the loop: it runs nothing
        runner._count_idle(mine.monitor, heat.heat_step.name, {"cpu0": 14 * 14, "gpu7": 0})
    version = mine.adjust()
    assert "drop-idle-devices" in version.reason
    assert [n.attrs["shares"] for n in version.nodes] == [{"cpu0": 1.0}] * 2


# -- a rank that dies stops the run (issue 18, item 6) --------------------------------------------
def _run_to_the_end(ranks, mode, *launcher_options, timeout=60):
    """tests/mpi/rank_faults.py MODE under mpiexec; (exit status, output). The default
    comm timeout (300 s) stays: ending within ``timeout`` must owe nothing to it."""
    env = _environment()
    env.pop("HETFLOW_COMM_TIMEOUT", None)
    cmd = _mpiexec() + [*launcher_options, "-n", str(ranks), sys.executable,
                        str(SCRIPTS / "rank_faults.py"), mode]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(cmd)} still running after {timeout} s:\n{exc.stdout}{exc.stderr}")
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [3, 5])
def test_an_uncaught_exception_on_one_rank_aborts_the_run_with_its_traceback(ranks):
    code, output = _run_to_the_end(ranks, "raise")
    assert code != 0, output
    assert 'raise ValueError("user code broke on rank 1")' in output, output  # its traceback
    assert "ValueError: user code broke on rank 1" in output, output
    assert f"rank 1 raised an exception nobody caught; aborting all {ranks} ranks" in output, output


@pytest.mark.mpi
def test_an_uncaught_exception_in_a_thread_aborts_the_run():
    code, output = _run_to_the_end(3, "thread")
    assert code != 0, output
    assert "ZeroDivisionError" in output and "aborting all 3 ranks" in output, output


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [3, 5])
def test_a_rank_that_vanishes_mid_collective_fails_the_others_naming_it(ranks):
    # Without the launcher's clean-up, only the survivors' own liveness check can stop them.
    if "--oversubscribe" in _mpiexec():
        pytest.skip("-disable-auto-cleanup is an MPICH (Hydra) option")
    code, output = _run_to_the_end(ranks, "exit", "-disable-auto-cleanup")
    assert code != 0, output
    assert re.search(r"rank \d: CommError: rank \d: rank 1 \(process \d+\) died", output), output


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [3, 5])
def test_a_rank_killed_mid_collective_ends_the_run(ranks):
    # The launcher sees the signal and ends the run; a survivor that notices first names
    # the dead rank (CommError), either way long before the comm timeout.
    code, output = _run_to_the_end(ranks, "kill")
    assert code != 0, output
    assert "signal 9" in output or "rank 1 (process" in output, output
