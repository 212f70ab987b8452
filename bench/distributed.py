"""Distributed heat solver: strong and weak scaling over 1, 2 and 4 ranks (and 2 GPUs).

Run under an MPI launcher, e.g. ``mpiexec -n 4 python bench/distributed.py``; run
plainly (or as ``hetflow bench distributed``) it starts itself under
``mpiexec -n RANKS``. Only rank 0 prints.

The solver is examples/heat_distributed.py: a DistributedProgram of two captured
steps, with halo exchange and the central/local interpreters. Its baseline is the same
Jacobi step written by hand: a Numba ``prange`` loop over each rank's rows and mpi4py
``Sendrecv`` halo exchanges. Both run on groups of the first k ranks (k = 1, 2, 4)
inside one mpiexec, each rank on its own share of the host's cores (hetflow.cluster binds
ranks to cores when there are enough). Rows marked "cpu" run hetflow on those cores
only, as the baseline does. Where some rank has a GPU of its own, rows marked "own
devices" run hetflow's strong scaling on each rank's cores and GPU (coherent blocks, the
default there) beside the same CPU baseline: what a user of that machine gets. A row says "oversubscribed" when its k ranks
compute with more cores than their host has (the ranks outside the group wait without
computing): its ranks share cores, and its figures say little about scaling. Strong
scaling keeps the grid (default 4096^2), weak scaling the cells per rank (2048^2 per
rank). Each time is the slowest rank's, best of ``--repeat``. Ratio: baseline time /
hetflow time (above 1: hetflow faster). ``eff``: parallel efficiency, T1 / (k Tk)
strong and T1 / Tk weak; the target: eff >= 0.8 strong at 2 ranks.
Where the first ranks each have a GPU of their own, hetflow also runs strong scaling on
1 GPU, and on 2 (rank r on its own GPU, coherent blocks: rows stay in the GPU's memory,
only halo rows cross) when the first two ranks have one each. Their baseline is the
same Jacobi step written by hand for the GPU: CuPy blocks, a numba-cuda kernel, and
halo rows staged through pinned host buffers for mpi4py's ``Sendrecv``.
"""
from __future__ import annotations

import argparse
import collections
import functools
import json
import math
import os
import subprocess
import sys
import time

import numba
import numpy as np

from hetflow import cluster, collectives, get_device
from hetflow.collectives import launched_by_mpi
from hetflow.cuda_compat import cuda_module

sys.path.append(os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
import heat_distributed as heat  # noqa: E402
from _common import at_least, clause, fmt_s, mpiexec, report, verdict  # noqa: E402


# -- the hand-written baseline ------------------------------------------------------------

@numba.njit(parallel=True, nogil=True)
def numba_step(u, v, first, last, alpha):
    """v = one step of u on local rows first..last-1 (u and v carry one halo row each side)."""
    for i in numba.prange(first, last):
        for j in range(1, u.shape[1] - 1):
            v[i, j] = u[i, j] + alpha * (u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] - 4.0 * u[i, j])


class Baseline:
    """The Jacobi solver as one would write it with mpi4py and Numba."""

    def __init__(self, mpi, comm, n):
        self.MPI, self.comm, self.n = mpi, comm, n
        rank, size = comm.Get_rank(), comm.Get_size()
        sizes = cluster.darray.cut(n, size)
        self.start = sum(sizes[:rank])
        self.rows = sizes[rank]
        grid = heat.initial(n)
        self.u = np.zeros((self.rows + 2, n))
        self.u[1:-1] = grid[self.start:self.start + self.rows]
        self.v = self.u.copy()
        # local rows 1..rows are global start..start+rows-1; the global border rows stay fixed
        self.first = 1 + (self.start == 0)
        self.last = 1 + self.rows - (self.start + self.rows == n)
        self.up = rank - 1 if rank > 0 else mpi.PROC_NULL
        self.down = rank + 1 if rank < size - 1 else mpi.PROC_NULL

    def step(self):
        u, m = self.u, self.rows
        self.comm.Sendrecv(u[1], self.up, 0, u[m + 1], self.down, 0)
        self.comm.Sendrecv(u[m], self.down, 1, u[0], self.up, 1)
        numba_step(u, self.v, self.first, self.last, heat.ALPHA)
        self.u, self.v = self.v, self.u

    def run(self, steps):
        for _ in range(steps):
            self.step()

    def block(self) -> np.ndarray:
        """This rank's rows, a copy in host memory."""
        return self.u[1:-1].copy()

    def gather(self):
        blocks = self.comm.gather(self.block(), root=0)
        return np.concatenate(blocks) if blocks is not None else None


@functools.cache
def cuda_step():
    """The numba-cuda kernel of one step: v = one step of u on local rows first..last-1,
    a thread per element, a warp along a row. (numba.cuda as hetflow imports it: where
    numba-cuda's import hook is not installed, plain ``from numba import cuda`` would
    give Numba's old CUDA target.)"""
    cuda = cuda_module()

    @cuda.jit
    def step(u, v, first, last, alpha):
        j, i = cuda.grid(2)
        i += first
        if i < last and 1 <= j < u.shape[1] - 1:
            v[i, j] = u[i, j] + alpha * (u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] - 4.0 * u[i, j])

    return step


class GpuBaseline(Baseline):
    """The Jacobi solver as one would write it for this rank's GPU (``gpu``, an ordinal):
    blocks in CuPy arrays, the numba-cuda kernel launched on them (wrapped once, which
    keeps numba's launch cheap), halo rows through pinned host buffers and ``Sendrecv``."""

    def __init__(self, mpi, comm, n, gpu):
        import cupy

        super().__init__(mpi, comm, n)
        self.cupy, self.gpu = cupy, gpu
        with cupy.cuda.Device(gpu):
            self.u, self.v = cupy.asarray(self.u), cupy.asarray(self.v)
            self.wrapped = {id(a): cuda_module().as_cuda_array(a) for a in (self.u, self.v)}
            self.halo = [np.frombuffer(cupy.cuda.alloc_pinned_memory(n * 8), np.float64, n) for _ in range(4)]
        self.blocks = ((n + 31) // 32, (self.last - self.first + 7) // 8)

    def step(self):
        u, m = self.u, self.rows
        sent_up, sent_down, got_down, got_up = self.halo
        with self.cupy.cuda.Device(self.gpu):
            u[1].get(out=sent_up)
            u[m].get(out=sent_down)
            self.comm.Sendrecv(sent_up, self.up, 0, got_down, self.down, 0)
            self.comm.Sendrecv(sent_down, self.down, 1, got_up, self.up, 1)
            if self.down != self.MPI.PROC_NULL:
                u[m + 1].set(got_down)
            if self.up != self.MPI.PROC_NULL:
                u[0].set(got_up)
            cuda_step()[self.blocks, (32, 8)](self.wrapped[id(u)], self.wrapped[id(self.v)], self.first,
                                              self.last, heat.ALPHA)
        self.u, self.v = self.v, self.u

    def run(self, steps):
        super().run(steps)
        with self.cupy.cuda.Device(self.gpu):
            self.cupy.cuda.runtime.deviceSynchronize()

    def block(self) -> np.ndarray:
        with self.cupy.cuda.Device(self.gpu):
            return self.u[1:-1].get()


# -- timing -----------------------------------------------------------------------------------

def slowest(comm, fn, repeat) -> float:
    """Best over ``repeat`` runs of the slowest rank's time of ``fn()``."""
    from mpi4py import MPI

    best = math.inf
    for _ in range(repeat):
        comm.Barrier()
        start = time.perf_counter()
        fn()
        best = min(best, comm.allreduce(time.perf_counter() - start, op=MPI.MAX))
    return best


def measure(group, n, steps, repeat, devices=None, baseline=Baseline) -> dict:
    """Times (seconds) of hetflow and ``baseline(MPI, comm, n)`` on ``group`` (a hetflow
    communicator)."""
    mpi_comm = group.mpi_comm
    program, u, v = heat.setup(n, group, devices=devices)
    program.run(1)  # compiles, partitions, materialises
    heat.wait(devices)
    t_het = slowest(mpi_comm, lambda: (program.run(steps // 2), heat.wait(devices)), repeat)
    result = u.gather(0)
    out = {"hetflow": t_het}
    if baseline:
        from mpi4py import MPI

        base = baseline(MPI, mpi_comm, n)
        base.run(2)
        t_base = slowest(mpi_comm, lambda: base.run(steps), repeat)
        expected = base.gather()
        if expected is not None:
            # both ran 2 + repeat * steps steps from the same grid
            error = float(np.max(np.abs(result - expected)))
            if error > 1e-9 * max(1.0, float(np.max(np.abs(expected)))):
                raise AssertionError(f"hetflow and the baseline differ by {error} on {n}^2")
        out["baseline"] = t_base
    out["partitions"] = program.partitions
    return out


def group(comm, k):
    """A hetflow communicator over the world's first k ranks (None on the others)."""
    from mpi4py import MPI

    from hetflow.collectives.comm import MPICommunicator
    from hetflow.collectives.transport import Link

    sub = comm.mpi_comm.Split(0 if comm.rank < k else MPI.UNDEFINED, comm.rank)
    return None if sub == MPI.COMM_NULL else MPICommunicator(Link(MPI, sub), comm.timeout)


# -- the sweep ----------------------------------------------------------------------------------

def oversubscribed(placements, k) -> bool:
    """Whether the world's first ``k`` ranks compute with more cores than one of their
    hosts has. ``placements``: per rank, (its host, the cores it computes with, the
    cores its host let it run on before the session bound it to its share)."""
    need = collections.Counter()
    for host, threads, _ in placements[:k]:
        need[host] += threads
    have = {host: cores for host, _, cores in placements}
    return any(need[host] > have[host] for host in need)


def sweep(comm, args, world_session, placements) -> list:
    """Rank 0's rows (none elsewhere): strong and weak scaling on the CPUs, then on each
    rank's own devices where some rank has a GPU, then on GPUs alone; ``placements``
    (rank 0's): as :func:`oversubscribed` takes them."""
    counts = [k for k in (1, 2, 4) if k <= comm.size]
    owned = world_session.channel.allgather(any(d != "cpu0" for d in world_session.devices))
    cases = [("strong", ["cpu0"], "cpu", lambda k: args.size),
             ("weak", ["cpu0"], "cpu", lambda k: int(round(args.weak_size * math.sqrt(k))))]
    if any(owned):  # hetflow on its cores and GPUs beside the baseline on its cores
        cases.append(("strong", None, "own devices", lambda k: args.size))
    rows, first = [], {}
    for kind, devices, where, n_of in cases:
        for k in counts:
            sub = group(comm, k)
            if sub is not None:
                times = measure(sub, n_of(k), args.steps, args.repeat, devices=devices)
            world_session.channel.barrier()  # the others wait here, napping
            if comm.rank != 0:
                continue
            first.setdefault((kind, where), times)
            t1, tk = first[kind, where]["hetflow"], times["hetflow"]
            b1, bk = first[kind, where]["baseline"], times["baseline"]
            scale = k if kind == "strong" else 1
            eff, eff_base = t1 / (scale * tk), b1 / (scale * bk)
            shared = oversubscribed(placements, k)
            # the scaling target: strong scaling's efficiency at 2 ranks, on the cores
            judged = [clause(eff, ">=", 0.8, "", label="eff")] if (kind, where, k) == ("strong", "cpu", 2) else []
            rows.append({
                "name": f"{kind} {n_of(k)}^2, {k} rank(s), {where}{' (oversubscribed)' if shared else ''}",
                "baseline": fmt_s(bk), "hetflow": fmt_s(tk), "unit": "s",
                "ratio": bk / tk, "baseline_s": bk, "hetflow_s": tk,
                "eff_hetflow": eff, "eff_baseline": eff_base,
                **verdict(*judged, info=f"eff {eff:.2f} (baseline {eff_base:.2f})"),
                "ranks": k, "threads_per_rank": world_session.cpu_threads,
                "oversubscribed": shared,
                "partitions": [list(s) for _, s in times["partitions"]][-3:],
            })
    rows += gpu_sweep(comm, args, world_session)
    return rows


def gpu_sweep(comm, args, world_session) -> list:
    """Rank 0's rows of strong scaling on the GPUs of the first 1 and 2 ranks, where each
    of them has one of its own, beside the hand-written GPU solver on the same GPUs."""
    gpus = [d for d in world_session.devices if d != "cpu0"]
    counts = world_session.channel.allgather(len(gpus))
    rows, t1 = [], None
    for k in (1, 2):
        if comm.size < k or min(counts[:k]) < 1:
            break
        sub = group(comm, k)
        if sub is not None:
            ordinal = get_device(gpus[0]).ordinal
            times = measure(sub, args.size, args.steps, args.repeat, devices=gpus[:1],
                            baseline=lambda mpi, c, n: GpuBaseline(mpi, c, n, ordinal))
        world_session.channel.barrier()
        if comm.rank != 0:
            continue
        t1 = t1 or times["hetflow"]
        tk, bk = times["hetflow"], times["baseline"]
        rows.append({"name": f"strong {args.size}^2, {k} GPU(s), one per rank",
                     "baseline": fmt_s(bk), "hetflow": fmt_s(tk), "unit": "s",
                     "ratio": bk / tk, "baseline_s": bk, "hetflow_s": tk, "eff_hetflow": t1 / (k * tk),
                     **verdict(info=f"eff {t1 / (k * tk):.2f}; {args.size ** 2 * args.steps / tk / 1e9:.1f} "
                                    f"Gcell/s"), "ranks": k})
    return rows


def main(argv=None) -> int:
    args = _parse(argv)
    if not launched_by_mpi():
        return _relaunch(args, argv)
    comm = collectives.world()
    host_cores = len(os.sched_getaffinity(0))  # before the session binds this rank to its share
    world_session = cluster.session(comm)
    placements = world_session.channel.gather((world_session.host, world_session.cpu_threads, host_cores))
    rows = sweep(comm, args, world_session, placements)
    if comm.rank == 0:
        if args.json:
            print(json.dumps({"benchmark": "distributed", "rows": rows}, indent=1))
        else:
            report(rows, False, f"distributed heat solver, {args.steps} steps "
                                f"({world_session.cpu_threads} core(s) per rank)")
            if any(r.get("oversubscribed") for r in rows):
                print("note: the ranks of the rows marked oversubscribed share cores, so their "
                      "figures do not measure scaling")
    return 0


def _parse(argv):
    p = argparse.ArgumentParser(prog="hetflow bench distributed", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=at_least(1), default=4,
                   help="processes to start when not run under an MPI launcher")
    # a row for each rank of the largest group (4 ranks), and an interior
    p.add_argument("--size", type=at_least(4), default=4096, help="grid side for strong scaling")
    # an interior; k ranks get sqrt(k) times the side, which leaves each a row
    p.add_argument("--weak-size", type=at_least(3), default=2048, help="grid side per rank for weak scaling")
    p.add_argument("--steps", type=at_least(2), default=20, help="timed steps (even; an odd count is rounded up)")
    p.add_argument("--repeat", type=at_least(1), default=3, help="timed runs; the best counts")
    p.add_argument("--quick", action="store_true", help="tiny grids, one short run")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.size, args.weak_size, args.steps, args.repeat = 128, 96, 4, 1
    args.steps += args.steps % 2
    return args


def _relaunch(args, argv) -> int:
    """Start this benchmark under mpiexec with ``--ranks`` processes."""
    cmd = [mpiexec(), "-n", str(args.ranks), sys.executable, os.path.abspath(__file__)]
    cmd += list(sys.argv[1:] if argv is None else argv)
    return subprocess.run(cmd, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
