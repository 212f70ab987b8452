"""The Mandelbrot set: irregular work, where work stealing shows.

    python examples/mandelbrot.py [--size 1500] [--trace [mandelbrot.json]]

Rows near the set cost far more than rows far from it, so an even split of rows leaves
cores idle; with ``schedule='steal'`` idle workers take chunks from busy ones. The run
report says how many chunks each worker ran and how many it stole.
"""
import argparse
import time
from pathlib import Path

import numpy as np

import hetflow
from hetflow.cli.demo import device_ids, output_problem, print_files


@hetflow.kernel
def mandel(r, c, out, x0, y0, dx, dy, max_iter):
    x, y = x0 + c * dx, y0 + r * dy
    zr, zi, k = 0.0, 0.0, 0
    while k < max_iter and zr * zr + zi * zi <= 4.0:
        zr, zi = zr * zr - zi * zi + x, 2.0 * zr * zi + y
        k += 1
    out[r, c] = k


def image(size=600, max_iter=200, device="cpu0", schedule="steal"):
    """Iteration counts over [-2, 0.5] x [0, 1.25]; returns (image, run report)."""
    out = np.zeros((size, size), dtype=np.int32)
    report = hetflow.forall(out.shape, mandel, out, -2.0, 0.0, 2.5 / size, 1.25 / size, max_iter,
                            device=device, schedule=schedule)
    return out, report


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=1500, help="pixels per side (default 1500)")
    p.add_argument("--max-iter", type=int, default=256, help="iterations per pixel at most (default 256)")
    p.add_argument("--devices", default="cpu0", help="comma-separated device ids (default cpu0)")
    p.add_argument("--trace", nargs="?", const="mandelbrot.json", default=None, metavar="PATH",
                   help="write a Chrome trace (default mandelbrot.json) and a timeline PNG beside it")
    a = p.parse_args()
    for option, value in (("--size", a.size), ("--max-iter", a.max_iter)):
        if value < 1:
            p.error(f"{option} must be at least 1, got {value}")
    try:
        device = device_ids(a.devices)
    except hetflow.HetflowError as exc:
        p.error(str(exc))
    if a.trace:  # before the run, not after it
        problem = output_problem(a.trace)
        if Path(a.trace).suffix == ".png":
            problem = "the timeline goes beside it, with the suffix .png: name the trace .json"
        if problem:
            p.error(f"--trace {a.trace}: cannot write it: {problem}")
    image(64, 8, device)  # compile first
    with hetflow.trace.record() as rec:
        for schedule in ("static", "steal"):
            t0 = time.perf_counter()
            _, report = image(a.size, a.max_iter, device, schedule)
            print(f"{schedule:6s} {time.perf_counter() - t0:.3f} s, steals: {report.steals}")
    print(report.summary())
    if a.trace:
        rec.save(a.trace)
        print_files(a.trace, rec.plot(Path(a.trace).with_suffix(".png")))
