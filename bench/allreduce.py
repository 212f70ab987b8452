"""hetflow's pipelined allreduce/reduce against MPI's own (and NCCL's on GPUs).

Run under an MPI launcher, e.g. ``mpiexec -n 4 python bench/allreduce.py``; run
plainly (or as ``hetflow bench allreduce``) it starts itself under
``mpiexec -n RANKS``. Only rank 0 prints.

For each message size (8 B .. 256 MiB by powers of two) it times hetflow's allreduce
(the path it chooses), hetflow's seed algorithm alone (native path off: the small or
pipelined path) and MPI_Allreduce, and the same for reduce and MPI_Reduce (root 0), on
float64 sums, alternating them in rounds and keeping each one's best round; a call's
time is the slowest rank's. Columns: the path chosen, latency in microseconds,
native time / hetflow time ("speed", above 1: hetflow faster) for the chosen path and
for the seed, busbw = bytes / time * 2(N-1)/N for allreduce (the bytes each process
must move, SPEC §5), and busbw as a fraction of the bandwidth bound: the exchange
bandwidth of one pair of processes, measured in the same run. The header names the
crossovers in use (``host.NATIVE_BYTES``): where "seed speed" crosses 1 is
where they belong. Each host row, and the summary's median, is marked "met" or "MISSED"
against issue 20's targets (``TARGETS``).

``--gpu``: CuPy arrays, one GPU per rank, against NCCL's allReduce (float32 sums).
``--overlap``: the transfer/reduction overlap experiment of docs/collectives.md.
``--reduce-thread``: the pipelined path reduces in a helper thread (``reduce_thread``).
``--breakdown``: where a large 2-rank allreduce's time goes (docs/collectives.md).
``--objects``: hetflow's barrier, bcast and allgather of a small Python object (each call
checked for ranks calling different collectives) against mpi4py's ``Barrier``, ``bcast``
and ``allgather`` on the same processes.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time

import numpy as np

from hetflow.collectives import host, launched_by_mpi, world

sys.path.append(os.path.dirname(__file__))
from _common import at_least, clause, mpiexec, verdict  # noqa: E402


# Issue 20's targets on the host, on speed (native time / hetflow time): at least 0.9x at
# every size, 1.2x from 1 MiB, and 0.95x as the median over the sizes; busbw at least 0.7
# of the bound from 8 MiB.
TARGETS = {"speed": 0.9, "speed from 1 MiB": 1.2, "median speed": 0.95, "busbw of the bound from 8 MiB": 0.7}


def main(argv=None) -> int:
    args = _parse(argv)
    if not launched_by_mpi():
        return _relaunch(args, argv)
    comm = world()
    if args.objects:
        rows = object_collectives(comm, args)
    elif args.breakdown:
        rows = breakdown(comm, args)
    elif args.overlap:
        rows = overlap_experiment(comm, args)
    elif args.gpu:
        rows = gpu_sweep(comm, args)
    else:
        rows = host_sweep(comm, args)
    if comm.rank == 0:
        print(json.dumps(rows, indent=1) if args.json else _table(rows, comm.size, args))
    return 0


def _parse(argv):
    p = argparse.ArgumentParser(prog="hetflow bench allreduce", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=at_least(1), default=2,
                   help="processes to start when not run under an MPI launcher")
    # sizes from one float64 on, doubling
    p.add_argument("--min-bytes", type=at_least(8), default=8)
    p.add_argument("--max-bytes", type=at_least(8), default=256 << 20)
    p.add_argument("--segments", type=at_least(1), default=2, help="hetflow's segments per half")
    p.add_argument("--op", choices=("sum", "prod", "min", "max"), default="sum",
                   help="the reduction on the host (default sum); MPI's MIN and MAX have no rule "
                        "for NaN, hetflow's follow NumPy's (docs/collectives.md)")
    p.add_argument("--no-check", action="store_true",
                   help="skip hetflow's argument agreement check (check=False)")
    p.add_argument("--check-always", action="store_true",
                   help="check every call's arguments (check='always'; the default "
                        "checks each signature's first call)")
    p.add_argument("--seconds", type=at_least(0, float), default=0.05,
                   help="target time of one timed round per size and contender")
    p.add_argument("--rounds", type=at_least(1), default=3, help="timed rounds; the best counts")
    p.add_argument("--no-reduce", action="store_true", help="time allreduce only")
    p.add_argument("--reduce-thread", action="store_true",
                   help="reduce in a helper thread on the pipelined path (reduce_thread)")
    p.add_argument("--gpu", action="store_true", help="CuPy arrays, against NCCL")
    p.add_argument("--overlap", action="store_true",
                   help="measure how far transfers overlap reductions (2 ranks)")
    p.add_argument("--breakdown", action="store_true",
                   help="time the parts of one large allreduce (2 ranks)")
    p.add_argument("--objects", action="store_true",
                   help="barrier, bcast and allgather of a small object, against mpi4py's")
    p.add_argument("--quick", action="store_true", help="tiny sizes, one short round")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.max_bytes = min(args.max_bytes, 64 << 10)
        args.seconds, args.rounds = 0.005, 1
    if args.min_bytes > args.max_bytes:  # no size to time: the table would be empty
        largest = "--quick's largest size" if args.quick else "--max-bytes"
        p.error(f"--min-bytes {args.min_bytes} is above {largest}, {args.max_bytes}: no message size to time")
    return args


def _check_mode(args):
    return "always" if args.check_always else not args.no_check


def _relaunch(args, argv) -> int:
    """Start this benchmark under mpiexec with ``--ranks`` processes."""
    cmd = [mpiexec(), "-n", str(args.ranks), sys.executable, os.path.abspath(__file__)]
    cmd += list(sys.argv[1:] if argv is None else argv)
    return subprocess.run(cmd, check=False).returncode


# -- timing ---------------------------------------------------------------------------

def _time_rounds(comm, contenders, seconds, rounds):
    """Best per-call time of each contender (slowest rank), alternating in rounds."""
    mpi_comm = comm.mpi_comm
    from mpi4py import MPI

    iters = {}
    for name, fn in contenders.items():  # warm up, and size the rounds
        fn()
        t0 = time.perf_counter()
        fn()
        once = mpi_comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
        iters[name] = max(1, min(10000, int(seconds / max(once, 1e-7))))
    best = {name: float("inf") for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            mpi_comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(iters[name]):
                fn()
            elapsed = (time.perf_counter() - t0) / iters[name]
            best[name] = min(best[name], mpi_comm.allreduce(elapsed, op=MPI.MAX))
    return best


def _sizes(args):
    size = max(8, args.min_bytes)
    while size <= args.max_bytes:
        yield size
        size *= 2


def _pair_bandwidth(comm, nbytes):
    """Bytes per second one process sends while receiving as much (pairs r, r^1)."""
    from mpi4py import MPI

    partner = comm.rank ^ 1
    a = np.ones(nbytes // 8)
    b = np.empty_like(a)
    mpi_comm = comm.mpi_comm

    def exchange():
        if partner < comm.size:
            mpi_comm.Sendrecv(a, partner, 7, b, partner, 7)

    t = _time_rounds(comm, {"x": exchange}, 0.05, 2)["x"]
    return mpi_comm.allreduce(a.nbytes / t if partner < comm.size else np.inf, op=MPI.MIN)


# -- host sweep -------------------------------------------------------------------------

def host_sweep(comm, args):
    from mpi4py import MPI

    mpi_comm = comm.mpi_comm
    seed = world()  # the same processes, native path off
    seed.native_bytes = 0
    comm.reduce_thread = seed.reduce_thread = args.reduce_thread
    check = _check_mode(args)
    bound = _pair_bandwidth(comm, min(args.max_bytes, 16 << 20)) if comm.size > 1 else None
    rows = []
    for nbytes in _sizes(args):
        x = np.random.default_rng(comm.rank).random(nbytes // 8)
        y = np.empty_like(x)
        contenders, paths = {}, {}
        for what, native in (("allreduce", "MPI_Allreduce"), ("reduce", "MPI_Reduce")):
            if what == "reduce" and args.no_reduce:
                continue
            for who, c in (("hetflow", comm), ("seed", seed)):
                contenders[f"{who} {what}"] = functools.partial(
                    getattr(c, what), x, op=args.op, out=y, segments=args.segments, check=check)
            contenders[f"hetflow {what}"]()  # checked: a first call
            contenders[f"hetflow {what}"]()  # the path the timed repetitions take
            paths[what] = comm.last_path
        op = getattr(MPI, args.op.upper())
        contenders["MPI_Allreduce"] = lambda: mpi_comm.Allreduce(x, y, op=op)
        if not args.no_reduce:
            contenders["MPI_Reduce"] = lambda: mpi_comm.Reduce(x, y, op=op, root=0)
        best = _time_rounds(comm, contenders, args.seconds, args.rounds)
        rows.append(_judged(_row(nbytes, comm.size, best, "allreduce", "MPI_Allreduce", bound,
                                 paths["allreduce"])))
        if not args.no_reduce:
            rows.append(_judged(_row(nbytes, comm.size, best, "reduce", "MPI_Reduce", None,
                                     paths["reduce"])))
    return rows


def _judged(row):
    """``row`` with its verdict on the targets of its size (``TARGETS``)."""
    big = row["bytes"] >= 1 << 20
    clauses = [clause(row["speed_ratio"], ">=", TARGETS["speed from 1 MiB" if big else "speed"])]
    if row["bytes"] >= 8 << 20 and "bound_fraction" in row:
        clauses.append(clause(row["bound_fraction"], ">=", TARGETS["busbw of the bound from 8 MiB"], "",
                              label="busbw", note="of the bound"))
    return {**row, **verdict(*clauses)}


def _row(nbytes, size, best, what, native, bound, path=None):
    mine, theirs = best[f"hetflow {what}"], best[native]
    factor = 2 * (size - 1) / size if what == "allreduce" else 1.0
    row = {"collective": what, "bytes": nbytes, "ranks": size, "path": path,
           "hetflow_us": mine * 1e6, "native_us": theirs * 1e6, "speed_ratio": theirs / mine,
           "hetflow_busbw_GBs": nbytes / mine * factor / 1e9,
           "native_busbw_GBs": nbytes / theirs * factor / 1e9}
    if f"seed {what}" in best:
        row["seed_us"] = best[f"seed {what}"] * 1e6
        row["seed_speed_ratio"] = theirs / best[f"seed {what}"]
    if bound:
        row["bound_fraction"] = row["hetflow_busbw_GBs"] * 1e9 / bound
        row["pair_bw_GBs"] = bound / 1e9
    return row


# -- GPU sweep ---------------------------------------------------------------------------

def gpu_sweep(comm, args):
    from hetflow.cuda_compat import cupy_module

    cp = cupy_module()
    if cp is None:
        raise SystemExit("--gpu needs CuPy and a GPU")
    from cupy.cuda import nccl

    local = int(os.environ.get("MPI_LOCALRANKID", os.environ.get(
        "OMPI_COMM_WORLD_LOCAL_RANK", comm.rank)))
    cp.cuda.Device(local % cp.cuda.runtime.getDeviceCount()).use()
    uid = comm.bcast(nccl.get_unique_id() if comm.rank == 0 else None)
    native = nccl.NcclCommunicator(comm.size, uid, comm.rank)
    stream = cp.cuda.get_current_stream()
    check = _check_mode(args)
    rows = []
    for nbytes in _sizes(args):
        x = cp.random.default_rng(comm.rank).random(max(1, nbytes // 4), dtype=cp.float32)
        y = cp.empty_like(x)

        def nccl_allreduce():
            native.allReduce(x.data.ptr, y.data.ptr, x.size, nccl.NCCL_FLOAT32,
                             nccl.NCCL_SUM, stream.ptr)
            stream.synchronize()

        best = _time_rounds(comm, {
            "hetflow allreduce": lambda: comm.allreduce(x, out=y, segments=args.segments,
                                                        check=check),
            "NCCL allReduce": nccl_allreduce}, args.seconds, args.rounds)
        rows.append(_row(nbytes, comm.size, best, "allreduce", "NCCL allReduce", None))
    return rows


# -- overlap experiment -------------------------------------------------------------------

def overlap_experiment(comm, args):
    """Time one distribution step three ways: transfer alone, reduction alone, both.

    With perfect overlap the step takes max(transfer, reduction); with none, their sum.
    The step is run through hetflow's own pipeline, with and without MPI polls between
    chunks of the reduction, for several segment counts.
    """
    from hetflow.collectives import schedule

    if comm.size != 2:
        raise SystemExit("--overlap needs exactly 2 ranks")
    n = max(2, min(args.max_bytes, 64 << 20) // 8)
    x = np.random.default_rng(comm.rank).random(n)
    work = np.empty_like(x)
    scratch = np.empty(n - n // 2)
    step = schedule.plan(comm.rank, 2, n)[0]  # the distribution step
    transport = comm._transport("overlap")
    half = slice(*step.recv)

    def transfer():
        requests = [transport.irecv(scratch[:step.recv[1] - step.recv[0]], step.partner, 1),
                    transport.isend(x[slice(*step.send)], step.partner, 1)]
        transport.wait(requests, "overlap")

    def reduction():
        np.add(x[half], scratch[:step.recv[1] - step.recv[0]], out=work[half])

    def pipelined(segments, chunk_bytes, helper=None):
        def run():
            host.HostPipeline(transport, comm_op, x, work, scratch, segments,
                              chunk_bytes, helper=helper).run([step])
        return run

    from hetflow.collectives.ops import resolve_op

    comm_op = resolve_op("sum")
    contenders = {"transfer": transfer, "reduction": reduction}
    for segments in (1, 2, 4, 8, 16):
        contenders[f"q={segments} polled"] = pipelined(segments,
                                                       host.PROGRESS_CHUNK_BYTES)
        contenders[f"q={segments} unpolled"] = pipelined(segments, 8 * n)
        contenders[f"q={segments} thread"] = pipelined(segments, host.PROGRESS_CHUNK_BYTES,
                                                       host.reduce_helper())
    best = _time_rounds(comm, contenders, args.seconds, args.rounds)
    t_x, t_r = best["transfer"], best["reduction"]
    rows = []
    for name, t in best.items():
        rows.append({"variant": name, "bytes": 8 * n, "ms": t * 1e3,
                     "overlap": (t_x + t_r - t) / min(t_x, t_r)
                     if name not in ("transfer", "reduction") else None})
    return rows


# -- breakdown of a large allreduce ---------------------------------------------------------

def breakdown(comm, args):
    """Time the parts of a 2-rank allreduce of L bytes, each alone, and the whole.

    Its schedule is one distribution step (send L/2, receive L/2, reduce L/2) and one
    collection step (send L/2, receive L/2): with nothing overlapping, the whole takes
    two half exchanges plus one reduction pass. The other rows are what hetflow and
    MPI add to that: packing copies, fresh pages, segments.
    """
    from mpi4py import MPI

    if comm.size != 2:
        raise SystemExit("--breakdown needs exactly 2 ranks")
    n = max(2, min(args.max_bytes, 64 << 20) // 8)
    x = np.random.default_rng(comm.rank).random(n)
    y, scratch = np.empty_like(x), np.empty(n - n // 2)
    half = x[: n // 2]
    transport = comm._transport("breakdown")
    partner = 1 - comm.rank
    seed = world()
    seed.native_bytes = 0

    def exchange():
        transport.wait([transport.irecv(scratch[:half.size], partner, 2),
                        transport.isend(half, partner, 2)], "breakdown")

    contenders = {
        "copy L (a packing pass)": lambda: np.copyto(y, x),
        "fresh L (np.empty + first touch)": lambda: np.empty_like(x).fill(0),
        "exchange L/2 (one step's transfer)": exchange,
        "reduce L/2 (np.add, one pass)": lambda: np.add(half, scratch[:half.size],
                                                        out=y[:half.size]),
    }
    for q in (1, 2, 4):
        contenders[f"hetflow allreduce, segments={q}"] = functools.partial(
            seed.allreduce, x, out=y, segments=q)
    contenders["hetflow allreduce, check=False"] = functools.partial(
        seed.allreduce, x, out=y, check=False)
    threaded = world()
    threaded.native_bytes, threaded.reduce_thread = 0, True
    for q in (2, 4, 8):
        contenders[f"hetflow allreduce, reduce_thread, segments={q}"] = functools.partial(
            threaded.allreduce, x, out=y, segments=q)
    contenders["MPI_Allreduce"] = lambda: comm.mpi_comm.Allreduce(x, y, op=MPI.SUM)
    best = _time_rounds(comm, contenders, args.seconds, args.rounds)
    model = 2 * best["exchange L/2 (one step's transfer)"] \
        + best["reduce L/2 (np.add, one pass)"]
    best["model: 2 exchanges + 1 reduction"] = model
    whole = best["hetflow allreduce, segments=2"]
    return [{"variant": name, "bytes": 8 * n, "ms": t * 1e3, "of_allreduce": t / whole,
             "busbw_GBs": 8 * n / t / 1e9 if "allreduce" in name.lower() or "model" in name
             else None} for name, t in best.items()]


# -- output ------------------------------------------------------------------------------

def object_collectives(comm, args):
    """hetflow's barrier, bcast and allgather of a small object against mpi4py's own."""
    mpi_comm, obj = comm.mpi_comm, (comm.rank, 1.5)
    contenders = {"hetflow barrier": comm.barrier, "mpi4py barrier": mpi_comm.Barrier,
                  "hetflow bcast": lambda: comm.bcast(obj), "mpi4py bcast": lambda: mpi_comm.bcast(obj),
                  "hetflow allgather": lambda: comm.allgather(obj),
                  "mpi4py allgather": lambda: mpi_comm.allgather(obj)}
    assert comm.allgather(obj) == mpi_comm.allgather(obj) and comm.bcast(obj) == mpi_comm.bcast(obj)
    best = _time_rounds(comm, contenders, args.seconds, args.rounds)
    return [dict(collective=what, hetflow_us=best[f"hetflow {what}"] * 1e6, native_us=best[f"mpi4py {what}"] * 1e6,
                 speed_ratio=best[f"mpi4py {what}"] / best[f"hetflow {what}"])
            for what in ("barrier", "bcast", "allgather")]


def _table(rows, size, args):
    if args.objects:
        lines = [f"{size} processes, a small Python object; speed = mpi4py time / hetflow time",
                 f"{'collective':<10} {'hetflow us':>11} {'mpi4py us':>10} {'speed':>6}"]
        lines += [f"{r['collective']:<10} {r['hetflow_us']:>11.2f} {r['native_us']:>10.2f} {r['speed_ratio']:>5.2f}x"
                  for r in rows]
        return "\n".join(lines)
    if args.breakdown:
        lines = [f"breakdown of a 2-rank allreduce of {rows[0]['bytes']} bytes "
                 "(busbw = L / time for 2 ranks)",
                 f"{'part':<46} {'ms':>9} {'of allreduce':>12} {'busbw GB/s':>10}"]
        for r in rows:
            bw = "" if r["busbw_GBs"] is None else f"{r['busbw_GBs']:.2f}"
            lines.append(f"{r['variant']:<46} {r['ms']:9.3f} {r['of_allreduce']:12.2f} "
                         f"{bw:>10}")
        return "\n".join(lines)
    if args.overlap:
        lines = [f"overlap of one distribution step, 2 ranks, {rows[0]['bytes']} bytes "
                 "(overlap 1 = fully hidden, 0 = none)",
                 f"{'variant':<18} {'ms':>9} {'overlap':>8}"]
        for r in rows:
            o = "" if r["overlap"] is None else f"{r['overlap']:.2f}"
            lines.append(f"{r['variant']:<18} {r['ms']:9.3f} {o:>8}")
        return "\n".join(lines)
    where = "GPUs" if args.gpu else "processes"
    lines = [f"{size} {where}, float{'32' if args.gpu else '64'} {'sum' if args.gpu else args.op}, segments="
             f"{args.segments}, check={_check_mode(args)}"]
    if not args.gpu:
        lines.append("native path up to: " + ", ".join(
            f"{what} {host.native_crossover(what, size)} bytes"
            for what in host.NATIVE_BYTES) + f" (at {size} ranks)")
    lines.append(f"{'collective':<10} {'bytes':>10} {'path':>9} {'hetflow us':>11} "
                 f"{'seed us':>10} {'native us':>11} {'speed':>6} {'seed':>6} "
                 f"{'busbw GB/s':>11} {'native':>8} {'of bound':>8}  target")
    for r in rows:
        bound = f"{r['bound_fraction']:.2f}" if "bound_fraction" in r else ""
        seed_us = f"{r['seed_us']:.1f}" if "seed_us" in r else ""
        seed_speed = f"{r['seed_speed_ratio']:.2f}x" if "seed_us" in r else ""
        lines.append(
            f"{r['collective']:<10} {r['bytes']:>10} {r.get('path') or '':>9} "
            f"{r['hetflow_us']:>11.1f} {seed_us:>10} {r['native_us']:>11.1f} "
            f"{r['speed_ratio']:>5.2f}x {seed_speed:>6} "
            f"{r['hetflow_busbw_GBs']:>11.3f} {r['native_busbw_GBs']:>8.3f} {bound:>8}  "
            f"{r.get('target', '')}")
    if rows and "pair_bw_GBs" in rows[0]:
        lines.append(f"bound: one pair's exchange bandwidth, {rows[0]['pair_bw_GBs']:.2f} "
                     "GB/s per direction")
    lines += [_summary(rows, what, judged=not args.gpu) for what in ("allreduce", "reduce")
              if any(r["collective"] == what for r in rows)]
    return "\n".join(lines)


def _summary(rows, what, judged):
    """One line on the issue's targets: the median speed over sizes (with its verdict if
    ``judged``), the slowest size, the slowest from 1 MiB, busbw against the bound from
    8 MiB, and at how many sizes the rows' targets are met."""
    mine = [r for r in rows if r["collective"] == what]
    median = float(np.median([r["speed_ratio"] for r in mine]))
    worst = min(mine, key=lambda r: r["speed_ratio"])
    mark = f" ({verdict(clause(median, '>=', TARGETS['median speed']))['target']})" if judged else ""
    text = (f"summary {what}: median speed {median:.2f}x{mark} over {len(mine)} sizes, "
            f"lowest {worst['speed_ratio']:.2f}x at {worst['bytes']} bytes")
    large = [r["speed_ratio"] for r in mine if r["bytes"] >= 1 << 20]
    if large:
        text += f"; from 1 MiB lowest {min(large):.2f}x"
    bound = [r["bound_fraction"] for r in mine if r["bytes"] >= 8 << 20 and "bound_fraction" in r]
    if bound:
        text += f"; from 8 MiB busbw {min(bound):.2f}-{max(bound):.2f} of the bound"
    if judged:
        text += f"; targets met at {sum(r['met'] for r in mine)} of {len(mine)} sizes"
    return text


if __name__ == "__main__":
    sys.exit(main())
