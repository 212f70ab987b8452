"""``hetflow demo``: the main job.

Heat diffusion on a 2-D grid, one explicit step written with ``interior`` and
``cshift`` views, captured as a DIR (two steps: u -> v, v -> u) and run under the
default adaptive rules, co-executed on every local device with work stealing; checked
against NumPy. Writes a Chrome/Perfetto trace and a timeline picture, in which the
start-up (compiling kernels, first transfers) is a named phase and the steps after it
are drawn again, zoomed.

Under ``mpiexec -n K hetflow demo`` the grid is split by rows over the ranks: the same
two steps run as a :class:`hetflow.cluster.DistributedProgram` (rank 0's central
interpreter cuts the rows over the ranks and rebalances them; each rank's local
interpreter co-executes its part on its own devices; halos are exchanged between
steps). A rank with a GPU of its own keeps its blocks coherent: they stay in the GPU's
memory between steps and only halo rows cross to the host (with its rows in host
memory alone, every step would copy them to the GPU and back). Its launches go to the
runtime's performance model over its cores and GPU (unless ``--devices`` says
otherwise), which runs this memory-bound step on the GPU almost alone: the cores are
some 50x slower at it. Rank 0 prints one summary,
with rows per rank and device, checks the gathered grid against NumPy, and writes one
trace holding every rank's lanes and one picture.
"""
from __future__ import annotations

import io
import os
import sys
import time
from pathlib import Path

import numpy as np

from .. import cluster, collectives, trace
from ..index import cshift, interior
from ..errors import ArgumentError, DeviceError, HetflowError, RemoteError
from ..ir import RuleSet, graph
from ..kernels import kernel
from ..platform.devices import device_list, devices, get_device
from ..runtime.buffers import array

ALPHA = 0.1
MIN_SIZE = 3  # grid points per side: a border around one interior point
STARTUP = "start-up (compile, first transfers)"


class UsageError(SystemExit):
    """A command line the command cannot run, refused before it runs: the ``hetflow``
    command says ``message`` in one line and exits with status 2, as for argparse's
    usage errors."""

    def __init__(self, message: str):
        super().__init__(2)
        self.message = message

    def __str__(self) -> str:
        return self.message


@kernel
def heat_step(i, j, new, centre, north, south, west, east, alpha):
    """One explicit diffusion step on the interior, written with views."""
    new[i, j] = centre[i, j] + alpha * (north[i, j] + south[i, j] + west[i, j] + east[i, j] - 4.0 * centre[i, j])


def step_views(src, dst):
    """The arguments of one step from ``src`` into ``dst`` (all views: nothing copied), of
    NumPy, coherent or distributed arrays alike."""
    return (interior(dst, 1), interior(src, 1),
            interior(cshift(src, 0, -1), 1), interior(cshift(src, 0, 1), 1),
            interior(cshift(src, 1, -1), 1), interior(cshift(src, 1, 1), 1), ALPHA)


def numpy_step(u):
    out = u.copy()
    c = u[1:-1, 1:-1]
    out[1:-1, 1:-1] = c + ALPHA * (u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:] - 4.0 * c)
    return out


def initial(n):
    u = np.zeros((n, n))
    u[n // 4: n // 2, n // 4: n // 2] = 100.0
    u[n // 2: 3 * n // 4, n // 2: 3 * n // 4] = 50.0
    return u


def grids(n, distributed: bool, place=None):
    """The two grids the steps go between, both holding the initial state (v's border is
    u's and never changes): coherent arrays (each device keeps the rows it works on
    between steps), or arrays split by rows over the ranks, each rank's block where
    ``place`` says (``cluster.asarray``'s ``device``)."""
    if not distributed:
        return array(initial(n)), array(initial(n))
    u = cluster.asarray(initial(n), device=place)
    return u, cluster.asarray(initial(n), like=u)


def add_arguments(p):
    p.add_argument("--size", type=int, default=1024, help=f"grid points per side (at least {MIN_SIZE}; default 1024)")
    p.add_argument("--iterations", type=int, default=100, help="diffusion steps (even, at least 2; default 100)")
    p.add_argument("--devices", default=None,
                   help="comma-separated device ids (default: every real device found; under "
                        "mpiexec, each rank's own: its share of the cores and its GPUs)")
    p.add_argument("--rules", default=None,
                   help="a TOML rule file to use instead of the default rules (under mpiexec: "
                        "rank 0 reads it and its rules join every rank's local rules)")
    p.add_argument("--trace", default="hetflow-trace.json", help="where to write the Chrome/Perfetto trace")
    p.add_argument("--timeline", default="hetflow-timeline.png", help="where to draw the timeline")


def capture(u, v, device=None):
    """The DIR of two steps, u -> v and v -> u, each co-executed with work stealing."""
    with graph("heat") as g:
        shape = interior(u, 1).shape
        for src, dst in ((u, v), (v, u)):
            cluster.forall(shape, heat_step, *step_views(src, dst), device=device, schedule="steal")
    return g


def steps_phase(iterations) -> str:
    """The trace's phase of the steps after the start-up: the timeline zooms to it."""
    return f"steps 3-{iterations}"


def zoom(iterations) -> str | None:
    """What the timeline zooms to: the steps after the start-up, where there are any."""
    return steps_phase(iterations) if iterations > 2 else None


def diffuse(setup, iterations, rec, bar, finish=lambda: None):
    """(grid, start-up seconds, seconds of the steps after it) after ``iterations`` (even)
    steps. ``setup()`` returns the grid and a function running two steps; it and the
    first two steps are the start-up phase of the trace (compiling kernels, first
    transfers), so the picture names that time. ``finish()`` waits for work still queued
    on a GPU, so that each phase's time is what it took."""
    began = time.perf_counter()
    with rec.phase(STARTUP):
        u, two_steps = setup()
        two_steps()
        finish()
        bar.advance(2)
    startup = time.perf_counter() - began
    if iterations > 2:
        with rec.phase(steps_phase(iterations)):
            for _ in range(iterations // 2 - 1):
                two_steps()  # a safe point first: the rules see the monitor's feedback
                bar.advance(2)
            finish()
    return u, startup, time.perf_counter() - began - startup


def summary_rows(recorder):
    """Per device: chunks, indices and steals over every recorded loop."""
    rows = {}
    for loop in recorder.loops:
        for w in loop.report.workers:
            r = rows.setdefault(w.device_id, {"kind": w.kind, "workers": set(), "chunks": 0,
                                             "indices": 0, "steals": 0, "busy": 0.0})
            r["workers"].add(w.name)
            r["chunks"] += w.chunks
            r["indices"] += w.indices
            r["steals"] += w.steals
            r["busy"] += w.busy_s
    return rows


def print_summary(rows, title, n, iterations, startup, steady):
    """``rows``: (rank, device) -> counters; a rank column unless the rank is None. The
    throughput is the steady state's: the steps after start-up (compiling, first copies)."""
    from rich.console import Console
    from rich.table import Table

    ranked = any(rank is not None for rank, _ in rows)
    t = Table(title=f"{title}, {startup + steady:.2f} s")
    for col in ("rank",) * ranked + ("device", "kind", "workers", "chunks", "steals", "rows run", "share"):
        t.add_column(col, justify="left" if col in ("device", "kind") else "right")
    total = sum(r["indices"] for r in rows.values()) or 1
    for (rank, dev), r in sorted(rows.items(), key=lambda item: (item[0][0] or 0, item[0][1])):
        t.add_row(*(str(rank),) * ranked, dev, r["kind"], str(len(r["workers"])), str(r["chunks"]),
                  str(r["steals"]), str(r["indices"]), f"{100 * r['indices'] / total:.1f}%")
    Console().print(t)
    line = f"start-up (compiling, first transfers, steps 1-2): {startup:.2f} s"
    if iterations > 2 and steady > 0:
        line += (f"; steps 3-{iterations}: {steady:.3g} s, throughput "
                 f"{(n - 2) ** 2 * (iterations - 2) / steady / 1e6:.1f} Mcell/s")
    print(line)


def print_files(trace_path, picture) -> None:
    """Where the trace and the timeline ``picture`` (what plot_timeline returned) went."""
    chunks, lanes, steals = (f"{k} {what}{'s' * (k != 1)}" for k, what in
                             ((picture.bars, "chunk"), (picture.lanes, "lane"), (picture.steals, "steal")))
    print(f"trace: {trace_path} ({chunks} on {lanes}, {steals}); timeline: {picture.path}")


def output_problem(path, image=False) -> str | None:
    """Why the file ``path`` (an image, its format by suffix, if ``image``) could not be
    written, or None: asked before a run, so that a mistyped path costs no run."""
    path = Path(path)
    folder = path.parent
    if not folder.is_dir():
        return f"{folder} is not a directory" if folder.exists() else f"the directory {folder} does not exist"
    if path.is_dir():
        return "it is a directory"
    if not os.access(path if path.exists() else folder, os.W_OK):
        return f"{path if path.exists() else f'the directory {folder}'} is not writable"
    if image:
        from matplotlib.backend_bases import FigureCanvasBase

        formats = FigureCanvasBase.get_supported_filetypes()
        if path.suffix and path.suffix[1:].lower() not in formats:
            return f"no image format {path.suffix!r}; the formats: {', '.join(sorted(formats))}"
    return None


def check(grid, n, iterations) -> bool:
    """Print the grid against NumPy's steps, and its residual; True when it matches."""
    reference = initial(n)
    for _ in range(iterations):
        reference = numpy_step(reference)
    error = float(np.max(np.abs(grid - reference)))
    residual = float(np.sqrt(np.mean((numpy_step(grid) - grid) ** 2)))
    ok = error <= 1e-9 * max(1.0, float(np.max(np.abs(reference))))
    print(f"max |error| vs NumPy: {error:.3e}")
    print(f"residual: {residual:.15e}")
    print(f"verification: {'passed' if ok else 'failed'}")
    return ok


def _finish(targets) -> None:
    """Wait for the steps still queued on the GPUs among ``targets``."""
    for d in map(get_device, targets):
        d.synchronize()


def device_ids(text: str | None) -> list | None:
    """The device ids of a ``--devices`` option (comma-separated), each one this machine
    has, named once; None without one. An id named twice is an ArgumentError, an id this
    machine lacks a DeviceError naming it."""
    if not text:
        return None
    ids = [d.strip() for d in text.split(",")]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise ArgumentError(f"--devices {text}: names {', '.join(twice)} more than once (each device "
                            f"runs its share once)")
    try:
        found = device_list(ids, "--devices", "a comma-separated list of device ids")
    except DeviceError as exc:  # an id this machine lacks: the message names the option too
        raise DeviceError(f"--devices {text}: {exc}") from None
    return [d.id for d in found]


def _targets(args) -> list | None:
    """:func:`device_ids` of ``--devices``; an id named twice is the command line's fault
    alone (UsageError)."""
    try:
        return device_ids(args.devices)
    except ArgumentError as exc:
        raise UsageError(str(exc)) from None


def rank_devices(args, own) -> tuple:
    """The devices a rank runs on: ``--devices`` if given, else its ``own`` (its cores and
    GPUs), over which the runtime's model places each launch (the module docstring)."""
    return tuple(_targets(args) or own)


def _check_arguments(args) -> None:
    """Refuse, in one line, a grid or a number of steps the demo cannot run."""
    if args.size < MIN_SIZE:
        raise UsageError(f"--size must be at least {MIN_SIZE} (a grid with an interior point); got {args.size}")
    if args.iterations < 2 or args.iterations % 2:
        raise UsageError(f"--iterations must be even and at least 2 (the steps go u -> v -> u); "
                         f"got {args.iterations}")


def _check_outputs(args) -> None:
    """Refuse, in one line and before the run, a trace or timeline it could not write after it."""
    if Path(args.trace).resolve() == Path(args.timeline).resolve():
        raise UsageError(f"--trace and --timeline name one file, {args.trace}: the timeline would "
                         f"overwrite the trace")
    for option, path, image in (("--trace", args.trace, False), ("--timeline", args.timeline, True)):
        problem = output_problem(path, image)
        if problem:
            raise UsageError(f"{option} {path}: cannot write it: {problem}")


def _prepare(args) -> tuple:
    """(device ids or None, rules) of a run, after the checks that refuse it before it runs:
    a bad --devices or --rules fails here."""
    _check_arguments(args)
    _check_outputs(args)
    return _targets(args), RuleSet.load(args.rules) if args.rules else RuleSet.default()


def _problem(exc) -> str:
    """What ``exc`` (a check's UsageError or hetflow error) says, as a line after ``hetflow: error:``."""
    if isinstance(exc, UsageError):
        return exc.message
    return f"{type(exc).__name__}: {exc}"


# Options every rank must be given alike: the ranks run one grid for one number of steps
# (--devices may differ: each rank's own; --rules, --trace and --timeline are rank 0's).
SHARED_OPTIONS = ("size", "iterations")


def _disagreement(options) -> str:
    """How the ranks' shared options (a tuple per rank, of SHARED_OPTIONS) differ."""
    differ = [f"--{name} ({', '.join(f'rank {r}: {o[i]}' for r, o in enumerate(options))})"
              for i, name in enumerate(SHARED_OPTIONS) if len({o[i] for o in options}) > 1]
    return f"the ranks were given different {'; '.join(differ)}: they run one grid together"


def _prepare_rank(args, ranks: int) -> tuple:
    """:func:`_prepare` on one of ``ranks`` ranks, after setting the run up (a setting a
    rank refuses fails there) and checking that every rank gets a row of the grid."""
    cluster.session()
    prepared = _prepare(args)
    if args.size < ranks:
        raise UsageError(f"--size {args.size} gives {ranks} ranks {args.size} rows: every rank needs at "
                         f"least one (run at most {args.size} ranks, or a larger --size)")
    return prepared


def _prepare_ranks(args) -> tuple:
    """:func:`_prepare_rank` on every rank of an mpiexec run, its refusals said once, by
    rank 0: a problem every rank met as it is, problems that differ naming each rank.
    Every rank stops when any rank found one, with one exit status (the others quietly):
    2 for a command line every rank refused alike, else 1."""
    comm = collectives.world()
    try:
        prepared, failure = _prepare_rank(args, comm.size), None
    except (UsageError, HetflowError) as exc:
        prepared, failure = None, exc
    found = comm.allgather((None if failure is None else _problem(failure),
                            tuple(getattr(args, name) for name in SHARED_OPTIONS)))
    problems, options = zip(*found)
    if not any(problems) and len(set(options)) == 1:
        return prepared
    alike = len(set(problems)) == 1
    if comm.rank != 0:  # (mpiexec ORs the ranks' statuses: each must exit with rank 0's)
        raise SystemExit(2 if not any(problems) or alike and isinstance(failure, UsageError) else 1)
    if not any(problems):
        raise UsageError(_disagreement(options))
    if alike:  # every rank met it
        raise failure
    raise SystemExit("\n".join(f"hetflow: error: rank {r}: {p}" for r, p in enumerate(problems) if p))


def run_demo(args) -> int:
    launched = collectives.launched_by_mpi()
    # Under mpiexec every rank checks, but a refusal is said once, not once per rank.
    targets, rules = _prepare_ranks(args) if launched else _prepare(args)
    if not launched or cluster.session().size == 1:
        return _run_one(args, targets or [d.id for d in devices() if not d.simulated], rules)
    try:
        return cluster.run_distributed(_run_ranks, args)  # (rank 0's program reads the rule file)
    except RemoteError:
        raise SystemExit(1) from None  # another rank failed: it says why, once
    except HetflowError as exc:  # this rank's own failure, which the others do not repeat
        raise type(exc)(f"rank {cluster.session().rank}: {exc}") from exc


def _run_one(args, targets, rules) -> int:
    n = args.size
    print(f"devices: {', '.join(targets)}; rules: {args.rules or 'default'}")

    def setup():
        u, v = grids(n, distributed=False)
        g = capture(u, v, device=targets)
        return u, lambda: g.run(rules=rules)

    with trace.record() as rec, trace.progress(args.iterations, "diffusing") as bar:
        u, startup, steady = diffuse(setup, args.iterations, rec, bar, lambda: _finish(targets))
    rows = {(None, dev): r for dev, r in summary_rows(rec).items()}
    what = f"heat diffusion {n}x{n}, {args.iterations} iterations"
    print_summary(rows, what, n, args.iterations, startup, steady)
    rec.save(args.trace)
    print_files(args.trace, rec.plot(args.timeline, title=f"hetflow demo: {what} on {', '.join(targets)}",
                                     zoom=zoom(args.iterations)))
    return 0 if check(np.asarray(u), n, args.iterations) else 1


def _run_ranks(args) -> int:
    """The demo on every rank of an mpiexec run (inside cluster.run_distributed: a rank that
    fails stops the others); rank 0 reports for all."""
    current = cluster.session()
    channel, rank = current.channel, current.rank
    here = rank_devices(args, current.devices)
    place = cluster.darray.place_for(here)
    n = args.size
    listed = channel.gather(here)
    if rank == 0:
        shared = " (oversubscribed: ranks share cores)" if current.oversubscribed else ""
        print(f"ranks: {current.size}{shared}; devices: "
              + " · ".join(f"rank {r}: {', '.join(ids)}" for r, ids in enumerate(listed))
              + f"; rules: {args.rules or 'default'}")
    program = None

    def setup():
        nonlocal program
        u, v = grids(n, distributed=True, place=place)
        program = cluster.DistributedProgram(capture(u, v), devices=here, rule_file=args.rules)
        return u, lambda: program.run(1)

    channel.barrier()  # the ranks begin recording together: one clock for the merged trace
    bar_file = sys.stderr if rank == 0 else io.StringIO()  # only rank 0 draws a progress bar
    with trace.record() as rec, trace.progress(args.iterations, "diffusing", file=bar_file) as bar:
        u, startup, steady = diffuse(setup, args.iterations, rec, bar, lambda: _finish(here))
    grid = u.gather(0)
    gathered = channel.gather((rec.to_chrome_trace(rank=rank), summary_rows(rec)))
    ok = True
    if rank == 0:
        ok = _report_ranks(args, gathered, grid, program.partitions, (startup, steady))
    return 0 if channel.bcast(ok) else 1


def _report_ranks(args, gathered, grid, partitions, times) -> bool:
    """Rank 0: one summary, one trace, one picture, the check."""
    n, ranks = args.size, len(gathered)
    rows = {(r, dev): row for r, (_, per_device) in enumerate(gathered) for dev, row in per_device.items()}
    what = f"heat diffusion {n}x{n} on {ranks} ranks, {args.iterations} iterations"
    print_summary(rows, what, n, args.iterations, *times)
    final = partitions[-1][1]
    print(f"rows per rank: {' + '.join(map(str, final))} = {sum(final)}; partitions (iteration: rows "
          f"per rank): " + "; ".join(f"{it}: {list(sizes)}" for it, sizes in partitions))
    merged = trace.merge_chrome_traces(t for t, _ in gathered)
    trace.write_chrome_trace(args.trace, merged)
    print_files(args.trace, trace.plot_timeline(merged, args.timeline, title=f"hetflow demo: {what}",
                                                zoom=zoom(args.iterations)))
    return check(grid, n, args.iterations)
