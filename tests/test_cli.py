"""The command line: demo, devices, bench, version, and errors without tracebacks.

The demo under mpiexec (marked ``mpi``) is checked against the one-process demo: the
same residual, one summary whose rows add up to the grid, one trace and one picture.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from launcher import mpiexec as _mpiexec

import hetflow
from hetflow.cli.demo import STARTUP, rank_devices


def _environment(env=None):
    """This checkout's hetflow first on the path, whatever the current directory."""
    environment = dict(os.environ, **(env or {}))
    package_root = str(Path(hetflow.__file__).parents[1])
    environment["PYTHONPATH"] = os.pathsep.join(
        [package_root] + [p for p in [environment.get("PYTHONPATH")] if p])
    return environment


def _hetflow(*args, cwd=None, env=None, launcher=()):
    return subprocess.run([*launcher, sys.executable, "-m", "hetflow", *args], capture_output=True, text=True,
                          cwd=cwd, env=_environment(env), timeout=300)


def _lines(out, prefix):
    return [ln for ln in out.stdout.splitlines() if ln.startswith(prefix)]


def _residual(out) -> float:
    (line,) = _lines(out, "residual: ")
    return float(line.split()[1])


def _table(out) -> list[list[str]]:
    """The summary table's body rows, as cells."""
    return [[c.strip() for c in ln.strip("│ ").split("│")] for ln in out.stdout.splitlines()
            if ln.startswith("│")]


def _trace_line(out) -> tuple[int, int, int]:
    """(chunks, lanes, steals) that the ``trace:`` line says the picture drew."""
    (line,) = _lines(out, "trace: ")
    return tuple(map(int, re.search(r"\((\d+) chunks? on (\d+) lanes?, (\d+) steals?\)", line).groups()))


def test_demo_runs_verifies_and_writes_trace_and_timeline(tmp_path):
    trace, picture = tmp_path / "t.json", tmp_path / "t.png"
    out = _hetflow("demo", "--size", "64", "--iterations", "4", "--devices", "cpu0",
                   "--trace", str(trace), "--timeline", str(picture))
    assert out.returncode == 0, out.stderr
    assert "verification: passed" in out.stdout
    assert _residual(out) > 0
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("ph") == "X" for e in events)
    assert picture.stat().st_size > 10_000
    # The picture's steals are the table's (and the reports' in the trace).
    (row,) = _table(out)
    loop_steals = sum(e["args"]["steals"] for e in events if e.get("cat") == "loop")
    assert _trace_line(out)[2] == int(row[4]) == loop_steals
    # The time before the first loop is the named start-up phase, which holds the first loops.
    chunks = [e for e in events if e.get("cat") == "chunk"]
    (startup,) = [e for e in events if e.get("cat") == "phase" and e["name"] == STARTUP]
    assert startup["ts"] <= min(e["ts"] for e in chunks)
    first_loop = min((e for e in events if e.get("cat") == "loop"), key=lambda e: e["ts"])
    assert first_loop["ts"] + first_loop["dur"] <= startup["ts"] + startup["dur"]
    # The steps after it are drawn again below, zoomed: the picture is two panels tall.
    from matplotlib.image import imread

    plain = hetflow.trace.plot_timeline(trace, tmp_path / "plain.png")
    assert imread(picture).shape[0] > 1.8 * imread(plain.path).shape[0]


def test_demo_with_a_rules_file(tmp_path):
    rules = os.path.join(os.path.dirname(__file__), "..", "examples", "rules", "fuse_and_repartition.toml")
    out = _hetflow("demo", "--size", "48", "--iterations", "2", "--devices", "cpu0", "--rules", rules,
                   "--trace", str(tmp_path / "t.json"), "--timeline", str(tmp_path / "t.png"))
    assert out.returncode == 0, out.stderr
    assert "verification: passed" in out.stdout


def test_errors_are_one_line_without_traceback(tmp_path):
    out = _hetflow("demo", "--devices", "tpu9", "--size", "16", "--iterations", "2", cwd=tmp_path)
    assert out.returncode == 1
    assert out.stderr.startswith("hetflow: error: DeviceError: --devices tpu9: no device with id 'tpu9'")
    assert "Traceback" not in out.stderr and out.stdout == ""  # refused before the run's first line
    debug = _hetflow("demo", "--devices", "tpu9", "--size", "16", "--iterations", "2", cwd=tmp_path,
                     env={"HETFLOW_LOG": "debug"})
    assert "Traceback" in debug.stderr


def test_version_and_unknown_benchmark():
    assert _hetflow("--version").stdout.strip() == f"hetflow {hetflow.__version__}"
    out = _hetflow("bench", "no-such-bench")
    assert out.returncode == 2 and out.stdout == ""  # a usage error, as argparse's
    assert out.stderr.startswith("hetflow: error: no benchmark 'no-such-bench'; available: allreduce, ")
    assert out.stderr.count("\n") == 1




@pytest.mark.mpi
def test_demo_under_mpiexec_splits_the_grid_over_the_ranks(tmp_path):
    n, steps, ranks = 384, 30, 3
    size = ("--size", str(n), "--iterations", str(steps))
    alone, together = tmp_path / "alone", tmp_path / "together"
    alone.mkdir(), together.mkdir()
    one = _hetflow("demo", *size, "--trace", "one.json", "--timeline", "one.png", cwd=alone)
    assert one.returncode == 0, one.stdout + one.stderr
    out = _hetflow("demo", *size, "--trace", "all.json", "--timeline", "all.png", cwd=together,
                   launcher=(*_mpiexec(), "-n", str(ranks)))
    assert out.returncode == 0, out.stdout + out.stderr
    # One summary, from rank 0.
    assert len(_lines(out, "ranks: 3")) == 1 and not _lines(out, "devices: ")
    assert out.stdout.count("heat diffusion") == 1 and len(_lines(out, "verification: passed")) == 1
    rows = _table(out)
    assert {int(r[0]) for r in rows} == set(range(ranks))
    assert sum(int(r[6]) for r in rows) == (n - 2) * steps        # every interior row, every step
    (split,) = _lines(out, "rows per rank: ")
    parts = re.match(r"rows per rank: ([\d + ]+) = (\d+);", split).groups()
    assert len(parts[0].split(" + ")) == ranks and sum(map(int, parts[0].split(" + "))) == int(parts[1]) == n
    assert _residual(out) == pytest.approx(_residual(one), rel=1e-12)
    # One trace, with every rank's lanes, and one picture.
    assert sorted(p.name for p in together.iterdir()) == ["all.json", "all.png"]
    events = json.loads((together / "all.json").read_text())["traceEvents"]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    busy = {threads[(e["pid"], e["tid"])].split(" · ")[0] for e in events if e.get("cat") == "chunk"}
    assert busy == {f"rank {r}" for r in range(ranks)}
    assert _trace_line(out)[2] == sum(int(r[5]) for r in rows)     # the picture's steals: the table's
    assert (together / "all.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.simgpu
def test_a_rank_of_the_demo_runs_on_its_own_devices_unless_told(gpu_device):
    """Under mpiexec a rank runs on its own cores and GPUs (the runtime's model places each
    launch); --devices overrides them."""
    class Args:
        devices = None

    assert rank_devices(Args, ("cpu0", gpu_device.id)) == ("cpu0", gpu_device.id)
    assert rank_devices(Args, ("cpu0",)) == ("cpu0",)
    Args.devices = gpu_device.id
    assert rank_devices(Args, ("cpu0", gpu_device.id)) == (gpu_device.id,)


# -- bench ------------------------------------------------------------------------------------
def test_bench_alone_lists_every_benchmark():
    bench = os.path.join(os.path.dirname(__file__), "..", "bench")
    names = {f[:-3].removesuffix("_bench") for f in os.listdir(bench) if f.endswith(".py") and f[0] != "_"}
    out = _hetflow("bench")
    assert out.returncode == 0, out.stderr
    listed = {line.split()[0] for line in out.stdout.splitlines()[1:]}
    assert listed == names and len(names) >= 7
    assert set(json.loads(_hetflow("bench", "--json").stdout)) == names


def test_bench_without_the_source_tree_says_what_to_do(tmp_path, monkeypatch, capsys):
    """An installed package (pip install .) has no bench/ beside it."""
    from hetflow.cli import main as cli

    monkeypatch.setattr(cli, "BENCH_DIR", tmp_path / "missing")
    for argv in (["bench"], ["bench", "forall", "--quick"]):
        try:
            cli.main(argv)
        except SystemExit as exc:
            message = str(exc.code)
        else:
            raise AssertionError(f"hetflow {' '.join(argv)} did not fail")
        assert message.startswith("hetflow: error: no benchmarks here") and "\n" not in message
        assert "python bench/NAME.py" in message and "pip install -e ." in message
    with pytest.raises(SystemExit) as exc:  # the help does not need bench/
        cli.main(["bench", "--help"])
    assert exc.value.code == 0 and "without one, the benchmarks are listed" in capsys.readouterr().out


def test_mpi_bench_without_mpiexec_is_one_line(tmp_path, monkeypatch, capsys):
    from hetflow.cli import main as cli

    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))  # nothing beside it
    monkeypatch.setenv("PATH", str(tmp_path))
    assert cli.main(["bench", "allreduce", "--quick"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("hetflow: error: CommError: no mpiexec beside") and err.count("\n") == 1
    assert "install hetflow[mpi]" in err


@pytest.mark.mpi
def test_mpi_bench_finds_the_mpiexec_beside_python_without_path():
    if not os.path.exists(os.path.join(os.path.dirname(sys.executable), "mpiexec")):
        pytest.skip("needs hetflow[mpi]'s mpiexec beside this Python")
    out = _hetflow("bench", "allreduce", "--quick", "--json", "--max-bytes", "64", env={"PATH": os.defpath})
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert rows and all(row["bytes"] <= 64 for row in rows)


@pytest.mark.parametrize(("argv", "message"), [
    (["--size", "-5"], "--size must be at least 3 (a grid with an interior point); got -5"),
    (["--size", "2"], "--size must be at least 3 (a grid with an interior point); got 2"),
    (["--iterations", "0"], "--iterations must be even and at least 2 (the steps go u -> v -> u); got 0"),
    (["--iterations", "-4"], "--iterations must be even and at least 2 (the steps go u -> v -> u); got -4"),
    (["--iterations", "3"], "--iterations must be even and at least 2 (the steps go u -> v -> u); got 3"),
])
def test_a_demo_grid_or_step_count_it_cannot_run_is_one_line(argv, message, capsys):
    from hetflow.cli import main as cli

    assert cli.main(["demo", *argv]) == 2  # a usage error, as argparse's
    assert capsys.readouterr() == ("", f"hetflow: error: {message}\n")


def test_a_negative_demo_size_prints_no_traceback(tmp_path):
    out = _hetflow("demo", "--size", "-5", "--iterations", "2", cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == "hetflow: error: --size must be at least 3 (a grid with an interior point); got -5\n"


# -- where the trace and the timeline go ------------------------------------------------------
def _unwritable_outputs(tmp_path):
    """(option, path, why it cannot be written) for the demo's outputs."""
    (tmp_path / "a-file").write_text("")
    (tmp_path / "a-dir.json").mkdir()
    missing = tmp_path / "missing"
    return [("--trace", missing / "t.json", f"the directory {missing} does not exist"),
            ("--timeline", missing / "t.png", f"the directory {missing} does not exist"),
            ("--trace", tmp_path / "a-file" / "t.json", f"{tmp_path / 'a-file'} is not a directory"),
            ("--trace", tmp_path / "a-dir.json", "it is a directory"),
            ("--timeline", tmp_path / "t.nope", "no image format '.nope'; the formats: ")]


def test_demo_refuses_outputs_it_could_not_write_before_it_runs(tmp_path, monkeypatch, capsys):
    from hetflow.cli import demo
    from hetflow.cli import main as cli

    def run(*args):
        raise AssertionError("the demo ran before checking where it writes")

    monkeypatch.setattr(demo, "_run_one", run)
    for option, path, why in _unwritable_outputs(tmp_path):
        assert cli.main(["demo", "--devices", "cpu0", option, str(path)]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.startswith(f"hetflow: error: {option} {path}: cannot write it: {why}")
        assert err.count("\n") == 1
    assert "png, ps, raw" in err                  # the formats the timeline could have
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-dir.json", "a-file"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory")
def test_demo_refuses_a_read_only_directory_before_it_runs(tmp_path):
    (tmp_path / "ro").mkdir(mode=0o555)
    out = _hetflow("demo", "--devices", "cpu0", "--trace", str(tmp_path / "ro" / "t.json"), cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == (f"hetflow: error: --trace {tmp_path / 'ro' / 't.json'}: cannot write it: "
                          f"the directory {tmp_path / 'ro'} is not writable\n")


def test_demo_with_a_trace_in_a_missing_directory_stops_at_once_in_one_line(tmp_path):
    """At its full default size: nothing runs, nothing is printed but the error."""
    out = _hetflow("demo", "--trace", "missing/t.json", cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == ("hetflow: error: --trace missing/t.json: cannot write it: the directory missing "
                          "does not exist\n")
    assert list(tmp_path.iterdir()) == []


def _mandelbrot(*args, cwd):
    example = Path(__file__).resolve().parents[1] / "examples" / "mandelbrot.py"
    return subprocess.run([sys.executable, str(example), "--size", "40", "--max-iter", "10", *args],
                          capture_output=True, text=True, cwd=cwd, env=_environment(), timeout=120)


@pytest.mark.parametrize(("argv", "trace", "timeline"), [
    ((), "mandelbrot.json", "mandelbrot.png"),                 # --trace alone: the default name
    (("runs/m.v2.json",), "runs/m.v2.json", "runs/m.v2.png"),
])
def test_mandelbrot_example_says_where_its_trace_and_timeline_went(tmp_path, argv, trace, timeline):
    (tmp_path / "runs").mkdir()
    out = _mandelbrot("--trace", *argv, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    chunks, _, steals = _trace_line(out)
    assert out.stdout.splitlines()[-1].startswith(f"trace: {trace} (")
    assert out.stdout.splitlines()[-1].endswith(f"; timeline: {timeline}")
    events = json.loads((tmp_path / trace).read_text())["traceEvents"]
    assert chunks == sum(e.get("cat") == "chunk" for e in events) > 0
    assert steals == sum(e["args"]["steals"] for e in events if e.get("cat") == "loop")
    assert (tmp_path / timeline).read_bytes()[:4] == b"\x89PNG"


def test_mandelbrot_example_refuses_a_trace_in_a_missing_directory_before_it_runs(tmp_path):
    out = _mandelbrot("--trace", "missing/m.json", cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.endswith("mandelbrot.py: error: --trace missing/m.json: cannot write it: the directory "
                               "missing does not exist\n")


# -- Ctrl-C, a closed output, warnings: one line or none, as errors ---------------------------
def test_ctrl_c_during_a_command_is_one_line_and_status_130(monkeypatch, capsys):
    from hetflow.cli import main as cli

    def interrupted(args):  # as when Ctrl-C reaches a loop the command is running
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_cmd_devices", interrupted)
    try:
        status = cli.main(["devices"])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C left hetflow as a KeyboardInterrupt: a traceback")
    assert status == 130
    assert capsys.readouterr().err == "hetflow: interrupted\n"
    monkeypatch.setenv("HETFLOW_LOG", "debug")  # debugging: the traceback
    with pytest.raises(KeyboardInterrupt):
        cli.main(["devices"])


def test_ctrl_c_during_the_demo_prints_no_traceback(tmp_path):
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-m", "hetflow", "demo", "--size", "256", "--iterations", "100000",
                             "--devices", "cpu0"], cwd=tmp_path, env=_environment({"PYTHONUNBUFFERED": "1"}),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        while not proc.stdout.readline().startswith("devices: "):  # about to run
            assert proc.poll() is None, proc.stderr.read()
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130 and err.splitlines()[-1] == "hetflow: interrupted"
    assert "Traceback" not in err


def test_a_reader_that_leaves_early_gets_no_traceback():
    """``hetflow bench --json | head -1``: the pipe closes before hetflow writes to it."""
    proc = subprocess.Popen([sys.executable, "-m", "hetflow", "bench", "--json"], env=_environment(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 1 and err == ""


def test_a_warning_is_one_line_naming_no_source(tmp_path):
    """An unusable code repository, which the demo's first loop opens to compile its kernel:
    the warning is the command's, not a line of its script."""
    (tmp_path / "a-file").write_text("")
    out = _hetflow("demo", "--size", "3", "--iterations", "2", "--devices", "cpu0", cwd=tmp_path,
                   env={"HETFLOW_CACHE_DIR": str(tmp_path / "a-file")})
    assert out.returncode == 0, out.stderr
    assert "verification: passed" in out.stdout
    (line,) = out.stderr.splitlines()
    assert line.startswith(f"hetflow: warning: the code repository {tmp_path / 'a-file'} cannot be used (")
    assert "HETFLOW_CACHE_DIR" in line


@pytest.mark.parametrize(("command", "says"), [
    ("devices", "List the devices hetflow found."),
    ("demo", "Run heat diffusion with views on every local device"),
    ("precompile", "Build the API library's executables into the code repository."),
    ("forget-performance-history", "$HETFLOW_CACHE_DIR, else ~/.cache/hetflow"),
])
def test_a_command_help_says_what_it_does(capsys, command, says):
    from hetflow.cli import main as cli

    with pytest.raises(SystemExit) as exc:
        cli.main([command, "--help"])
    assert exc.value.code == 0 and says in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("argv, status, message", [
    (["--devices", "cpu0,cpu0"], 2,  # the command line alone is at fault
     "hetflow: error: --devices cpu0,cpu0: names cpu0 more than once (each device runs its share once)"),
    (["--trace", "same.png", "--timeline", "same.png"], 2,  # the command line alone is at fault
     "hetflow: error: --trace and --timeline name one file, same.png: the timeline would overwrite the trace"),
    (["--rules", "bad.toml"], 1, "hetflow: error: RuleSyntaxError: bad.toml:1:7: Expected ']"),
])
def test_the_demo_refuses_bad_devices_rules_and_outputs_before_running(tmp_path, argv, status, message):
    """Before, a device named twice printed the run's first line, a bad rule file was read
    only once the ranks ran, and a trace named as the timeline was overwritten by it."""
    (tmp_path / "bad.toml").write_text("[[rule\n")
    out = _hetflow("demo", "--size", "16", "--iterations", "2", *argv, cwd=tmp_path)
    assert out.returncode == status and out.stdout == ""
    assert out.stderr.startswith(message) and len(out.stderr.splitlines()) == 1
    assert not list(tmp_path.glob("*.png")) and not list(tmp_path.glob("*.json"))
