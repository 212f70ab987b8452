"""DIR benchmark: a chain of four elementwise launches, fused by the rules vs as captured.

First, the cost of a safe point: ``g.run()`` of a captured graph of two tiny launches
(8 elements each, default rules, nothing to change) against calling the same two
launches directly; the difference is what running through the DIR adds per run.

The program (10^7 float64 by default) is captured once per contender with
``hetflow.graph()``:

    t0 = 2 x;  t1 = t0 + 1;  t2 = t1 * t1;  y = t2 - x

* ``unfused``: the captured version run with no rules (``RuleSet()``): four launches,
  three intermediate arrays written and read back.
* ``fused``: the default rules fuse the chain into one generated kernel; the
  intermediates become local scalars and are never allocated.

Baselines in the same process: the unfused graph (the figure the target is about),
NumPy with preallocated outputs, and a hand-fused Numba ``prange`` loop. Ratios are
speed-ups of the fused graph (baseline time / fused time).

On a machine with an NVIDIA GPU (and CuPy), two more sections: the same chain in GPU
memory, and an **adaptive Jacobi**: an iterative 2-D Jacobi program (two captured
steps per iteration, arrays in managed memory) runs on the GPU while a second process
starts loading that GPU partway through. "static" keeps the launches on the GPU;
"adaptive" runs with ``examples/rules/move_off_busy_gpu.toml``, whose rules move the
launches to the CPU cores at the next safe point (between iterations) once the monitor
sees another process on the GPU. Ratio: static time / adaptive time. Each section is a
function of the parsed arguments returning table rows and notes (``SECTIONS``).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numba
import numpy as np

import hetflow
from hetflow.ir import Interpreter, Monitor, NodePattern, Partition, Rule, RuleSet
from hetflow.cuda_compat import cuda_module, cupy_module

sys.path.append(os.path.dirname(__file__))
from _common import above, at_least, best_time, clause, fmt_s, per_call, report, verdict  # noqa: E402
from _gpuload import GpuHog  # noqa: E402

MOVE_RULES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "examples", "rules", "move_off_busy_gpu.toml")


@hetflow.kernel
def dir_scale(i, a, x, out):
    out[i] = a * x[i]


@hetflow.kernel
def dir_shift(i, x, b, out):
    out[i] = x[i] + b


@hetflow.kernel
def dir_square(i, x, out):
    out[i] = x[i] * x[i]


@hetflow.kernel
def dir_sub(i, x, y, out):
    out[i] = x[i] - y[i]


@numba.njit(parallel=True, nogil=True)
def numba_chain(x, y):
    for i in numba.prange(x.shape[0]):
        t = 2.0 * x[i] + 1.0
        y[i] = t * t - x[i]


def chain_graph(n, x, y, name, device=None):
    """The four-launch program, captured (nothing runs here); intermediates on ``device``."""
    with hetflow.graph(name) as g:
        t0, t1, t2 = (hetflow.empty(n, device=device) for _ in range(3))
        hetflow.forall(n, dir_scale, 2.0, x, t0)
        hetflow.forall(n, dir_shift, t0, 1.0, t1)
        hetflow.forall(n, dir_square, t1, t2)
        hetflow.forall(n, dir_sub, t2, x, y)
    return g, (t0, t1, t2)


def check_fused(fused, temps) -> None:
    launches = sum(1 for node in fused.current.nodes if node.op == "forall")
    if launches != 1 or any(t.materialized for t in temps):
        raise RuntimeError(f"the chain was not fused as expected:\n{fused.describe()}")


def overhead_rows(args):
    """g.run() of a 2-node graph against the two launches called directly."""
    n, calls = 8, 200 if args.quick else 3000
    x, y, z = np.ones(n), np.zeros(n), np.zeros(n)
    with hetflow.graph("two-launches") as g:
        hetflow.forall(n, dir_scale, 2.0, x, y)
        hetflow.forall(n, dir_scale, 3.0, x, z)

    def direct():
        hetflow.forall(n, dir_scale, 2.0, x, y)
        hetflow.forall(n, dir_scale, 3.0, x, z)

    g.run()
    direct()
    runs, directs = [], []
    for _ in range(args.repeat):  # interleaved, so that both see the same machine load
        runs.append(per_call(g.run, calls, repeat=1))
        directs.append(per_call(direct, calls, repeat=1))
    t_run, t_direct = min(runs), min(directs)
    np.testing.assert_array_equal(y, 2.0 * x)
    np.testing.assert_array_equal(z, 3.0 * x)
    row = dict(name="g.run() 2 launches n=8 vs direct calls", baseline=fmt_s(t_direct), hetflow=fmt_s(t_run),
               ratio=t_direct / t_run, **verdict(clause(t_run - t_direct, "<=", 20e-6, "s", label="overhead")))
    note = (f"g.run() overhead for a 2-node graph: {(t_run - t_direct) * 1e6:.1f} us per run "
            f"(best of {args.repeat} x {calls} runs, default rules, {len(g.versions)} version(s))")
    return [row], [note]


def many_rules(count: int) -> str:
    """A rule file of ``count`` rules, each with its own expressions (none shares a
    compiled form)."""
    return "".join(
        f'[[rule]]\nname = "r{k}"\npriority = {k % 5}\nwhen = "gpu.utilization > {k} and count(\'gpu\') > 0"\n'
        f'match = {{ op = "forall", chain = 2 }}\n'
        f'then = [ {{ action = "partition", shares = {{ cpu = "gpu.utilization * {k}", gpu = {k + 1} }} }} ]\n'
        for k in range(count))


def rulefile_rows(args):
    """Loading a rule file of 10,000 rules against ten times the load of 1,000 (a ratio
    near 1: loading is linear) and against the 2 s target."""
    from hetflow.ir import RuleSet
    from hetflow.ir.rulefile import loads

    small, big = (100, 1000) if args.quick else (1000, 10_000)
    texts = {count: many_rules(count) for count in (small, big)}

    def load(count):
        began = time.perf_counter()
        rules = RuleSet(loads(texts[count]))
        seconds = time.perf_counter() - began
        assert len(rules) == count
        return seconds

    t_small = min(load(small) for _ in range(args.repeat))
    t_big = min(load(big) for _ in range(max(1, args.repeat // 2)))
    row = dict(name=f"load {big} rules vs 10x {small} rules", baseline=fmt_s((big // small) * t_small),
               hetflow=fmt_s(t_big), ratio=(big // small) * t_small / t_big,
               **(verdict() if args.quick else verdict(clause(t_big, "<", 2.0, "s", label=f"{big} rules"))))
    return [row], []


def cpu_rows(args):
    n, repeat = args.n, args.repeat
    x = np.random.default_rng(0).random(n)
    expected = (2.0 * x + 1.0) ** 2 - x
    y_plain, y_fused, y_np, y_nb = (np.empty(n) for _ in range(4))
    plain, _ = chain_graph(n, x, y_plain, "unfused")
    fused, temps = chain_graph(n, x, y_fused, "fused")
    no_rules = RuleSet()

    def numpy_chain():
        np.multiply(2.0, x, out=y_np)
        np.add(y_np, 1.0, out=y_np)
        np.multiply(y_np, y_np, out=y_np)
        np.subtract(y_np, x, out=y_np)

    t_plain = best_time(lambda: plain.run(rules=no_rules), repeat)
    t_fused = best_time(lambda: fused.run(), repeat)
    t_numpy = best_time(numpy_chain, repeat)
    t_numba = best_time(lambda: numba_chain(x, y_nb), repeat)
    for y in (y_plain, y_fused, y_np, y_nb):
        np.testing.assert_allclose(y, expected, rtol=1e-12)
    check_fused(fused, temps)
    return table("", n, t_fused, [("unfused graph", t_plain, 2.5), ("numpy (out=)", t_numpy, None),
                                  ("numba, fused by hand", t_numba, None)]), []


def table(prefix, n, t_fused, baselines):
    """Rows of the fused graph's time against each ``(name, seconds, least ratio or None)``
    baseline."""
    return [dict(name=f"{prefix}4 ops n={n:.0e} vs {name}", baseline=fmt_s(t), hetflow=fmt_s(t_fused),
                 ratio=t / t_fused, **(verdict() if least is None else verdict(clause(t / t_fused, ">=", least))))
            for name, t, least in baselines]


def real_gpu() -> bool:
    return any(d.kind == "gpu" and not d.simulated for d in hetflow.devices())


def gpu_rows(args):
    """The same chain on the first GPU: inputs, outputs and intermediates in GPU memory."""
    n, repeat = args.n, args.repeat
    cp, cuda = cupy_module(), cuda_module()
    if cp is None or not real_gpu():
        return [], []

    @cuda.jit
    def cuda_chain(x, y):
        for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
            t = 2.0 * x[i] + 1.0
            y[i] = t * t - x[i]

    sync = cp.cuda.Device().synchronize
    x = cp.random.random(n)
    expected = (2.0 * x + 1.0) ** 2 - x
    y_plain, y_fused, y_cp, y_cu = (cp.empty(n) for _ in range(4))
    plain, _ = chain_graph(n, x, y_plain, "unfused-gpu", device="gpu0")
    fused, temps = chain_graph(n, x, y_fused, "fused-gpu", device="gpu0")
    no_rules = RuleSet()

    def cupy_chain():
        cp.multiply(2.0, x, out=y_cp)
        cp.add(y_cp, 1.0, out=y_cp)
        cp.multiply(y_cp, y_cp, out=y_cp)
        cp.subtract(y_cp, x, out=y_cp)

    blocks = cp.cuda.Device().attributes["MultiProcessorCount"] * 8
    t_plain = best_time(lambda: plain.run(rules=no_rules), repeat, sync=sync)
    t_fused = best_time(lambda: fused.run(), repeat, sync=sync)
    t_cp = best_time(cupy_chain, repeat, sync=sync)
    t_cu = best_time(lambda: cuda_chain[blocks, 256](x, y_cu), repeat, sync=sync)
    for y in (y_plain, y_fused, y_cp, y_cu):
        # FMA contraction on the GPU changes the last bits; the oracle is NumPy-style CuPy.
        cp.testing.assert_allclose(y, expected, rtol=1e-12)
    check_fused(fused, temps)
    return table("GPU ", n, t_fused, [("unfused graph", t_plain, 2), ("cupy (out=)", t_cp, None),
                                      ("numba-cuda, fused by hand", t_cu, None)]), []


# -- adaptive Jacobi: the GPU taken by another process partway ----------------------------------
@hetflow.kernel
def dir_jacobi(i, j, n, s, e, w, out):
    out[i, j] = 0.25 * (n[i, j] + s[i, j] + e[i, j] + w[i, j])


@numba.njit(parallel=True, nogil=True)
def numba_jacobi(u, v, steps):
    """The oracle: ``steps`` Jacobi steps by hand, alternating u -> v and v -> u."""
    for k in range(steps):
        a, b = (u, v) if k % 2 == 0 else (v, u)
        for i in numba.prange(1, a.shape[0] - 1):
            for j in range(1, a.shape[1] - 1):
                b[i, j] = 0.25 * (a[i - 1, j] + a[i + 1, j] + a[i, j + 1] + a[i, j - 1])


def jacobi_step(u, v) -> None:
    """One step of u's interior into v's, written with views (captured inside a graph)."""
    inner = hetflow.interior(v, 1)
    views = [hetflow.interior(hetflow.cshift(u, d, s), 1) for d, s in ((0, -1), (0, 1), (1, 1), (1, -1))]
    hetflow.forall(inner, dir_jacobi, *views, inner)


def placed_on(kind) -> RuleSet:
    return RuleSet([Rule(f"stay-on-{kind}", match=NodePattern(op="forall"), then=Partition(kinds=[kind]))])


class JacobiProgram:
    """Two Jacobi steps per iteration over managed arrays, captured once, with a monitor
    that samples NVML and psutil at safe points every ``period`` seconds."""

    def __init__(self, size, period):
        self.start = np.random.default_rng(1).random((size, size))
        self.u = hetflow.empty((size, size), device="managed")
        self.v = hetflow.empty((size, size), device="managed")
        monitor = Monitor(mode="periodic", period=period)
        with hetflow.graph("jacobi", interpreter=Interpreter(monitor)) as self.graph:
            jacobi_step(self.u, self.v)
            jacobi_step(self.v, self.u)

    def reset(self) -> None:
        self.u[...] = self.start
        self.v[...] = self.start

    def run(self, rules, iterations, reset=True) -> float:
        """Seconds for ``iterations`` iterations (from the start grid if ``reset``)."""
        if reset:
            self.reset()
        t0 = time.perf_counter()
        self.graph.run(rules=rules, iterations=iterations)
        return time.perf_counter() - t0

    def placements(self, since) -> list:
        """The device kinds the launches ran on, version by version, from version ``since``."""
        return [",".join(sorted({d.rstrip("0123456789") for n in v.nodes for d in n.attrs.get("devices") or ()}))
                for v in self.graph.versions[since:]]


SETTLE_S = 1.5  # NVML reports the last second's use: let the load's trace fade between runs


def adaptive_rows(args):
    """Static vs adaptive placement of an iterative Jacobi while another process loads the GPU."""
    gpus = [d for d in hetflow.devices() if d.kind == "gpu" and not d.simulated]
    if cupy_module() is None or not gpus:
        return [], []
    size, iterations = args.jacobi_size, args.jacobi_iterations
    prog = JacobiProgram(size, args.period)
    on_cpu, static, adaptive = placed_on("cpu"), placed_on("gpu"), RuleSet.load(MOVE_RULES)
    per_it = {}
    for label, rules in (("cpu", on_cpu), ("gpu", static)):  # compiles both, then times each alone
        prog.run(rules, 2)  # also migrates the pages the reset wrote on the host
        per_it[label] = prog.run(rules, iterations // 10, reset=False) / (iterations // 10)
    expected_u, expected_v = prog.start.copy(), prog.start.copy()
    numba_jacobi(expected_u, expected_v, 2 * iterations)
    delay = args.hog_delay * iterations * per_it["gpu"]
    hog = GpuHog(gpus[0].ordinal, args.hog_size, args.hog_copy_mb)
    times, moves, steps = {"static": [], "adaptive": []}, [], []
    try:
        for k in range(args.rounds):
            for label in (("static", "adaptive") if k % 2 == 0 else ("adaptive", "static")):
                first = len(prog.graph.versions)
                rules = static if label == "static" else adaptive
                seconds, n_steps = hog.during(lambda: prog.run(rules, iterations), delay)
                np.testing.assert_allclose(prog.u, expected_u, rtol=1e-12, err_msg=f"{label} run")
                times[label].append(seconds)
                steps.append(n_steps)
                if label == "adaptive":
                    moves.append(" -> ".join(prog.placements(first)) or "unchanged")
                time.sleep(SETTLE_S)
    finally:
        hog.close()
    t_static, t_adaptive = statistics.median(times["static"]), statistics.median(times["adaptive"])
    name = f"Jacobi {size}^2 x {iterations} it, GPU taken partway: adaptive vs static"
    rows = [dict(name=name, baseline=fmt_s(t_static), hetflow=fmt_s(t_adaptive), ratio=t_static / t_adaptive,
                 **verdict(clause(t_static / t_adaptive, ">=", 1.3)))]
    notes = [f"adaptive Jacobi: per iteration (2 steps) unloaded: GPU {fmt_s(per_it['gpu'])}, "
             f"CPU {fmt_s(per_it['cpu'])}; load from {fmt_s(delay)} on ({args.hog_size}^2 f32 matmuls + "
             f"{args.hog_copy_mb} MiB copies each way; load steps per run {min(steps)}..{max(steps)})",
             f"adaptive placements by version: {'; '.join(moves)}; times static "
             f"{', '.join(fmt_s(t) for t in times['static'])}, adaptive "
             f"{', '.join(fmt_s(t) for t in times['adaptive'])} (median of {args.rounds})"]
    return rows, notes


SECTIONS = {"overhead": [overhead_rows], "rulefile": [rulefile_rows], "chain": [cpu_rows, gpu_rows], "adaptive": [adaptive_rows]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="hetflow bench dir", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true")
    p.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    p.add_argument("-n", type=at_least(1), default=None, help="elements (default 10^7; --quick: 10^5)")
    p.add_argument("--only", choices=tuple(SECTIONS), help="run one part only")
    p.add_argument("--jacobi-size", type=at_least(3), default=4096, help="adaptive Jacobi grid side")
    # a tenth of them times each device alone
    p.add_argument("--jacobi-iterations", type=at_least(10), default=300, help="adaptive Jacobi iterations")
    p.add_argument("--period", type=above(0), default=0.05, help="monitor sampling period (s)")
    p.add_argument("--hog-delay", type=at_least(0, float), default=0.25,
                   help="load starts after this fraction of the unloaded GPU run")
    p.add_argument("--hog-size", type=at_least(1), default=8192, help="load process's matmul side")
    p.add_argument("--hog-copy-mb", type=at_least(1), default=256, help="load process's copies each way (MiB)")
    p.add_argument("--rounds", type=at_least(1), default=2, help="adaptive Jacobi runs per contender")
    args = p.parse_args(argv)
    args.n = args.n or (10**5 if args.quick else 10**7)
    args.repeat = 2 if args.quick else 7
    sections = SECTIONS[args.only] if args.only else [f for part in SECTIONS.values() for f in part]
    rows, notes = [], []
    for section in sections:
        more_rows, more_notes = section(args)
        rows += more_rows
        notes += more_notes
    cpu = hetflow.get_device("cpu0")
    report(rows, args.json, f"hetflow bench dir ({cpu.name}, {cpu.compute_units} cores); "
                            f"ratio = baseline time / hetflow time")
    if not args.json:
        print("\n".join(notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
