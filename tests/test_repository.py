"""The code repository: description data, reuse across processes, stale and corrupt entries."""
import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import hetflow
from hetflow.errors import KernelError
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


def test_unloadable_machine_code_is_compiled_again_with_a_warning(tmp_path):
    cache = tmp_path / "cache"
    first, _ = _run(tmp_path, cache)
    pycache = os.path.join(first["path"], "__pycache__")
    for name in os.listdir(pycache):
        with open(os.path.join(pycache, name), "wb") as f:
            f.write(b"\x80\x04garbage")
    second, stderr = _run(tmp_path, cache)  # the program checks its results itself
    assert "could not load the machine code stored in" in stderr and "UnpicklingError" in stderr
    assert "corrupt" not in stderr  # module.py passed its digest: not a damaged entry
    assert second["hits"] == 0
    third, stderr = _run(tmp_path, cache)
    assert third["hits"] >= 1 and third["compiled"] == 0 and not stderr


@hetflow.kernel
def negate(i, x, out):
    out[i] = -x[i]


def test_no_source_and_no_executable_fails_clearly(tmp_path):
    repo = CodeRepository(tmp_path)
    bare = negate.without_source()
    with pytest.raises(KernelError, match=r"kernel 'negate' has no source and no executable compatible with cpu0"):
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


# -- entries shared between processes ------------------------------------------------------
WRITER = textwrap.dedent("""
    import json, sys, warnings
    import numpy as np
    import hetflow
    from hetflow.platform.repository import repository

    warnings.simplefilter("error", RuntimeWarning)  # a corrupt or unloadable entry fails the run

    @hetflow.kernel
    def blend(i, a, x, y, out):
        out[i] = a * x[i] + (1 - a) * y[i]

    dtype = np.dtype(sys.argv[1])
    x = np.arange(2000, dtype=dtype)
    y = np.ones(2000, dtype=dtype)
    out = np.zeros(2000, dtype=dtype)
    hetflow.forall(2000, blend, dtype.type(0.25), x, y, out)
    exe = repository().executable(blend, hetflow.get_device("cpu0"), 1, {})
    print(json.dumps({"out": out.tolist(), "compiled": repository().compiled,
                      "loaded": repository().loaded, "hits": exe.cache_hits}))
""")


def _start(script, cache, *args):
    env = dict(os.environ, HETFLOW_CACHE_DIR=str(cache))
    return subprocess.Popen([sys.executable, str(script), *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _finish(proc):
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert "corrupt" not in err and "could not load" not in err, err
    return json.loads(out.strip().splitlines()[-1])


def test_concurrent_writers_share_one_entry_without_corruption(tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    cache = tmp_path / "cache"
    # Three processes compile into one fresh repository at once, with two signatures, so
    # that Numba's cache index of the one entry is updated by several writers.
    dtypes = ["float64", "float32", "float64"]
    runs = [_finish(p) for p in [_start(script, cache, d) for d in dtypes]]
    for dtype, run in zip(dtypes, runs):
        x = np.arange(2000, dtype=dtype)
        np.testing.assert_allclose(run["out"], 0.25 * x + 0.75, rtol=1e-6)
    assert len(CodeRepository(cache).entries()) == 1
    for dtype in ("float32", "float64"):  # a later process loads both signatures' machine code
        later = _finish(_start(script, cache, dtype))
        np.testing.assert_allclose(later["out"], 0.25 * np.arange(2000, dtype=dtype) + 0.75, rtol=1e-6)
        assert later["compiled"] == 0 and later["loaded"] == 1 and later["hits"] >= 1


def test_concurrent_writers_replace_one_stale_entry(tmp_path):
    """Ranks of a program upgraded since the entry was stored: each finds it stale, and
    they replace it at once (seen as 'cannot store the executable ... Directory not empty'
    under mpiexec)."""
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    cache = tmp_path / "cache"
    _finish(_start(script, cache, "float64"))
    (entry,) = CodeRepository(cache).entries()
    meta = json.loads((entry / "description.json").read_text())
    meta["description"]["compiler"]["numba"] = "0.0.1"  # built by another compiler
    (entry / "description.json").write_text(json.dumps(meta))
    runs = [_finish(p) for p in [_start(script, cache, "float64") for _ in range(4)]]
    for run in runs:
        np.testing.assert_allclose(run["out"], 0.25 * np.arange(2000.0) + 0.75)
    assert len(CodeRepository(cache).entries()) == 1
    assert json.loads((entry / "description.json").read_text())["description"]["compiler"]["numba"] != "0.0.1"


SHARED_TEXT = """
@hetflow.kernel
def twice_plus(i, x, out):
    out[i] = 2 * x[i] + 1
"""


def test_same_kernel_text_in_another_module_loads_the_stored_machine_code(tmp_path):
    """Two kernels with one text share an entry; the second process cannot import the
    first one's module (the reported 'corrupt entry' of a test kernel read by a benchmark)."""
    (tmp_path / "only_here").mkdir()
    (tmp_path / "only_here" / "kernels_elsewhere.py").write_text("import hetflow\n" + SHARED_TEXT)
    run = textwrap.dedent("""
        import json, sys, warnings
        import numpy as np
        import hetflow
        from hetflow.platform.repository import repository
        warnings.simplefilter("error", RuntimeWarning)
        {define}
        x = np.arange(50.0); out = np.zeros(50)
        hetflow.forall(50, twice_plus, x, out)
        exe = repository().executable(twice_plus, hetflow.get_device("cpu0"), 1, {{}})
        print(json.dumps({{"out": out.tolist(), "loaded": repository().loaded, "hits": exe.cache_hits}}))
    """)
    first = tmp_path / "first.py"
    first.write_text(run.format(define=f"sys.path.insert(0, {str(tmp_path / 'only_here')!r})\n"
                                       "from kernels_elsewhere import twice_plus"))
    second = tmp_path / "second.py"
    second.write_text(run.format(define="\n\n" + textwrap.indent(SHARED_TEXT, "")))
    cache = tmp_path / "cache"
    _finish(_start(first, cache))
    result = _finish(_start(second, cache))
    np.testing.assert_array_equal(result["out"], 2 * np.arange(50.0) + 1)
    assert result["loaded"] == 1 and result["hits"] >= 1


def test_a_damaged_module_is_corrupt_but_another_format_is_only_stale(tmp_path):
    cache = tmp_path / "cache"
    first, _ = _run(tmp_path, cache)
    module = os.path.join(first["path"], "module.py")
    with open(module, "a") as f:
        f.write("# a byte more than was recorded\n")
    second, stderr = _run(tmp_path, cache)
    assert "corrupt code repository entry" in stderr and "recorded digest" in stderr
    assert second["compiled"] == 1
    meta_path = os.path.join(first["path"], "description.json")
    meta = json.load(open(meta_path))
    del meta["description"]["variant"]  # written by a hetflow with other description data
    json.dump(meta, open(meta_path, "w"))
    third, stderr = _run(tmp_path, cache)
    assert third["compiled"] == 1 and "corrupt" not in stderr


@hetflow.kernel
def take(i, j, v, out):
    out[i, j] = v[i, j]


def test_cshift_over_an_empty_dimension_is_another_variant(tmp_path, monkeypatch):
    """A cshift over an empty dimension lowers with one parameter fewer: it must not
    share its executable with the same chain over a non-empty one."""
    monkeypatch.setenv("HETFLOW_CACHE_DIR", str(tmp_path))
    empty = np.zeros((3, 0))
    hetflow.forall((3, 0), take, hetflow.cshift(empty, 1, 4), np.zeros((3, 0)))
    u = np.arange(12.0).reshape(3, 4)
    out = np.zeros((3, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        hetflow.forall((3, 4), take, hetflow.cshift(u, 1, 4), out)  # shift 4 of 4: no move
    np.testing.assert_array_equal(out, u)
    assert len(repository().entries(take)) == 2


def test_checked_executables_are_other_entries(tmp_path, monkeypatch):
    monkeypatch.setenv("HETFLOW_CACHE_DIR", str(tmp_path))
    checked = hetflow.Kernel(negate.pyfunc, boundscheck=True)
    x, out = np.arange(4.0), np.zeros(4)
    hetflow.forall(4, negate, x, out)
    hetflow.forall(4, checked, x, out)
    np.testing.assert_array_equal(out, -x)
    paths = repository().entries(negate)
    assert len(paths) == 2
    options = [json.load(open(p / "description.json"))["description"]["options"] for p in paths]
    assert sorted(o.get("boundscheck", False) for o in options) == [False, True]


def test_co_map_functions_enter_the_variant_by_their_code():
    from hetflow.index import co_map, lowering
    from hetflow.platform.repository import _stable, variant_key

    u = np.arange(10.0)

    def reverse(idx):
        return (9 - idx[0],)

    def identity(idx):
        return (idx[0],)

    def lowered(f):
        return {"v": lowering(co_map(u, f, (10,)), "v__p")}

    # No address in the key: the next process finds the same entry (before, every
    # process compiled a co_map kernel anew); another function is another executable.
    assert "0x" not in repr(_stable(lowered(reverse)["v"].key))
    assert variant_key(lowered(reverse)) == variant_key(lowered(reverse))
    assert variant_key(lowered(reverse)) != variant_key(lowered(identity))
    assert variant_key(lowered(reverse)) != variant_key(lowered(reverse), checked=True)


@pytest.mark.parametrize("case", ["the cache folder is a file", "kernels/ is a file"])
def test_an_unusable_cache_falls_back_to_a_private_repository(tmp_path, case):
    """A cache path that cannot hold entries costs the process its reuse of compiled
    code, with one warning, never its run."""
    cache = tmp_path / "cache"
    if case == "kernels/ is a file":
        cache.mkdir()
        cache = cache / "kernels"
    cache.write_text("not a folder")
    result, stderr = _run(tmp_path, cache if case != "kernels/ is a file" else cache.parent)
    assert result["compiled"] == 1
    assert stderr.count("cannot be used") == 1 and "keeps its executables in" in stderr


def test_an_entry_replaced_by_a_file_is_corrupt_and_rebuilt(tmp_path):
    cache = tmp_path / "cache"
    first, _ = _run(tmp_path, cache)
    entry = first["path"]
    shutil.rmtree(entry)
    with open(entry, "w") as f:
        f.write("not a folder")
    second, stderr = _run(tmp_path, cache)
    assert second["compiled"] == 1 and "corrupt code repository entry" in stderr
    assert os.path.isdir(entry)


def test_the_default_repository_follows_the_cache_dir_setting(tmp_path, monkeypatch):
    # repository() reads HETFLOW_CACHE_DIR through os.environ's stored entries: every
    # way of changing it through os.environ is seen at the next launch.
    first, second = tmp_path / "a", tmp_path / "b"
    monkeypatch.setenv("HETFLOW_CACHE_DIR", str(first))
    repo = repository()
    assert repo.root == first and repository() is repo
    os.environ["HETFLOW_CACHE_DIR"] = str(first)  # the same value again: the same repository
    assert repository() is repo
    monkeypatch.setenv("HETFLOW_CACHE_DIR", str(second))
    assert repository().root == second
    monkeypatch.delenv("HETFLOW_CACHE_DIR")
    assert repository().root not in (first, second)
    x, out = np.arange(4.0), np.zeros(4)
    monkeypatch.setenv("HETFLOW_CACHE_DIR", str(first))
    hetflow.forall(4, negate, x, out)  # launches store into the directory set now
    np.testing.assert_array_equal(out, -x)
    assert repository().root == first and any(first.iterdir())


@pytest.mark.parametrize("module", ["codegen", "checks", "viewtypes", "atomic"])
def test_an_edit_to_any_of_hetflows_numba_extensions_makes_entries_stale(module, monkeypatch):
    """The description data's compiler versions cover every module whose Numba lowering
    ends up in machine code without showing in a generated module's text."""
    import importlib
    import inspect

    from hetflow.platform.executable import compiler_versions

    edited, real = importlib.import_module(f"hetflow.kernels.{module}"), inspect.getsource
    compiler_versions.cache_clear()
    before = compiler_versions("cpu")["hetflow-codegen"]
    monkeypatch.setattr(inspect, "getsource", lambda obj: real(obj) + ("# edited\n" if obj is edited else ""))
    compiler_versions.cache_clear()
    try:
        assert compiler_versions("cpu")["hetflow-codegen"] != before
    finally:
        monkeypatch.undo()
        compiler_versions.cache_clear()


@hetflow.kernel
def thrice(i, x, out):
    out[i] = 3 * x[i]


def test_an_entry_removed_by_another_process_while_loading_is_looked_up_again(tmp_path, monkeypatch):
    """Ranks under mpiexec after an upgrade: one drops the stale entry just as another has
    stored its fresh one and compiles from its module.py (seen as the demo's 'cannot cache
    function __hf_entry: no locator available for file .../module.py')."""
    from hetflow.platform import repository as repo_module

    monkeypatch.setenv("HETFLOW_CACHE_DIR", str(tmp_path))
    compile_functions, gone = repo_module._compile_functions, []

    def racing(ns, device, checked, fastmath):
        if not gone:  # the other process's drop lands between this one's store and compile
            (entry,) = repository().entries(thrice)
            shutil.rmtree(entry)
            gone.append(entry)
        return compile_functions(ns, device, checked, fastmath)

    monkeypatch.setattr(repo_module, "_compile_functions", racing)
    x, out = np.arange(5.0), np.zeros(5)
    hetflow.forall(5, thrice, x, out, device="cpu0")
    np.testing.assert_array_equal(out, 3 * x)
    assert gone and repository().compiled == 2 and repository().entries(thrice) == gone


def test_an_entry_evicted_by_another_process_before_its_first_run_still_runs(tmp_path, monkeypatch):
    """Its machine code is then compiled here and not stored (the entry is gone)."""
    monkeypatch.setenv("HETFLOW_CACHE_DIR", str(tmp_path))
    exe = repository().executable(thrice, hetflow.get_device("cpu0"), 1, {})
    shutil.rmtree(exe.path)
    x, out = np.arange(5.0), np.zeros(5)
    hetflow.forall(5, thrice, x, out, device="cpu0")
    np.testing.assert_array_equal(out, 3 * x)
    assert not os.path.exists(exe.path)


def test_a_half_made_entry_is_removed_and_the_executable_stored_in_its_place(tmp_path):
    """A folder with only Numba's cache in it (saved into an entry another process had
    just removed) blocked storing a new entry there ('cannot store the executable')."""
    first = CodeRepository(tmp_path).executable(thrice, hetflow.get_device("cpu0"), 1, {})
    shutil.rmtree(first.path)
    os.makedirs(os.path.join(first.path, "__pycache__"))
    repo = CodeRepository(tmp_path)  # another process's
    exe = repo.executable(thrice, hetflow.get_device("cpu0"), 1, {})
    assert exe.path == first.path and repo.compiled == 1
    assert os.path.exists(os.path.join(exe.path, "description.json"))


def test_an_entry_removed_at_every_load_ends_in_a_kernel_error_naming_it(tmp_path, monkeypatch):
    from hetflow.platform import repository as repo_module

    compile_functions = repo_module._compile_functions
    repo = CodeRepository(tmp_path)

    def always_removed(ns, device, checked, fastmath):
        for entry in repo.entries(thrice):
            shutil.rmtree(entry)
        return compile_functions(ns, device, checked, fastmath)

    monkeypatch.setattr(repo_module, "_compile_functions", always_removed)
    with pytest.raises(KernelError, match=r"cannot load the executable of kernel 'thrice': another process "
                                          r"removed its entry in .* each of 12 times"):
        repo.executable(thrice, hetflow.get_device("cpu0"), 1, {})


def test_an_entry_renamed_into_place_while_being_removed_stays(tmp_path, monkeypatch):
    """Rank A finds no entry and removes what is there; rank B renames its whole entry
    into place between A's look and A's unlink (the demo under mpiexec died of it with
    IsADirectoryError)."""
    from pathlib import Path

    from hetflow.platform import repository as repo_module

    entry = tmp_path / "cpu-1d-entry"
    entry.mkdir()
    (entry / "module.py").write_text("# B's")
    real, looked = Path.is_dir, []

    def is_dir(self):  # A's first look at the entry: not there yet
        if self == entry and not looked:
            looked.append(self)
            return False
        return real(self)

    monkeypatch.setattr(Path, "is_dir", is_dir)
    repo_module._remove(entry)
    assert looked == [entry]
    assert (entry / "module.py").read_text() == "# B's"
    stale = tmp_path / "a-file-in-an-entry's-place"
    stale.write_text("x")
    repo_module._remove(stale)
    assert not stale.exists()
