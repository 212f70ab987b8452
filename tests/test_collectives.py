"""Global reduce/allreduce (SPEC §5).

Multi-process behaviour runs under mpiexec (scripts in tests/mpi/, marked ``mpi``);
the schedule is checked here by executing every rank's plan in one process, and the
one-process communicator directly.
"""
import collections
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from launcher import mpiexec as _mpiexec

import hetflow
from hetflow import collectives
from hetflow.collectives import host, schedule
from hetflow.collectives.comm import check_launch
from hetflow.collectives.ops import resolve_op
from hetflow.errors import ArgumentError, ArgumentTypeError, CommError, ShapeError

SCRIPTS = Path(__file__).parent / "mpi"
LAUNCHER_VARIABLES = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE",
                      "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID")


# -- under mpiexec --------------------------------------------------------------------



def run_mpi(ranks, script, *args, env=None, timeout=120):
    """Run tests/mpi/SCRIPT under mpiexec -n RANKS with this interpreter's hetflow."""
    environment = dict(os.environ, **(env or {}))
    package_root = str(Path(hetflow.__file__).resolve().parents[1])
    environment["PYTHONPATH"] = os.pathsep.join(
        [package_root] + [p for p in [environment.get("PYTHONPATH")] if p])
    cmd = _mpiexec() + ["-n", str(ranks), sys.executable, str(SCRIPTS / script), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=environment)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{output}"
    return output


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 5])
def test_results_match_numpy_and_native_mpi(ranks):
    output = run_mpi(ranks, "collectives_check.py")
    assert f"collectives ok: 273 cases on {ranks} ranks" in output, output


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 5])
def test_every_path_matches_numpy_and_is_visible(ranks):
    output = run_mpi(ranks, "paths_check.py")
    want = "local 154" if ranks == 1 else "native 102 pipelined 28 small 24"
    assert f"paths ok on {ranks} ranks: {want}" in output, output


@pytest.mark.mpi
@pytest.mark.parametrize("mode,ranks", [
    ("absent-small", 2), ("absent-small", 3), ("absent-native", 2), ("absent-native", 3),
    ("absent-user-op", 3), ("absent-check", 3), ("absent-data", 2),
    ("absent-data", 3), ("mismatch", 2), ("mismatch", 3), ("mismatch-unchecked", 2), ("local", 2)])
def test_failures_raise_on_every_rank(mode, ranks):
    output = run_mpi(ranks, "failures.py", mode)
    for rank in range(ranks):
        assert f"rank {rank}: {mode} ok" in output, output


@pytest.mark.mpi
def test_a_launcher_of_another_mpi_is_named(monkeypatch):
    monkeypatch.setenv("PMI_SIZE", "4")
    check_launch(4)
    with pytest.raises(CommError, match=r"started 4 processes \(PMI_SIZE\) but MPI joined 1"):
        check_launch(1)


def test_kernel_as_reduction_op():
    assert "kernel op ok" in run_mpi(2, "kernel_op.py")


@pytest.mark.mpi
@pytest.mark.gpu
@pytest.mark.parametrize("nccl", ["1", "0"], ids=["nccl", "staged"])
def test_gpu_buffers(nccl):
    output = run_mpi(2, "gpu_collectives.py", env={"HETFLOW_NCCL": nccl,
                                                   "NUMBA_ENABLE_CUDASIM": "0"},
                     timeout=300)
    assert "gpu collectives ok" in output and "on 2 ranks" in output, output


# -- the schedule, executed for all ranks in one process ------------------------------------

def execute(size, n, root, to_all, small, inputs):
    """Run every rank's plan against the others, as MPI would; returns final vectors.

    Messages carry their element range, so a step whose receive range differs from
    its partner's send range fails here; so does a deadlock. Also returns the elements
    each rank sent and reduced.
    """
    plans = [schedule.plan(r, size, n, root, to_all, small) for r in range(size)]
    source = [x.copy() for x in inputs]
    work = [x.copy() for x in inputs]
    at = [0] * size
    posted = [False] * size
    mailbox = collections.defaultdict(collections.deque)
    sent = [0] * size
    reduced = [0] * size
    while any(at[r] < len(plans[r]) for r in range(size)):
        progressed = False
        for r in range(size):
            if at[r] == len(plans[r]):
                continue
            step = plans[r][at[r]]
            if step.send and not posted[r]:
                lo, hi = step.send
                mailbox[r, step.partner, step.tag].append((step.send, source[r][lo:hi].copy()))
                sent[r] += hi - lo
                posted[r] = progressed = True
            if step.recv:
                queue = mailbox[step.partner, r, step.tag]
                if not queue:
                    continue
                rng, payload = queue.popleft()
                assert rng == step.recv, (r, step, rng)
                lo, hi = rng
                if step.reduce:
                    work[r][lo:hi] = source[r][lo:hi] + payload
                    reduced[r] += hi - lo
                else:
                    work[r][lo:hi] = payload
            if step.reduce:
                source[r] = work[r]
            at[r] += 1
            posted[r] = False
            progressed = True
        assert progressed, f"deadlock: size {size}, steps at {at}"
    assert not any(mailbox.values()), "messages left unreceived"
    return work, sent, reduced


@pytest.mark.parametrize("size", range(1, 13))
@pytest.mark.parametrize("small", [False, True])
def test_schedule_reduces_every_contribution_once(size, small):
    for n in (0, 1, 5, 17, 64):
        # rank r contributes 2**r: a lost or doubled contribution changes the sum
        inputs = [np.full(n, 2 ** r, dtype=np.int64) for r in range(size)]
        want = np.sum(inputs, axis=0) if n else np.zeros(0, np.int64)
        work, _, _ = execute(size, n, 0, True, small, inputs)
        for r in range(size):
            np.testing.assert_array_equal(work[r], want, err_msg=f"allreduce rank {r}")
        if small:
            continue
        for root in range(size):
            work, _, _ = execute(size, n, root, False, False, inputs)
            np.testing.assert_array_equal(work[root], want, err_msg=f"reduce to {root}")


@pytest.mark.parametrize("size", [2, 4, 8, 16])
def test_schedule_meets_the_bandwidth_and_work_lower_bounds(size):
    # SPEC §5.5: per process (N-1)/N * L reduced and 2(N-1)/N * L sent, for allreduce
    n = 64 * size
    inputs = [np.ones(n, np.int64) for _ in range(size)]
    _, sent, reduced = execute(size, n, 0, True, False, inputs)
    assert sent == [2 * (size - 1) * n // size] * size
    assert reduced == [(size - 1) * n // size] * size


def test_distribution_phase_leaves_block_v_at_process_v():
    size, n = 8, 80
    for rank in range(size):
        steps = [s for s in schedule.plan(rank, size, n) if s.phase == schedule.DISTRIBUTION]
        assert [s.partner for s in steps] == [rank ^ 4, rank ^ 2, rank ^ 1]
        assert steps[-1].recv == (rank * 10, rank * 10 + 10)
        lower = [rank < s.partner for s in steps]
        for step, is_lower in zip(steps, lower):  # the lower keeps the first half
            assert (step.recv[0] < step.send[0]) == is_lower


def test_extra_ranks_fold_into_the_power_of_two_group():
    steps = schedule.plan(5, 6, 100)
    assert [(s.phase, s.partner) for s in steps] == [("fold", 1), ("unfold", 1)]
    assert steps[0].send == (0, 100) and steps[1].recv == (0, 100)
    assert schedule.plan(5, 6, 100, to_all=False) == steps[:1]
    first = schedule.plan(1, 6, 100)[0]
    assert (first.phase, first.partner, first.recv, first.reduce) == ("fold", 5, (0, 100), True)


def test_root_is_renumbered_to_zero():
    # with root 3 of 4, rank 3 plays process 0: it never sends in the collection phase
    steps = schedule.plan(3, 4, 40, root=3, to_all=False)
    collection = [s for s in steps if s.phase == schedule.COLLECTION]
    assert all(s.send is None for s in collection)
    assert {s.partner for s in collection} == {0, 1}  # processes 1 and 2 renumbered


@pytest.mark.parametrize("length,segments", [(10, 3), (2, 5), (0, 2), (1000, 7)])
def test_split_cuts_a_range_into_covering_segments(length, segments):
    pieces = schedule.split((5, 5 + length), segments)
    assert len(pieces) == min(segments, length)
    assert all(hi > lo for lo, hi in pieces)
    covered = [i for lo, hi in pieces for i in range(lo, hi)]
    assert covered == list(range(5, 5 + length))
    sizes = [hi - lo for lo, hi in pieces]
    assert not sizes or max(sizes) - min(sizes) <= 1


# -- the one-process communicator ---------------------------------------------------------

@pytest.fixture
def comm(monkeypatch):
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("HETFLOW_COMM_TIMEOUT", raising=False)
    return collectives.world()


def test_plain_python_gets_a_one_process_communicator_without_mpi():
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    env["PYTHONPATH"] = str(Path(hetflow.__file__).resolve().parents[1])
    code = ("import sys, numpy as np; from hetflow import collectives; c = collectives.world(); "
            "print(type(c).__name__, c.rank, c.size, c.allreduce(np.arange(3.0)).tolist(), "
            "'mpi4py' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["SelfCommunicator", "0", "1", "[0.0,", "1.0,", "2.0]",
                                  "False"]


@pytest.mark.parametrize("variable", LAUNCHER_VARIABLES)
def test_launcher_variables_are_detected(monkeypatch, variable):
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert not collectives.launched_by_mpi()
    monkeypatch.setenv(variable, "0")
    assert collectives.launched_by_mpi()


@pytest.mark.parametrize("op,dtype", [("sum", np.float64), ("prod", np.int32),
                                      ("land", np.bool_), ("bxor", np.uint16),
                                      ("max", np.float32)])
def test_one_process_result_is_a_copy_of_the_input(comm, op, dtype):
    x = (np.arange(11) % 3).astype(dtype)
    got = comm.allreduce(x, op=op)
    assert got is not x and not np.shares_memory(got, x)
    np.testing.assert_array_equal(got, x)
    np.testing.assert_array_equal(comm.reduce(x, op=op), x)


def test_one_process_out_in_place_and_views(comm):
    x = np.arange(24.0).reshape(4, 6)
    out = np.empty((6, 4)).T
    assert comm.allreduce(x[:, ::2], out=np.empty((4, 3))).tolist() == x[:, ::2].tolist()
    assert comm.allreduce(x, out=out) is out
    np.testing.assert_array_equal(out, x)
    assert comm.allreduce(x, out=x) is x
    np.testing.assert_array_equal(x, np.arange(24.0).reshape(4, 6))
    assert comm.allreduce(np.float32(2.5)).shape == ()


def test_one_process_structured_and_callable_ops(comm):
    dtype = np.dtype([("a", np.int16), ("b", np.float64, (2,))])
    x = np.zeros(3, dtype)
    x["a"] = [1, 2, 3]
    np.testing.assert_array_equal(comm.allreduce(x, op="max"), x)
    assert comm.allreduce(np.ones(4), op=lambda a, b, out: np.add(a, b, out=out)).sum() == 4


def test_thin_wrappers_on_one_process(comm):
    assert comm.bcast({"k": 1}) == {"k": 1}
    assert comm.allgather("x") == ["x"]
    assert comm.barrier() is None
    assert (comm.rank, comm.size) == (0, 1)
    with pytest.raises(ArgumentError, match="root must be a rank in 0..0"):
        comm.bcast(1, root=1)


@pytest.mark.parametrize("op,dtype,words", [
    ("band", np.float64, ["'band'", "float64", "signed integers"]),
    ("land", np.float32, ["'land'", "float32"]),
    ("max", np.complex128, ["'max'", "complex128"]),
    ("sum", np.bool_, ["'sum'", "bool"]),
    ("bor", np.dtype([("i", np.int32), ("f", np.float64)]), ["'bor'", "field 'f'"]),
    ("sum", object, ["Python objects"]),
])
def test_op_that_does_not_fit_the_dtype(comm, op, dtype, words):
    with pytest.raises(ArgumentTypeError) as info:
        comm.allreduce(np.zeros(3, dtype), op=op)
    assert isinstance(info.value, TypeError)
    for word in words:
        assert word in str(info.value)


def test_unknown_op_name(comm):
    with pytest.raises(ArgumentError, match="unknown reduction op 'mean'; built-in ops are"):
        comm.allreduce(np.ones(3), op="mean")


@pytest.mark.parametrize("kwargs,match", [
    ({"op": 42}, "not int"),
    ({"segments": 0}, "segments must be an integer >= 1, not 0"),
    ({"segments": 2.5}, "not 2.5"),
    ({"segments": True}, "not True"),
    ({"root": 1}, "root must be a rank in 0..0, not 1"),
    ({"root": -1}, "not -1"),
])
def test_bad_arguments(comm, kwargs, match):
    call = comm.reduce if "root" in kwargs else comm.allreduce
    with pytest.raises(ArgumentError, match=match) as info:
        call(np.ones(3), **kwargs)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("out,match", [
    (np.empty(4), r"out has shape \(4,\)"),
    (np.empty(3, np.float32), "dtype float32"),
    ([0.0, 0.0, 0.0], "must be a NumPy array, not list"),
])
def test_bad_out(comm, out, match):
    with pytest.raises(ShapeError, match=match):
        comm.allreduce(np.ones(3), out=out)


def test_read_only_out(comm):
    out = np.empty(3)
    out.flags.writeable = False
    with pytest.raises(ShapeError, match="read-only"):
        comm.allreduce(np.ones(3), out=out)


def test_timeout_from_argument_and_environment(monkeypatch, comm):
    assert comm.timeout == 300
    assert collectives.world(timeout=2.5).timeout == 2.5
    monkeypatch.setenv("HETFLOW_COMM_TIMEOUT", "7.5")
    assert collectives.world().timeout == 7.5
    monkeypatch.setenv("HETFLOW_COMM_TIMEOUT", "soon")
    with pytest.raises(ArgumentError, match="HETFLOW_COMM_TIMEOUT must be a positive"):
        collectives.world()
    with pytest.raises(ArgumentError, match="timeout must be a positive number"):
        collectives.world(timeout=0)


def test_ops_are_resolved_by_name_or_function():
    assert resolve_op("SUM").name == "sum"
    assert resolve_op(np.add).name == "numpy.add"
    assert set(collectives.BUILTIN_OPS) == {"sum", "prod", "min", "max", "and", "or", "xor",
                                     "land", "lor", "lxor"}


@hetflow.kernel
def maxabs(a, b):
    return a if abs(a) >= abs(b) else b


def test_a_call_site_op_combines_segments_as_reduce_folds_with_it():
    """One user op for both: the element op ``hetflow.reduce`` takes combines a
    collective's arrays element by element (oracle: NumPy)."""
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal(1000), rng.standard_normal(1000)
    out = np.empty_like(a)
    resolve_op(maxabs).combine(a, b, out)
    np.testing.assert_array_equal(out, np.where(np.abs(a) >= np.abs(b), a, b))
    x = np.stack([a, b])
    assert hetflow.reduce(x, maxabs) == x.flat[np.argmax(np.abs(x))]


@pytest.mark.parametrize("op,dtype,mpi_name", [
    ("sum", np.float64, "SUM"), ("prod", np.complex64, "PROD"), ("min", np.int8, "MIN"),
    ("max", np.uint64, "MAX"), ("band", np.int32, "BAND"), ("xor", np.uint16, "BXOR"),
    ("land", np.bool_, "LAND"), ("lxor", np.int64, "LXOR"),
    ("max", np.bool_, None), ("min", np.float64, "MIN"), ("max", np.float32, "MAX"),
    ("bxor", np.bool_, None), ("sum", np.float16, None),
    ("sum", np.dtype(">f8"), None), ("sum", np.dtype([("a", np.float64)]), None),
    (np.add, np.float64, None),
])
def test_only_ops_mpi_has_for_the_dtype_go_native(op, dtype, mpi_name):
    # MPI-4.0 §6.9.2: which predefined op takes which C type (MIN/MAX of floats: through
    # native.NanRule, since MPI's have no rule for NaN)
    assert host.mpi_op_name(resolve_op(op), np.dtype(dtype)) == mpi_name


def test_path_follows_size_and_rank_count():
    class Ranks:
        native_bytes, small_bytes = None, 64 << 10

        def __init__(self, size):
            self.size = size

    f8, add, total = np.dtype(np.float64), resolve_op("sum"), resolve_op(np.add)
    for size in (2, 3, 5):
        crossover = host.native_crossover("allreduce", size)
        assert crossover == host.NATIVE_BYTES["allreduce"][min(size, 3)]
        for n, path in ((0, "native"), (crossover // 8, "native"),
                        (crossover // 8 + 1, "pipelined")):
            x = np.zeros(n, f8)
            assert host.choose_path(Ranks(size), "allreduce", x, add) == path
        assert host.choose_path(Ranks(size), "allreduce", np.zeros(9), total) == "small"
    off = Ranks(2)
    off.native_bytes = 0
    assert host.choose_path(off, "reduce", np.zeros(9), add) == "small"
    assert host.choose_path(Ranks(1), "reduce", np.zeros(9), add) == "local"


def test_one_process_path_is_visible(comm, caplog):
    with caplog.at_level("DEBUG", logger="hetflow.collectives"):
        comm.allreduce(np.ones(3))
    assert comm.last_path == "local"
    assert "allreduce of 24 bytes (float64, op sum) on rank 0 of 1: local path" in caplog.text


def test_kernel_is_recognised_as_an_op():
    @hetflow.kernel
    def bigger(i, a, b, out):
        out[i] = max(a[i], b[i])

    op = resolve_op(bigger)
    assert type(op).__name__ == "KernelOp"
    a, b = np.array([1, 5, 3]), np.array([4, 2, 3])
    out = np.empty(3, np.int64)
    op.combine(a, b, out)
    np.testing.assert_array_equal(out, np.maximum(a, b))
