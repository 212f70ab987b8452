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


GENERATED = textwrap.dedent("""
    import json, warnings
    import numpy as np
    import hetflow
    from hetflow.platform.repository import repository

    warnings.simplefilter("error")  # a 'corrupt entry' warning would fail the run
    k = hetflow.Kernel.from_source("gen_double", "def gen_double(i, x, out):\\n    out[i] = 2 * x[i]\\n", {})
    x = np.arange(6.0); out = np.zeros(6)
    hetflow.forall(6, k, x, out)
    assert (out == 2 * x).all()
    print(json.dumps({"compiled": repository().compiled, "loaded": repository().loaded}))
""")


def test_generated_kernels_are_reused_by_the_next_process(tmp_path):
    script = tmp_path / "gen.py"
    script.write_text(GENERATED)
    env = dict(os.environ, HETFLOW_CACHE_DIR=str(tmp_path / "cache"))
    runs = [subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True)
            for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[-1].stderr
    assert [json.loads(r.stdout.splitlines()[-1]) for r in runs] == [
        {"compiled": 1, "loaded": 0}, {"compiled": 0, "loaded": 1}]


def test_globals_are_part_of_the_executable_key():
    ns_a, ns_b = {"K": 2.0}, {"K": 3.0}
    src = "def scale_k(i, x, out):\n    out[i] = K * x[i]\n"
    a = hetflow.Kernel.from_source("scale_k", src, ns_a)
    b = hetflow.Kernel.from_source("scale_k", src, ns_b)
    assert a.source_hash != b.source_hash
    x, out = np.ones(3), np.zeros(3)
    hetflow.forall(3, a, x, out)
    assert (out == 2.0).all()
    hetflow.forall(3, b, x, out)
    assert (out == 3.0).all()
