"""What the ``hetflow`` command shows a user: usage errors, forgetting, the demo's summary
and picture, and where the progress bar goes."""
import io
import os
import subprocess
import sys

import pytest

import hetflow
from hetflow.cli import demo
from hetflow.cli import main as cli
from hetflow.runtime.perfmodel import FILE_NAME, PerfModel


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A code repository folder that does not exist yet."""
    root = tmp_path / "cache"
    monkeypatch.setenv("HETFLOW_CACHE_DIR", str(root))
    return root


# -- forgetting makes nothing -------------------------------------------------------------------
def test_forgetting_no_history_creates_no_cache_dir(cache, capsys):
    assert cli.main(["forget-performance-history"]) == 0
    assert capsys.readouterr().out == f"no performance history in {cache / FILE_NAME}\n"
    assert not cache.exists()


def test_forgetting_no_history_leaves_an_existing_cache_dir_as_it_was(cache, capsys):
    cache.mkdir()
    assert cli.main(["forget-performance-history"]) == 0
    assert capsys.readouterr().out == f"no performance history in {cache / FILE_NAME}\n"
    assert list(cache.iterdir()) == []


def test_forgetting_a_history_removes_it_and_creates_nothing(cache, capsys):
    model = PerfModel(cache / FILE_NAME)
    model.record("axpy-1d", "cpu:model", 1e9)
    model.save()
    assert cli.main(["forget-performance-history"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"forgot the performance history {cache / FILE_NAME}: 1 measurement of 1 kernel", "  axpy-1d: cpu:model"]
    assert list(cache.iterdir()) == []


# -- usage errors: one line, status 2 ----------------------------------------------------------------
@pytest.mark.parametrize(("argv", "message"), [
    (["demo", "--size", "-5"], "--size must be at least 3 (a grid with an interior point); got -5"),
    (["demo", "--size", "0"], "--size must be at least 3 (a grid with an interior point); got 0"),
    (["demo", "--iterations", "3"], "--iterations must be even and at least 2 (the steps go u -> v -> u); got 3"),
    (["demo", "--iterations", "-2"], "--iterations must be even and at least 2 (the steps go u -> v -> u); "
                                     "got -2"),
    (["demo", "--trace", "missing/t.json"],
     "--trace missing/t.json: cannot write it: the directory missing does not exist"),
    (["demo", "--trace", "same.png", "--timeline", "same.png"],
     "--trace and --timeline name one file, same.png: the timeline would overwrite the trace"),
    (["bench", "no-such-bench"], "no benchmark 'no-such-bench'; available: allreduce, "),
])
def test_a_command_line_it_cannot_run_is_a_usage_error(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"hetflow: error: {message}") and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_a_usage_error_exits_with_status_2_without_a_traceback_even_when_debugging(tmp_path):
    env = {**os.environ, "HETFLOW_LOG": "debug"}
    out = subprocess.run([sys.executable, "-m", "hetflow", "demo", "--size", "-5"], capture_output=True,
                         text=True, cwd=tmp_path, env=env, timeout=120)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == "hetflow: error: --size must be at least 3 (a grid with an interior point); got -5\n"


# -- the demo's summary and picture ----------------------------------------------------------------------
def test_the_demo_summary_shows_short_steps_in_significant_digits(capsys):
    rows = {(None, "cpu0"): {"kind": "cpu", "workers": {"cpu0"}, "chunks": 2, "indices": 44, "steals": 0}}
    demo.print_summary(rows, "heat diffusion 24x24, 4 iterations", 24, 4, startup=0.5, steady=0.000283)
    line = capsys.readouterr().out.splitlines()[-1]
    cells = 22 * 22 * 2
    assert line == (f"start-up (compiling, first transfers, steps 1-2): 0.50 s; steps 3-4: 0.000283 s, "
                    f"throughput {cells / 0.000283 / 1e6:.1f} Mcell/s")


def test_the_demo_timeline_says_what_ran_and_rows_add_up(tmp_path, monkeypatch, capsys):
    from hetflow.trace import timeline

    titles = []
    plot = timeline.plot_timeline

    def recording_plot(source, path, **options):
        titles.append(options.get("title"))
        return plot(source, path, **options)

    monkeypatch.setattr(timeline, "plot_timeline", recording_plot)
    argv = ["demo", "--size", "8", "--iterations", "4", "--devices", "cpu0",
            "--trace", str(tmp_path / "t.json"), "--timeline", str(tmp_path / "t.png")]
    assert cli.main(argv) == 0
    assert titles == ["hetflow demo: heat diffusion 8x8, 4 iterations on cpu0"]
    out = capsys.readouterr().out
    assert "verification: passed" in out
    # the table's rows run: each step runs every interior row once
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in out.splitlines() if "│" in line]
    assert [(r[0], r[-2], r[-1]) for r in rows] == [("cpu0", str(6 * 4), "100.0%")]  # device, rows run, share


# -- the progress bar -------------------------------------------------------------------------------------
class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_the_progress_bar_goes_to_stderr_leaving_stdout_to_the_program(monkeypatch):
    out, err = Terminal(), Terminal()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    with hetflow.trace.progress(4, "diffusing") as bar:
        bar.advance(4)
    assert bar.visible and "diffusing" in err.getvalue() and "4/4" in err.getvalue()
    assert out.getvalue() == ""


def test_the_progress_bar_is_silent_when_stderr_is_not_a_terminal(monkeypatch):
    out, err = Terminal(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    with hetflow.trace.progress(4, "diffusing") as bar:
        bar.advance(4)
    assert not bar.visible and out.getvalue() == "" and err.getvalue() == ""
