"""The benchmarks' numeric options are bounded: a value a benchmark cannot run is an
argparse usage error (status 2, one line naming the option and the value), refused
before anything runs; and the demo's trace line counts in the singular and the plural."""
import argparse
import importlib.util
import os
import pathlib
import subprocess
import sys
from types import SimpleNamespace

import pytest

import hetflow
from hetflow.cli.demo import print_files

BENCH = pathlib.Path(__file__).resolve().parents[1] / "bench"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"hetflow_bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _hetflow_bench(*args):
    env = dict(os.environ, PYTHONPATH=str(pathlib.Path(hetflow.__file__).parents[1]))
    return subprocess.run([sys.executable, "-m", "hetflow", "bench", *args], capture_output=True, text=True,
                          env=env, timeout=300)


# -- the shared argparse types ---------------------------------------------------------------------
def test_at_least_keeps_a_number_from_its_bound_on_and_names_any_other():
    common = _load("_common")
    assert common.at_least(3)("3") == 3 and type(common.at_least(3)("3")) is int
    assert common.at_least(0, float)("0.25") == 0.25
    for parse, text, words in ((common.at_least(3), "-5", "at least 3"), (common.at_least(1), "0", "at least 1"),
                               (common.at_least(0, float), "-0.5", "a finite number at least 0"),
                               (common.at_least(0, float), "inf", "a finite number at least 0"),
                               (common.at_least(0, float), "nan", "a finite number at least 0"),
                               (common.above(0), "0", "a finite number above 0")):
        with pytest.raises(argparse.ArgumentTypeError) as exc:
            parse(text)
        assert str(exc.value) == f"must be {words}; got {text}"
    assert common.above(0)("1e-3") == 0.001


@pytest.mark.parametrize("name", sorted(p.stem for p in BENCH.glob("*.py") if not p.stem.startswith("_")))
def test_every_numeric_option_of_every_benchmark_is_bounded(name, monkeypatch):
    """A plain ``type=int`` or ``float`` takes -5 as readily as 5."""
    class Parsed(Exception):
        pass

    parsers = []

    def capture(parser, argv=None, namespace=None):
        parsers.append(parser)
        raise Parsed  # the parser as main built it, before anything runs

    module = _load(name)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    with pytest.raises(Parsed):
        module.main([])
    typed = [a for a in parsers[0]._actions if a.type is not None]
    assert [a.dest for a in typed if a.type in (int, float)] == []
    for action in typed:  # the defaults are within the bounds
        if action.default is not None:
            assert action.type(str(action.default)) == action.default, action.dest


# -- through ``hetflow bench``: a usage error, before the run ------------------------------------------------
@pytest.mark.parametrize(("argv", "message"), [
    (["heat", "--size", "-5", "--steps", "2"], "argument --size: must be at least 3; got -5"),
    (["heat", "--size", "3", "--steps", "0"], "argument --steps: must be at least 2; got 0"),
    (["heat", "--size", "abc"], "argument --size: invalid int value: 'abc'"),
    (["queue", "--tasks", "-1"], "argument --tasks: must be at least 1; got -1"),
    (["steal", "--quick", "--speed-ratio", "0"], "argument --speed-ratio: must be a finite number above 0; got 0"),
    (["allreduce", "--ranks", "0"], "argument --ranks: must be at least 1; got 0"),
    (["distributed", "--size", "3"], "argument --size: must be at least 4; got 3"),
    (["dir", "--quick", "--only", "overhead", "--jacobi-iterations", "9"],
     "argument --jacobi-iterations: must be at least 10; got 9"),
])
def test_a_benchmark_refuses_a_value_it_cannot_run_as_a_usage_error(argv, message):
    out = _hetflow_bench(*argv)
    assert out.returncode == 2 and out.stdout == "", out.stderr
    lines = out.stderr.splitlines()
    assert lines[0].startswith(f"usage: hetflow bench {argv[0]} ")  # argparse's usage, then the one line
    assert lines[-1] == f"hetflow bench {argv[0]}: error: {message}"
    assert "Traceback" not in out.stderr


def test_a_benchmark_runs_at_its_smallest_bounds():
    """The bounds refuse nothing a benchmark can run: heat on a 3x3 grid, an odd step
    count rounded up to the even one it runs."""
    out = _hetflow_bench("heat", "--size", "3", "--steps", "3")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("hetflow bench heat (3^2 x 4 steps, ")


# -- the demo's trace line ----------------------------------------------------------------------------
@pytest.mark.parametrize(("counts", "says"), [
    ((1, 1, 1), "1 chunk on 1 lane, 1 steal"),
    ((2, 3, 0), "2 chunks on 3 lanes, 0 steals"),
    ((5, 1, 2), "5 chunks on 1 lane, 2 steals"),
])
def test_the_trace_line_counts_in_the_singular_and_the_plural(capsys, counts, says):
    bars, lanes, steals = counts
    print_files("t.json", SimpleNamespace(path="t.png", bars=bars, lanes=lanes, steals=steals))
    assert capsys.readouterr().out == f"trace: t.json ({says}); timeline: t.png\n"
