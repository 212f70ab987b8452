"""The code repository: description data, reuse across processes, stale and corrupt entries."""
import json
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import hetflow
from hetflow.errors import NoExecutableError
from hetflow.platform.repository import CodeRepository, repository

PROGRAM = textwrap.dedent("""
    import json, sys
    import numpy as np
    import hetflow
    from hetflow.platform.repository import repository

    @hetflow.kernel
    def triad(i, a, x, y, out):
        out[i] = x[i] + a * y[i]

    x = np.arange(10.0)
    out = np.zeros(10)
    hetflow.forall(10, triad, 2.0, x, x, out)
    assert (out == 3 * x).all()
    exe = repository().executable(triad, hetflow.get_device("cpu0"), 1, {})
    print(json.dumps({"compiled": repository().compiled, "loaded": repository().loaded,
                      "hits": exe.cache_hits, "path": exe.path}))
""")


def _run(tmp_path, cache):
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    env = dict(os.environ, HETFLOW_CACHE_DIR=str(cache))
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def test_second_process_reuses_the_stored_executable(tmp_path):
    cache = tmp_path / "cache"
    first, _ = _run(tmp_path, cache)
    assert first == {**first, "compiled": 1, "loaded": 0, "hits": 0}
    second, _ = _run(tmp_path, cache)
    assert second["compiled"] == 0 and second["loaded"] == 1 and second["hits"] >= 1
    desc = json.loads(open(os.path.join(first["path"], "description.json")).read())["description"]
    assert desc["kind"] == "cpu" and desc["arch"] == hetflow.get_device("cpu0").arch
    assert set(desc) >= {"vendor", "options", "compiler", "source_hash", "ndim", "variant"}
    assert "numba" in desc["compiler"] and desc["options"]["nogil"] is True


def test_stale_entry_is_recompiled_and_replaced(tmp_path):
    cache = tmp_path / "cache"
    first, _ = _run(tmp_path, cache)
    meta_path = os.path.join(first["path"], "description.json")
    meta = json.load(open(meta_path))
    meta["description"]["compiler"]["numba"] = "0.0.1"  # built by another compiler
    json.dump(meta, open(meta_path, "w"))
    second, _ = _run(tmp_path, cache)
    assert second["compiled"] == 1 and second["loaded"] == 0
    assert json.load(open(meta_path))["description"]["compiler"]["numba"] != "0.0.1"


def test_corrupt_description_is_recompiled_with_a_warning(tmp_path):
    cache = tmp_path / "cache"
    first, _ = _run(tmp_path, cache)
    with open(os.path.join(first["path"], "description.json"), "w") as f:
        f.write("{not json")
    second, stderr = _run(tmp_path, cache)
    assert second["compiled"] == 1
    assert "corrupt code repository entry" in stderr


def test_corrupt_machine_code_is_recompiled_with_a_warning(tmp_path):
    cache = tmp_path / "cache"
    first, _ = _run(tmp_path, cache)
    pycache = os.path.join(first["path"], "__pycache__")
    for name in os.listdir(pycache):
        with open(os.path.join(pycache, name), "wb") as f:
            f.write(b"\x80\x04garbage")
    second, stderr = _run(tmp_path, cache)
    assert "corrupt code repository entry" in stderr
    assert second["compiled"] == 1


@hetflow.kernel
def negate(i, x, out):
    out[i] = -x[i]


def test_no_source_and_no_executable_fails_clearly(tmp_path):
    repo = CodeRepository(tmp_path)
    bare = negate.without_source()
    with pytest.raises(NoExecutableError, match=r"kernel 'negate' has no source and no executable compatible with cpu0"):
        repo.executable(bare, hetflow.get_device("cpu0"), 1, {})


def test_no_source_but_a_stored_executable_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("HETFLOW_CACHE_DIR", str(tmp_path))
    x, out = np.arange(5.0), np.zeros(5)
    hetflow.forall(5, negate, x, out)  # compiles and stores
    hetflow.platform.repository._default = None  # a fresh process's view of the same folder
    out[:] = 0
    hetflow.forall(5, negate.without_source(), x, out)
    np.testing.assert_array_equal(out, -x)
    assert repository().loaded == 1 and repository().compiled == 0
