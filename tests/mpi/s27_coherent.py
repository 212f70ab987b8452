"""Run under mpiexec -n 2 by tests/test_s27_coherent_blocks.py: distributed arrays whose
blocks are coherent arrays (a host copy and GPU copies).

``sim``: every rank keeps its blocks coherent (``device='coherent'``) and runs its part
on the CUDA simulator's GPU alone. Once the rows are placed, each iteration must move
exactly the halo rows between each block's host and GPU copies, never the block; then
rank 1 is told its GPU is 90% taken, rows move to rank 0 (the blocks of the old cut are
freed), and the grid must equal NumPy's. ``auto``: the default placement on a host with real GPUs: a rank with a GPU of
its own keeps coherent blocks and co-executes on its cores and that GPU, the others
keep NumPy blocks; the grid must equal NumPy's. Every rank prints "rank R: coherent ok".
"""
import gc
import sys
import weakref
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import heat_distributed as heat  # noqa: E402

import hetflow  # noqa: E402
from hetflow import cluster, collectives  # noqa: E402


def program_over(u, v, comm, devices, **options):
    with hetflow.graph("heat") as g:
        shape = hetflow.interior(u, 1).shape
        cluster.forall(shape, heat.heat_step, *heat.step_args(u, v))
        cluster.forall(shape, heat.heat_step, *heat.step_args(v, u))
    return cluster.DistributedProgram(g, comm=comm, devices=devices, **options)


def moved(arrays) -> list:
    return [dict(a.local.moved) for a in arrays]


def sim(comm):
    n = 16
    u = cluster.asarray(heat.initial(n), comm=comm, device="coherent")
    v = cluster.asarray(heat.initial(n), like=u)
    assert u.coherent and v.coherent and isinstance(u.local, hetflow.Buffer), u
    program = program_over(u, v, comm, ["gpu0"], report_every=2, threshold=0.5)
    program.run(1)  # places the rows: each block goes to the GPU once
    before = moved((u, v))
    program.run(1)
    after = moved((u, v))
    row = n * 8  # bytes of one row of float64
    for a, b in zip(before, after):  # one halo exchange each: two rows out, two rows in
        assert b["to_host"] - a["to_host"] == 2 * row and b["to_device"] - a["to_device"] == 2 * row, \
            (before, after)
    cpu = hetflow.get_device("cpu0")
    for a in (u, v):  # the rows received went straight to the GPU's copy, not through the host's
        m = a.stop - a.start
        assert a.local.stale_rows(cpu, [(0, 1), (m + 1, m + 2)]) == [(0, 1), (m + 1, m + 2)], a.local
    program.run(2)  # up to the report of iteration 4
    first = program.partitions[-1][1]
    before_cut = weakref.ref(u.local)
    if comm.rank == 1:
        program.monitor.inject("utilization", device="gpu0", value=0.9)
    program.run(4)
    sizes = dict(program.partitions)
    assert 4 in sizes and sizes[4][1] < first[1], program.partitions
    assert u.coherent and isinstance(u.local, hetflow.Buffer)  # rows moved into new coherent blocks
    gc.collect()
    assert before_cut() is None, gc.get_referrers(before_cut())  # the old block's memory is freed
    grid = u.gather(0)
    if comm.rank == 0:
        error = float(np.max(np.abs(grid - heat.numpy_solve(n, 2 * 8))))
        assert error <= 1e-12, error


def auto(comm):
    n, iterations = 256, 20
    program, u, v = heat.setup(n, comm)
    own = [d for d in cluster.session(comm).devices if d != "cpu0"]
    assert u.coherent == bool(own) and v.coherent == bool(own), (own, u)
    result = heat.advance(program, u, v, iterations)
    if own:  # the rank's GPU worked on its rows: some crossed to it
        assert result.local.moved["to_device"] > 0, result.local.moved
    grid = result.gather(0)
    if comm.rank == 0:
        error = float(np.max(np.abs(grid - heat.numpy_solve(n, iterations))))
        assert error <= 1e-10, error  # a GPU may contract a * b + c into one FMA


if __name__ == "__main__":
    comm = collectives.world(timeout=60)
    with cluster.distributed(comm):
        {"sim": sim, "auto": auto}[sys.argv[1]](comm)
    print(f"rank {comm.rank}: coherent ok", flush=True)
