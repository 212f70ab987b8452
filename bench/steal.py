"""Work stealing: hetflow's forall on CPU cores and GPUs against static splits
and Numba's ``prange``.

CPU section: one ``@hetflow.kernel`` computing a Mandelbrot escape count per pixel,
launched over the image's (rows, columns) with ``hetflow.forall``; chunks are row ranges.

* ``irregular``: an off-centre window (x in [-2, 0.5], y in [0, 1.25]); rows near the
  real axis cost far more than the rest, so an equal split of the rows is unbalanced.
* ``uniform``: the same kernel over a window inside the main cardioid, where every pixel
  runs all ``max_iter`` iterations: equal cost everywhere.

Contenders: ``steal`` (``forall(..., device='cpu0', schedule='steal')``: one worker per
core, each with its own Chase-Lev deque, stealing), ``static`` (``schedule='static',
shares=[1.0]``: the rows split equally over the cores once, no stealing) and ``prange``
(the baseline: a hand-written ``@njit(parallel=True)`` loop with the same arithmetic).

GPU section (only with CuPy and a real, not simulated, GPU): a kernel with a chain of
``--work`` multiply-adds per element on host-resident float64 data, so the GPU's time
includes the host<->device transfers (``--work auto`` picks the chain length whose
T_cpu / T_gpu lies nearest ``--speed-ratio`` in a short ladder of single-device runs).
Since the GPU copies registered host memory at the bus's speed
(:mod:`hetflow.runtime.hostpins`), it is about 6x faster than the 16 cores of the H100
host even at one multiply-add, so the ladder stops there: the combined ideal is then
only about 15% faster than the GPU alone.
Contenders: ``cpu0`` alone, ``gpu0`` alone, both co-executed with ``schedule='steal'``
(shares predicted by the performance model), and with ``schedule='static'`` and shares
proportional to the measured single-device speeds. T_co is compared with the ideal
combined time 1 / (1/T_cpu + 1/T_gpu) and with the best single device, T_cpu and T_gpu
taken in the same rounds as T_co (the single devices race beside the co-executed calls). Then the GPU is
loaded partway: a second process starts repeated large matmuls, and copies both ways
over the bus that bounds this loop, shortly after the loop starts, and steal and static (both from the
unloaded speed shares) are timed again, beside gpu0 alone under the same load: its
delay over its unloaded time is the GPU's own stall, and the co-executed calls' delay
beyond that is what co-executing costs under load. The cores alone are timed under it
too (they slow under it as well: the load process runs on the host too), and with
gpu0's time they give the loaded ideal: no split ends sooner, so static / loaded ideal is the most
stealing could gain over the static split there.

Contenders alternate round by round; each one's best round counts (the loaded case:
the median, since the load's timing varies). Ratios are baseline time / hetflow time:
above 1 means hetflow is faster. Every result is checked against NumPy on sampled rows
or elements before timing.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import numba
import numpy as np
from numba import njit, prange

import hetflow
from hetflow.errors import HetflowError
from hetflow.cuda_compat import cupy_module

sys.path.append(os.path.dirname(__file__))
from _common import above, at_least, clause, fmt_s, report, verdict  # noqa: E402
from _gpuload import GpuHog  # noqa: E402

IRREGULAR = (-2.0, 0.5, 0.0, 1.25)   # x_min, x_max, y_min, y_max
UNIFORM = (-0.5, 0.0, 0.0, 0.3)      # inside the main cardioid: no pixel escapes
SAMPLE_ROWS = 8
SAMPLE_ELEMS = 4096


# -- kernels -------------------------------------------------------------------------------
@hetflow.kernel
def mandel(r, c, out, x0, y0, dx, dy, max_iter):
    cr = x0 + c * dx
    ci = y0 + r * dy
    zr = 0.0
    zi = 0.0
    k = 0
    while k < max_iter and zr * zr + zi * zi <= 4.0:
        zr, zi = zr * zr - zi * zi + cr, 2.0 * zr * zi + ci
        k += 1
    out[r, c] = k


@hetflow.kernel
def madd_chain(i, x, out, work):
    v = x[i]
    acc = v
    k = 0
    while k < work:
        acc = acc * 0.999 + v
        k += 1
    out[i] = math.sin(acc)


# -- the baseline: hand-written Numba ----------------------------------------------------
@njit(parallel=True)
def mandel_prange(out, x0, y0, dx, dy, max_iter):
    for r in prange(out.shape[0]):
        ci = y0 + r * dy
        for c in range(out.shape[1]):
            cr = x0 + c * dx
            zr = 0.0
            zi = 0.0
            k = 0
            while k < max_iter and zr * zr + zi * zi <= 4.0:
                zr, zi = zr * zr - zi * zi + cr, 2.0 * zr * zi + ci
                k += 1
            out[r, c] = k


# -- NumPy oracles ---------------------------------------------------------------------------
def mandel_numpy(rows, cols, x0, y0, dx, dy, max_iter):
    """Escape counts of the given rows, vectorised over the pixels that are still iterating."""
    cr = x0 + np.arange(cols) * dx
    ci = y0 + np.asarray(rows)[:, None] * dy
    zr = np.zeros((len(rows), cols))
    zi = np.zeros_like(zr)
    k = np.zeros(zr.shape, dtype=np.int64)
    for _ in range(max_iter):
        live = zr * zr + zi * zi <= 4.0
        if not live.any():
            break
        zr, zi = (np.where(live, zr * zr - zi * zi + cr, zr),
                  np.where(live, 2.0 * zr * zi + ci, zi))
        k += live
    return k


def madd_chain_numpy(x, work):
    acc = x.copy()
    for _ in range(work):
        acc = acc * 0.999 + x
    return np.sin(acc)


def _check(label, got, want, exact):
    ok = np.array_equal(got, want) if exact else np.allclose(got, want, rtol=1e-7, atol=1e-9)
    if not ok:
        raise HetflowError(f"{label} computed a different result than NumPy")


def _row(name, baseline, hetflow_s, target="", **extra):
    ratio = baseline / hetflow_s
    return dict(name=name, baseline=fmt_s(baseline), hetflow=fmt_s(hetflow_s), ratio=ratio,
                **(verdict(clause(ratio, *target)) if target else verdict()), **extra)


def race(contenders, rounds):
    """Alternate the contenders for ``rounds`` rounds: every round's time per contender,
    and each one's last result (a RunReport for co-executed calls, else None)."""
    times = {label: [] for label in contenders}
    last = {}
    for k in range(rounds):
        labels = list(contenders)
        for label in labels[k % len(labels):] + labels[:k % len(labels)]:
            t = time.perf_counter()
            last[label] = contenders[label]()
            times[label].append(time.perf_counter() - t)
    return times, last


# -- CPU section -----------------------------------------------------------------------------
def mandel_case(name, window, args, cores):
    """Time steal, static and prange on one Mandelbrot window; the table rows."""
    size, max_iter = args.size, args.max_iter
    x_min, x_max, y_min, y_max = window
    params = (x_min, y_min, (x_max - x_min) / size, (y_max - y_min) / size, max_iter)
    out = np.zeros((size, size), dtype=np.int32)
    contenders = {
        "steal": lambda: hetflow.forall(out.shape, mandel, out, *params, device="cpu0",
                                        schedule="steal"),
        "static": lambda: hetflow.forall(out.shape, mandel, out, *params, device="cpu0",
                                         schedule="static", shares=[1.0]),
        "prange": lambda: mandel_prange(out, *params),
    }
    rows = np.linspace(0, size - 1, SAMPLE_ROWS).astype(np.int64)
    want = mandel_numpy(rows, size, *params)
    for label, run in contenders.items():       # compile, warm up, check
        out[...] = -1
        run()
        _check(f"{name} {label}", out[rows], want, exact=True)
    times, last = race(contenders, args.rounds)
    best = {label: min(ts) for label, ts in times.items()}
    steals = last["steal"].steals
    what = f"{name}: {size}x{size} Mandelbrot, max_iter {max_iter}, {cores} cores"
    targets = {("irregular", "static"): (">=", 1.3), ("irregular", "prange"): (">=", 1.0),
               ("uniform", "prange"): (">=", 0.9)}
    return [_row(f"{name}: steal vs {b}", best[b], best["steal"], targets.get((name, b), ""),
                 case=name, what=what, steals_last_round=steals, seconds=times)
            for b in ("static", "prange")]


def cpu_section(args):
    cores = hetflow.get_device("cpu0").compute_units
    numba.set_num_threads(min(cores, numba.config.NUMBA_NUM_THREADS))
    rows = mandel_case("irregular", IRREGULAR, args, cores) + mandel_case("uniform", UNIFORM, args, cores)
    notes = [f"{r['what']}; steals in the last steal round: {r['steals_last_round']}"
             for r in rows[::2]]
    notes.append(f"prange: Numba threading layer {numba.threading_layer()}, "
                 f"{numba.get_num_threads()} threads")
    return rows, notes


# -- GPU section -----------------------------------------------------------------------------
def real_gpu():
    """The first real GPU when CuPy works and one exists; None otherwise (the simulator's
    GPUs are never used here)."""
    if cupy_module() is None:
        return None
    gpus = [d for d in hetflow.devices() if d.kind == "gpu" and not d.simulated]
    return gpus[0] if gpus else None


class Chain:
    """Host-resident data of the multiply-add chain and hetflow calls over it."""

    def __init__(self, n, gpu):
        self.gpu = gpu.id
        self.x = np.random.default_rng(0).uniform(0.0, 1.0, n)
        self.out = np.zeros(n)
        self.sample = np.sort(np.random.default_rng(1).choice(n, min(n, SAMPLE_ELEMS), replace=False))
        self.work = 1

    def call(self, device, **kw):
        """A forall over the current data (``self.x`` may be narrowed while tuning)."""
        return lambda: hetflow.forall(self.x.size, madd_chain, self.x, self.out, self.work,
                                      device=device, **kw)

    def singles(self):
        """Single-device contenders, hetflow's default path and its scheduled one."""
        return {"cpu0": self.call("cpu0"), "cpu0 steal": self.call("cpu0", schedule="steal"),
                "gpu0": self.call(self.gpu), "gpu0 static": self.call(self.gpu, schedule="static")}

    def check(self, label):
        want = madd_chain_numpy(self.x[self.sample], self.work)
        _check(f"{label} (work {self.work})", self.out[self.sample], want, exact=False)

    def checked(self, contenders, warmup):
        for label, run in contenders.items():
            for _ in range(warmup):
                self.out[...] = np.nan
                run()
                self.check(label)


def single_times(chain, rounds):
    times, _ = race(chain.singles(), rounds)
    best = {label: min(ts) for label, ts in times.items()}
    return min(best["cpu0"], best["cpu0 steal"]), min(best["gpu0"], best["gpu0 static"]), best


def tune_work(chain, args):
    """The chain length whose T_cpu / T_gpu lies nearest ``args.speed_ratio`` in a
    ladder of powers of two, measured on the first eighth of the data."""
    x, out = chain.x, chain.out
    part = max(1, x.size // 8)
    chain.x, chain.out = x[:part], out[:part]
    ladder = []
    try:
        for work in (2 ** k for k in range(13)):
            chain.work = work
            t_cpu, t_gpu, _ = single_times(chain, 2)
            ladder.append((work, t_cpu / t_gpu))
            if t_cpu / t_gpu > 2 * args.speed_ratio:
                break
    finally:
        chain.x, chain.out = x, out
    work = min(ladder, key=lambda wr: abs(math.log(wr[1] / args.speed_ratio)))[0]
    return work, ladder


def gpu_section(args, gpu):
    chain = Chain(args.n, gpu)
    chain.checked(chain.singles(), 1)            # compile both devices' executables
    notes = []
    if args.work == "auto":
        chain.work, ladder = tune_work(chain, args)
        notes.append("work ladder (work: T_cpu/T_gpu on n/8): "
                     + ", ".join(f"{w}: {r:.2f}" for w, r in ladder))
    else:
        chain.work = int(args.work)
    chain.checked(chain.singles(), 1)
    t_cpu, t_gpu, _ = single_times(chain, 2)     # the static split's shares
    speed_shares = [1 / t_cpu, 1 / t_gpu]
    devs = ["cpu0", gpu.id]
    co = {"steal": chain.call(devs, schedule="steal"),
          "static": chain.call(devs, schedule="static", shares=speed_shares)}
    chain.checked(co, args.warmup)               # also calibrates the performance model
    # The single devices race beside the co-executed calls: the ideal and T_co come from
    # the same rounds (a host's speed drifts by tens of percent between minutes).
    times, last = race({**chain.singles(), **co}, args.rounds)
    singles = {label: min(times.pop(label)) for label in chain.singles()}
    t_cpu, t_gpu = min(singles["cpu0"], singles["cpu0 steal"]), min(singles["gpu0"], singles["gpu0 static"])
    t_co, t_static = min(times["steal"]), min(times["static"])
    ideal = 1 / (1 / t_cpu + 1 / t_gpu)
    gpu_share = _share(last["steal"], gpu.id)
    what = f"{args.n} float64, {chain.work} multiply-adds per element, host-resident"
    rows = [
        _row("co-exec steal vs ideal 1/(1/T_cpu+1/T_gpu)", ideal, t_co, (">=", 0.9),
             what=what, seconds=times),
        _row("co-exec steal vs best single device", min(t_cpu, t_gpu), t_co, (">=", 1.1)),
        _row("co-exec steal vs cpu0 alone (T_cpu)", t_cpu, t_co),
        _row("co-exec steal vs gpu0 alone (T_gpu)", t_gpu, t_co),
        _row("co-exec steal vs static (speed shares)", t_static, t_co),
    ]
    notes += [f"GPU section ({gpu.name}): {what}",
              f"T_cpu {fmt_s(t_cpu)}, T_gpu {fmt_s(t_gpu)} (T_cpu/T_gpu {t_cpu / t_gpu:.2f}); "
              "single-device calls: " + ", ".join(f"{k} {fmt_s(v)}" for k, v in singles.items()),
              f"co-exec steal: GPU ran {gpu_share:.0%} of the indices (speed shares give "
              f"{speed_shares[1] / sum(speed_shares):.0%}); steals {_steals(last['steal'])}"]
    cpu_label = min(("cpu0", "cpu0 steal"), key=singles.get)  # the faster CPU call
    loaded_rows, loaded_notes = loaded_case(chain, devs, speed_shares, t_static, args, gpu, t_gpu, cpu_label)
    return rows + loaded_rows, notes + loaded_notes


def _share(rep, device_id):
    return sum(w.indices for w in rep.workers if w.device_id == device_id) / rep.n


def _steals(rep):
    return ", ".join(f"{d} {c}" for d, c in rep.steals_by_direction().items() if c) or "none"


# -- the GPU loaded partway by another process ----------------------------------------------------
def _timed(run):
    """``run()``'s result and the seconds it took."""
    t = time.perf_counter()
    result = run()
    return result, time.perf_counter() - t


def loaded_case(chain, devs, speed_shares, t_static, args, gpu, t_gpu, cpu_label):
    """Steal and static, both from the unloaded speed shares, with the GPU loaded from
    ``args.hog_delay`` x (the unloaded static time) on; and gpu0 alone under the same
    load (``t_gpu``: its time unloaded), which tells how much of the co-executed calls'
    delay the GPU's own stall explains; and the cores alone (``cpu_label``, the faster
    CPU call unloaded) under it too, since the cores slow under it as well.
    From those two, the loaded ideal 1/(1/T_cpu + 1/T_gpu), both loaded: at those speeds
    no split of the loop, stolen or not, ends sooner, so static / that ideal is the most
    stealing could gain over the static split under this load."""
    contenders = {s: chain.call(devs, schedule=s, shares=speed_shares) for s in ("steal", "static")}
    contenders["gpu0"] = chain.call(gpu.id)
    contenders["cpu0"] = chain.singles()[cpu_label]
    delay = args.hog_delay * t_static
    hog = GpuHog(gpu.ordinal, args.hog_size, args.hog_copy_mb)
    times = {s: [] for s in contenders}
    shares = {s: [] for s in contenders}
    steps = []
    try:
        for k in range(args.rounds):
            labels = list(contenders)
            for label in (labels if k % 2 == 0 else labels[::-1]):
                chain.out[...] = np.nan
                # The loop's own time: ``during`` returns only once the load process has
                # finished its current step (a matmul and a copy, up to ~60 ms).
                (rep, seconds), n_steps = hog.during(lambda run=contenders[label]: _timed(run), delay)
                times[label].append(seconds)
                chain.check(f"loaded {label}")
                shares[label].append(_share(rep, gpu.id))
                steps.append(n_steps)
    finally:
        hog.close()
    t_steal, t_stat = statistics.median(times["steal"]), statistics.median(times["static"])
    t_alone, t_cpu = statistics.median(times["gpu0"]), statistics.median(times["cpu0"])
    ideal = 1 / (1 / t_cpu + 1 / t_alone)
    rows = [_row("GPU loaded partway: steal vs static", t_stat, t_steal, (">=", 1.1), seconds=times),
            _row("GPU loaded partway: steal vs gpu0 alone", t_alone, t_steal),
            _row("GPU loaded partway: steal vs loaded ideal 1/(1/T_cpu+1/T_gpu), both loaded", ideal, t_steal)]
    note = (f"GPU loaded partway: a second process runs {args.hog_size}^2 float32 matmuls and "
            f"{args.hog_copy_mb} MiB copies each way (page-locked) from {fmt_s(delay)} after the loop "
            f"starts (load steps per run: {min(steps)}..{max(steps)}); GPU share of the indices: "
            f"steal {statistics.median(shares['steal']):.0%}, static "
            f"{statistics.median(shares['static']):.0%}; median of {args.rounds} round(s); "
            f"gpu0 alone under the same load {fmt_s(t_alone)} ({(t_alone - t_gpu) * 1e3:+.2f} ms "
            f"against its time unloaded); {cpu_label} under the same load {fmt_s(t_cpu)}; loaded ideal "
            f"{fmt_s(ideal)}: at these speeds no split ends sooner, so "
            f"stealing can gain at most {t_stat / ideal:.2f}x over static under this load")
    return rows, [note]


# -- entry point ---------------------------------------------------------------------------
def _work(text):
    if text == "auto":
        return text
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"must be 'auto' or a non-negative integer, got {text!r}")
    return int(text)


def _parse(argv):
    p = argparse.ArgumentParser(prog="hetflow bench steal", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=("cpu", "gpu"), help="run one section")
    p.add_argument("--size", type=at_least(1), default=2000, help="Mandelbrot image side")
    p.add_argument("--max-iter", type=at_least(1), default=256)
    p.add_argument("-n", type=at_least(1), default=1 << 27, help="GPU section: elements")
    p.add_argument("--work", type=_work, default="auto",
                   help="GPU section: multiply-adds per element, or 'auto' (default)")
    p.add_argument("--speed-ratio", type=above(0), default=1.5,
                   help="--work auto aims at this T_cpu / T_gpu")
    p.add_argument("--hog-size", type=at_least(1), default=8192, help="GPU load: matmul side")
    p.add_argument("--hog-copy-mb", type=at_least(1), default=1024, help="GPU load: MiB copied each way per step")
    p.add_argument("--hog-delay", type=at_least(0, float), default=0.25,
                   help="GPU load starts this fraction of the unloaded static time into the loop")
    p.add_argument("--rounds", type=at_least(1), default=5, help="timed rounds")
    p.add_argument("--warmup", type=at_least(1), default=3,
                   help="checked co-executed calls per contender before timing")
    p.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.quick:                      # tiny defaults; options given explicitly still win
        p.set_defaults(size=96, max_iter=64, rounds=1, warmup=1, n=1 << 16, hog_size=512,
                       hog_copy_mb=8)
        args = p.parse_args(argv)
    return args


def main(argv=None) -> int:
    args = _parse(argv)
    rows, notes = [], []
    if args.only != "gpu":
        cpu_rows, cpu_notes = cpu_section(args)
        rows, notes = rows + cpu_rows, notes + cpu_notes
    gpu = real_gpu()
    if args.only != "cpu":
        if gpu is None:
            notes.append("GPU section skipped: no CuPy or no real GPU")
        else:
            gpu_rows, gpu_notes = gpu_section(args, gpu)
            rows, notes = rows + gpu_rows, notes + gpu_notes
    cpu = hetflow.get_device("cpu0")
    title = f"hetflow bench steal ({cpu.name}, {cpu.compute_units} cores{', ' + gpu.name if gpu else ''})"
    if args.json:
        print(json.dumps({"benchmark": title, "rows": rows, "notes": notes}, indent=1))
    else:
        report(rows, False, title)
        print("\n".join(notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
