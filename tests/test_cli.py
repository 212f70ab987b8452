"""The command line: demo, devices, bench, version, and errors without tracebacks."""
import json
import os
import subprocess
import sys

import hetflow


def _hetflow(*args, cwd=None, env=None):
    return subprocess.run([sys.executable, "-m", "hetflow", *args], capture_output=True, text=True,
                          cwd=cwd, env=dict(os.environ, **(env or {})), timeout=300)


def test_demo_runs_verifies_and_writes_trace_and_timeline(tmp_path):
    trace, picture = tmp_path / "t.json", tmp_path / "t.png"
    out = _hetflow("demo", "--size", "64", "--iterations", "4", "--devices", "cpu0",
                   "--trace", str(trace), "--timeline", str(picture))
    assert out.returncode == 0, out.stderr
    assert "verification: passed" in out.stdout
    residual = [ln for ln in out.stdout.splitlines() if ln.startswith("residual: ")]
    assert residual and float(residual[0].split()[1]) > 0
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("ph") == "X" for e in events)
    assert picture.stat().st_size > 10_000


def test_demo_with_a_rules_file(tmp_path):
    rules = os.path.join(os.path.dirname(__file__), "..", "examples", "rules", "fuse_and_repartition.toml")
    out = _hetflow("demo", "--size", "48", "--iterations", "2", "--devices", "cpu0", "--rules", rules,
                   "--trace", str(tmp_path / "t.json"), "--timeline", str(tmp_path / "t.png"))
    assert out.returncode == 0, out.stderr
    assert "verification: passed" in out.stdout


def test_errors_are_one_line_without_traceback(tmp_path):
    out = _hetflow("demo", "--devices", "tpu9", "--size", "16", "--iterations", "2", cwd=tmp_path)
    assert out.returncode == 1
    assert out.stderr.startswith("hetflow: error: NoDeviceError: no device with id 'tpu9'")
    assert "Traceback" not in out.stderr
    debug = _hetflow("demo", "--devices", "tpu9", "--size", "16", "--iterations", "2", cwd=tmp_path,
                     env={"HETFLOW_LOG": "debug"})
    assert "Traceback" in debug.stderr


def test_version_and_unknown_benchmark():
    assert _hetflow("--version").stdout.strip() == f"hetflow {hetflow.__version__}"
    out = _hetflow("bench", "no-such-bench")
    assert out.returncode != 0 and "no benchmark 'no-such-bench'; available:" in out.stderr
