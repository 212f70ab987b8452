"""``hetflow`` command: devices, demo, bench, trace, precompile.

Errors print one line without a traceback unless ``HETFLOW_LOG=debug``.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parents[3] / "bench"


def _cmd_devices(args) -> int:
    from ..platform.devices import devices

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
    return 0


def _cmd_demo(args) -> int:
    from .demo import run_demo

    return run_demo(args)


def _bench_files() -> dict[str, Path]:
    """Benchmark name -> file. A ``_bench`` suffix keeps a file from shadowing a standard
    module when bench/ is on the path (``queue_bench.py`` is ``hetflow bench queue``)."""
    return {p.stem.removesuffix("_bench"): p for p in BENCH_DIR.glob("*.py") if not p.stem.startswith("_")}


def _bench_names() -> list[str]:
    return sorted(_bench_files())


def _cmd_bench(args) -> int:
    path = _bench_files().get(args.name)
    if path is None:
        raise SystemExit(f"hetflow: no benchmark {args.name!r}; available: {', '.join(_bench_names())}")
    spec = importlib.util.spec_from_file_location(f"hetflow_bench_{args.name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    argv = list(args.rest) + (["--json"] if args.json else [])
    return int(module.main(argv) or 0)


def _cmd_precompile(args) -> int:
    from .. import library

    n = library.precompile(device=args.device)
    print(f"precompiled {n} library executables into the code repository")
    return 0


def _parser() -> argparse.ArgumentParser:
    from .. import __version__

    p = argparse.ArgumentParser(prog="hetflow", description="Data-parallel computing on CPUs, GPUs and clusters.")
    p.add_argument("--version", action="version", version=f"hetflow {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("devices", help="list the devices hetflow found")
    d.add_argument("--json", action="store_true", help="print the device records as JSON")
    d.set_defaults(func=_cmd_devices)

    from .demo import add_arguments

    demo = sub.add_parser("demo", help="run the main job on every local device and verify it")
    add_arguments(demo)
    demo.set_defaults(func=_cmd_demo)

    b = sub.add_parser("bench", help="run a benchmark from bench/ side by side with its baseline")
    b.add_argument("name", help="benchmark name: " + ", ".join(_bench_names()))
    b.add_argument("--json", action="store_true", help="print results as JSON")
    b.add_argument("rest", nargs=argparse.REMAINDER, help="arguments passed to the benchmark")
    b.set_defaults(func=_cmd_bench)

    from ..trace import add_trace_command

    add_trace_command(sub)

    pc = sub.add_parser("precompile", help="build the API library's executables into the code repository")
    pc.add_argument("--device", default=None, help="device id (default cpu0)")
    pc.set_defaults(func=_cmd_precompile)
    return p


def main(argv=None) -> int:
    debug = os.environ.get("HETFLOW_LOG", "").lower() == "debug"
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    args = _parser().parse_args(argv)
    from ..errors import HetflowError

    try:
        return args.func(args)
    except HetflowError as exc:
        if debug:
            raise
        print(f"hetflow: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
