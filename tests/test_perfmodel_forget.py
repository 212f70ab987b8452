"""Forgetting the performance model's history: in this process, in the next, and from
the command line, which says what it forgot. Every test has a cache directory of its own
(a user's HETFLOW_CACHE_DIR is never touched)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

import hetflow
from hetflow.runtime.perfmodel import FILE_NAME, perf_model

RECORD = """
from hetflow.runtime.perfmodel import perf_model
m = perf_model()
m.record("axpy-1d", "cpu:model", 1e6)        # saved at once
m.record("axpy-1d", "gpu:model", 4e6)        # saved at exit
m.record("stencil-2d", "cpu:model", 2e5)
"""
LOOK = """
from hetflow.runtime.perfmodel import perf_model
m = perf_model()
print([m.throughput(k, d) for k, d in [("axpy-1d", "cpu:model"), ("axpy-1d", "gpu:model"),
                                        ("stencil-2d", "cpu:model"), ("scan-1d", "gpu:model")]])
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HETFLOW_CACHE_DIR", str(tmp_path))
    return tmp_path


def _run(*args):
    """This checkout's hetflow in a new process, on the test's cache directory."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(Path(hetflow.__file__).parents[1]), *filter(None, [os.environ.get("PYTHONPATH")])]))
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=300)


def _python(*args):
    out = _run(*args)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_forgotten_history_is_gone_in_this_process_and_the_next(cache):
    _python("-c", RECORD)
    model = perf_model()
    assert model.throughput("axpy-1d", "gpu:model") == 4e6  # another process's history, read
    model.observe("scan-1d", "gpu:model", 3e6)               # and one of ours, not yet saved
    model.observe_overhead("scan-1d", 1e-3)
    forgotten = hetflow.forget_performance_history()
    assert forgotten == {"axpy-1d": ["cpu:model", "gpu:model"], "scan-1d": ["co-execution", "gpu:model"],
                         "stencil-2d": ["cpu:model"]}
    assert not (cache / FILE_NAME).exists()
    assert model.throughput("axpy-1d", "cpu:model") is None and model.overhead("scan-1d") is None
    assert model.shares("axpy-1d", ["cpu:model", "gpu:model"]) == [0.5, 0.5]
    assert _python("-c", LOOK).strip() == "[None, None, None, None]"
    assert hetflow.forget_performance_history() == {}


def test_history_saved_at_exit_after_forgetting_is_only_what_came_after(cache):
    """A process that forgets keeps nothing of what it had: its exit saves only later measurements."""
    _python("-c", RECORD + "\nm.forget()\nm.record('scan-1d', 'gpu:model', 3e6)\n")
    assert _python("-c", LOOK).strip() == "[None, None, None, 3000000.0]"


def test_the_command_line_forgets_and_says_what(cache):
    _python("-c", RECORD)
    path = cache / FILE_NAME
    out = _python("-m", "hetflow", "forget-performance-history")
    assert out.splitlines() == [f"forgot the performance history {path}: 3 measurements of 2 kernels",
                                "  axpy-1d: cpu:model, gpu:model", "  stencil-2d: cpu:model"]
    assert not path.exists()
    assert _python("-m", "hetflow", "forget-performance-history") == f"no performance history in {path}\n"


def test_the_command_line_says_why_it_cannot_forget(cache):
    (cache / FILE_NAME).mkdir()  # not a file: cannot be removed as one
    out = _run("-m", "hetflow", "forget-performance-history")
    assert out.returncode == 1
    assert f"hetflow: error: cannot remove the performance history {cache / FILE_NAME}: " in out.stderr
    assert "Is a directory" in out.stderr and "Traceback" not in out.stderr
