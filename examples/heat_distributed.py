"""Heat diffusion on a 2-D grid over MPI ranks: distributed arrays, halos, rebalancing.

    mpiexec -n 4 python examples/heat_distributed.py --size 1024 --iterations 100
    python examples/heat_distributed.py                # the same program, one process

Each rank holds a block of rows of the grid plus one halo row on each side. One
explicit step is written with ``interior`` and ``cshift`` views, as for one process;
two steps (u -> v, v -> u) are captured as a DIR and run by a
``hetflow.cluster.DistributedProgram``: rank 0's central interpreter cuts the rows over
the ranks from their reported capacities and rebalances them when measured speeds
drift apart; each rank's local interpreter runs its part on its own CPU cores and GPUs.
Rank 0 reports the start-up (compiling, first transfers: steps 1-2) apart from the
steps after it, whose throughput it gives, as ``hetflow demo`` does, and checks the
result against NumPy.
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import hetflow
from hetflow import cluster

ALPHA = 0.1


@hetflow.kernel
def heat_step(i, j, new, centre, north, south, west, east, alpha):
    """One explicit diffusion step on the interior, written with views."""
    new[i, j] = centre[i, j] + alpha * (north[i, j] + south[i, j] + west[i, j] + east[i, j] - 4.0 * centre[i, j])


def step_args(src, dst):
    """The arguments of one step from ``src`` into ``dst``: views, nothing copied."""
    return (hetflow.interior(dst, 1), hetflow.interior(src, 1),
            hetflow.interior(hetflow.cshift(src, 0, -1), 1), hetflow.interior(hetflow.cshift(src, 0, 1), 1),
            hetflow.interior(hetflow.cshift(src, 1, -1), 1), hetflow.interior(hetflow.cshift(src, 1, 1), 1), ALPHA)


def initial(n: int) -> np.ndarray:
    """Two hot squares on a cold grid whose border stays at 0."""
    u = np.zeros((n, n))
    u[n // 4: n // 2, n // 4: n // 2] = 100.0
    u[n // 2: 3 * n // 4, n // 2: 3 * n // 4] = 50.0
    return u


def numpy_solve(n: int, iterations: int) -> np.ndarray:
    """The same steps in NumPy: the oracle."""
    u = initial(n)
    for _ in range(iterations):
        c = u[1:-1, 1:-1]
        new = u.copy()
        new[1:-1, 1:-1] = c + ALPHA * (u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:] - 4.0 * c)
        u = new
    return u


def setup(n: int, comm=None, devices=None, place=None, **options):
    """(program, u, v): the grid distributed over the ranks and the two captured steps.

    ``devices``: this rank's device ids (default: its CPU cores and its GPUs).
    ``place``: where this rank keeps its blocks (``cluster.asarray``'s ``device``); by
    default coherent (a host copy and a GPU copy: each device's rows stay on it, only
    halo rows move) where ``devices`` hold a GPU, else in host memory. ``options`` go to
    DistributedProgram.
    """
    if place is None and devices is not None:  # (else the rank's own choice: coherent where it has a GPU)
        place = cluster.darray.place_for(devices)
    u = cluster.asarray(initial(n), comm=comm, device=place)
    v = cluster.asarray(initial(n), like=u)  # the border of v is u's: it never changes
    with hetflow.graph("heat") as g:
        shape = hetflow.interior(u, 1).shape
        cluster.forall(shape, heat_step, *step_args(u, v))
        cluster.forall(shape, heat_step, *step_args(v, u))
    return cluster.DistributedProgram(g, comm=comm, devices=devices, **options), u, v


def advance(program, u, v, iterations: int):
    """Run ``iterations`` steps; returns the array holding the result (u or v)."""
    program.run(iterations // 2)
    if iterations % 2:  # one more step, launched directly
        cluster.forall(hetflow.interior(u, 1).shape, heat_step, *step_args(u, v))
        return v
    return u


STARTUP_STEPS = 2  # the first run of the captured steps compiles them and places the rows


def wait(devices) -> None:
    """Wait until this rank's GPUs among ``devices`` have run what was enqueued on them:
    steps on blocks in GPU memory return once they are enqueued."""
    for d in map(hetflow.get_device, devices or ()):
        d.synchronize()


def solve(n: int, iterations: int, comm=None, devices=None):
    """The grid after ``iterations`` steps: the full array on rank 0, None elsewhere.

    Under mpiexec the rows are spread over the ranks; if one rank fails, every rank
    stops (the others with RemoteError naming it).
    """
    def body():
        program, u, v = setup(n, comm, devices)
        return advance(program, u, v, iterations).gather(0)

    return cluster.run_distributed(body, comm=comm)


def timing(n: int, iterations: int, ranks: int, startup: float, steady: float) -> str:
    """The run's times: the start-up (steps 1-2), then the steps after it and their
    throughput, which start-up would understate."""
    first = min(STARTUP_STEPS, iterations)
    line = (f"{n}x{n}, {iterations} iterations on {ranks} rank(s): start-up (compiling, first "
            f"transfers, {_steps(1, first)}): {startup:.3f} s")
    if iterations > first:
        cells = (n - 2) ** 2 * (iterations - first)
        line += f"; {_steps(first + 1, iterations)}: {steady:.3f} s, throughput {cells / steady / 1e6:.1f} Mcell/s"
    return line


def _steps(first: int, last: int) -> str:
    return f"step {first}" if first == last else f"steps {first}-{last}"


def refusal(args, current) -> str | None:
    """Why this rank of the session ``current`` cannot run ``args``, or None."""
    if args.size < 3:
        return f"--size must be at least 3 (a grid with an interior point), got {args.size}"
    if args.iterations < 1:
        return f"--iterations must be at least 1, got {args.iterations}"
    if args.size < current.size:
        return (f"--size {args.size} gives {current.size} ranks {args.size} rows: every rank needs at "
                f"least one (run at most {args.size} ranks, or a larger --size)")
    if args.gpu and not [d for d in current.devices if d != "cpu0"]:
        if not any(d.kind == "gpu" and not d.simulated for d in hetflow.devices()):
            return "--gpu needs a GPU, and this host has none (a simulated GPU is never a rank's own)"
        return f"rank {current.rank}: no GPU of its own (run at most one rank per GPU)"
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=512, help="grid points per side")
    p.add_argument("--iterations", type=int, default=100)
    p.add_argument("--gpu", action="store_true", help="each rank computes on its own GPU only")
    p.add_argument("--no-check", action="store_true", help="skip the NumPy check")
    args = p.parse_args(argv)
    current = cluster.session()
    # Every rank checks, and every rank stops when one cannot run (a rank leaving alone
    # would leave the others waiting for it); rank 0 says why, once.
    problems = current.channel.allgather(refusal(args, current))
    if any(problems):
        if current.rank == 0:
            p.error("; ".join(dict.fromkeys(filter(None, problems))))
        return 2
    devices = [d for d in current.devices if d != "cpu0"][:1] if args.gpu else None

    first = min(STARTUP_STEPS, args.iterations)

    def body():
        current.channel.barrier()
        began = time.perf_counter()
        program, u, v = setup(args.size, devices=devices)
        result = advance(program, u, v, first)
        wait(devices)
        startup = time.perf_counter() - began
        if args.iterations > first:  # the steps after start-up continue from u
            result = advance(program, u, v, args.iterations - first)
            wait(devices)
        return result.gather(0), startup, time.perf_counter() - began - startup, program.partitions

    grid, startup, steady, partitions = cluster.run_distributed(body)
    if current.rank != 0:
        return 0
    print(timing(args.size, args.iterations, current.size, startup, steady))
    if partitions:  # none when a single step ran, outside the program
        print("partitions (iteration: rows per rank): "
              + "; ".join(f"{it}: {list(sizes)}" for it, sizes in partitions))
    if args.no_check:
        return 0
    reference = numpy_solve(args.size, args.iterations)
    error = float(np.max(np.abs(grid - reference)))
    print(f"max |error| vs NumPy: {error:.3e}")
    # a GPU may contract a * b + c into one FMA: allow last-bit differences there
    return 0 if error <= (1e-10 if args.gpu else 1e-12) * float(np.max(np.abs(reference))) else 1


if __name__ == "__main__":
    sys.exit(main())
