"""``hetflow`` command: devices, demo, bench, trace, precompile, forget-performance-history.

Errors, warnings and Ctrl-C print one line without a traceback unless ``HETFLOW_LOG=debug``.
Exit status: 2 for a command line it cannot run (argparse's usage errors and the checks
before a run), 1 for a run that failed, 130 for Ctrl-C.
"""
from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import logging
import os
import sys
import warnings
from pathlib import Path

from .. import collectives, cuda_compat, library
from .._version import __version__
from ..errors import HetflowError
from ..platform.devices import devices
from ..platform.repository import default_root
from ..runtime.perfmodel import FILE_NAME, PerfModel
from ..trace import add_trace_command
from .demo import UsageError, add_arguments, run_demo

BENCH_DIR = Path(__file__).resolve().parents[3] / "bench"
"""The source tree's bench/: there in a checkout (and an editable install), not in an
installed package."""


def _cmd_devices(args) -> int:
    table = devices(refresh=True)
    if args.json:
        print(json.dumps([d.to_dict() for d in table], indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(title="hetflow devices")
    for col in ("id", "kind", "name", "version", "units", "simd/warp", "memory", "simulated"):
        t.add_column(col)
    for d in table:
        version = d.version if d.kind == "gpu" else d.version.split()[1] if " " in d.version else d.version
        t.add_row(d.id, d.kind, d.name, version, str(d.compute_units), str(d.simd_width),
                  f"{d.global_memory / 2**30:.1f} GiB" if d.global_memory < 1 << 62 else "-",
                  "yes" if d.simulated else "no")
    Console().print(t)
    if not any(d.kind == "gpu" for d in table) and cuda_compat.why_no_gpu:
        print(f"no GPU: {cuda_compat.why_no_gpu}")
    return 0


def _cmd_demo(args) -> int:
    return run_demo(args)


def _bench_files() -> dict[str, Path]:
    """Benchmark name -> file. A ``_bench`` suffix keeps a file from shadowing a standard
    module when bench/ is on the path (``queue_bench.py`` is ``hetflow bench queue``)."""
    if not BENCH_DIR.is_dir():
        raise SystemExit(f"hetflow: error: no benchmarks here: they live in bench/ of hetflow's source tree, "
                         f"which this installation ({Path(__file__).resolve().parents[1]}) lacks; run "
                         f"`python bench/NAME.py` in a checkout, or install one with `pip install -e .`")
    return {p.stem.removesuffix("_bench"): p for p in sorted(BENCH_DIR.glob("*.py")) if not p.stem.startswith("_")}


def _summary(path: Path) -> str:
    """The first paragraph of a benchmark's docstring, on one line."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return " ".join(doc.split("\n\n", 1)[0].split())


def _cmd_bench(args) -> int:
    files = _bench_files()
    if args.name is None:
        summaries = {name: _summary(path) for name, path in files.items()}
        if args.json:
            print(json.dumps(summaries, indent=1))
        else:
            print(f"benchmarks in {BENCH_DIR} (hetflow bench NAME [--quick] [--json]):")
            width = max(map(len, summaries))
            for name, line in summaries.items():
                print(f"  {name:{width}s}  {line}")
        return 0
    path = files.get(args.name)
    if path is None:
        raise UsageError(f"no benchmark {args.name!r}; available: {', '.join(files)}")
    spec = importlib.util.spec_from_file_location(f"hetflow_bench_{args.name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    argv = list(args.rest) + (["--json"] if args.json else [])
    return int(module.main(argv) or 0)


def _cmd_precompile(args) -> int:
    n = library.precompile(device=args.device)
    print(f"precompiled {n} library executables into the code repository")
    return 0


def _cmd_forget_performance_history(args) -> int:
    # The file, not the process's model (which this process never used): perf_model()
    # opens the code repository, which makes its folders, and forgetting makes nothing.
    path = default_root() / FILE_NAME
    if not os.path.lexists(path):  # also where the cache dir is a file: nothing was saved
        print(f"no performance history in {path}")
        return 0
    try:
        forgotten = PerfModel(path).forget()
    except OSError as exc:
        raise SystemExit(f"hetflow: error: cannot remove the performance history {path}: {exc}") from None
    if not forgotten:
        print(f"no performance history in {path}")
        return 0
    measured, kernels = sum(map(len, forgotten.values())), len(forgotten)
    print(f"forgot the performance history {path}: {measured} measurement{'s' * (measured != 1)} "
          f"of {kernels} kernel{'s' * (kernels != 1)}")
    for kernel_key, device_keys in forgotten.items():
        print(f"  {kernel_key}: {', '.join(device_keys)}")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors under mpiexec only rank 0 prints (every
    rank parses the same command line: one message, not one per rank)."""

    def error(self, message):
        if collectives.launched_by_mpi() and collectives.launcher_rank() not in (None, 0):
            self.exit(2)
        super().error(message)


def _command(sub, name: str, what: str) -> argparse.ArgumentParser:
    """A subcommand whose one-line summary is also the top of its own --help."""
    return sub.add_parser(name, help=what, description=what[0].upper() + what[1:] + ".")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="hetflow", description="Data-parallel computing on CPUs, GPUs and clusters.")
    p.add_argument("--version", action="version", version=f"hetflow {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    d = _command(sub, "devices", "list the devices hetflow found")
    d.add_argument("--json", action="store_true", help="print the device records as JSON")
    d.set_defaults(func=_cmd_devices)

    demo = _command(sub, "demo", "run heat diffusion with views on every local device (under mpiexec, "
                                 "across the ranks), verify it against NumPy and write a trace and a timeline")
    add_arguments(demo)
    demo.set_defaults(func=_cmd_demo)

    b = _command(sub, "bench", "run a benchmark from bench/ side by side with its baseline")
    b.add_argument("name", nargs="?", help="benchmark name; without one, the benchmarks are listed")
    b.add_argument("--json", action="store_true", help="print results as JSON")
    b.add_argument("rest", nargs=argparse.REMAINDER,
                   help="arguments passed to the benchmark, after its name (--quick: tiny sizes)")
    b.set_defaults(func=_cmd_bench)

    add_trace_command(sub)

    pc = _command(sub, "precompile", "build the API library's executables into the code repository")
    pc.add_argument("--device", default=None, help="device id (default cpu0)")
    pc.set_defaults(func=_cmd_precompile)

    fp = _command(sub, "forget-performance-history",
                  "forget the performance model's measured rates (perfmodel.json in the code repository: "
                  "$HETFLOW_CACHE_DIR, else ~/.cache/hetflow), to learn them afresh")
    fp.set_defaults(func=_cmd_forget_performance_history)
    return p


def _warning_line(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning in one line, as the command's errors are: the line of source Python would
    show is the ``hetflow`` script's own, which tells the user nothing."""
    text = str(message).removeprefix("hetflow: ")
    print(f"hetflow: warning: {text}", file=file or sys.stderr)


def _run(args, debug: bool) -> int:
    """The command, its errors, Ctrl-C and a closed output each ending it in one line or none;
    a usage error with status 2, as argparse's own."""
    try:
        return args.func(args)
    except UsageError as exc:  # the command line's fault, not the run's: no traceback even when debugging
        print(f"hetflow: error: {exc.message}", file=sys.stderr)
        return 2
    except HetflowError as exc:
        if debug:
            raise
        print(f"hetflow: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if debug:
            raise
        print("hetflow: interrupted", file=sys.stderr)
        return 130  # 128 + SIGINT, as a shell reports a command that Ctrl-C ended
    except BrokenPipeError:
        # The reader left (`hetflow devices --json | head -1`): nothing is lost. Python's
        # flush of stdout at exit would fail again, so stdout goes to /dev/null first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def main(argv=None) -> int:
    debug = os.environ.get("HETFLOW_LOG", "").lower() == "debug"
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    args = _parser().parse_args(argv)
    with warnings.catch_warnings():
        if not debug:
            warnings.showwarning = _warning_line
        return _run(args, debug)


if __name__ == "__main__":
    sys.exit(main())
