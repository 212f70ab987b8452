"""The CPU compile path: whatever compiling raises is a KernelCompileError naming the
kernel, cpu0 and the user's line (the ``def``'s where Numba lost it), never a warning
about stored machine code; compiled kernels keep only the globals they read alive.
Oracles: NumPy, ``weakref`` after ``gc.collect()``."""
import gc
import json
import os
import subprocess
import sys
import textwrap
import warnings
import weakref

import numpy as np
import pytest

import hetflow
from hetflow.errors import KernelCompileError
from test_kernel_sweep import marker_line

N = 4


def _line(marker: str) -> int:
    return marker_line(marker, __file__)


def _compile_error(kernel, *args) -> str:
    """The message of the KernelCompileError that launching ``kernel`` on cpu0 raises,
    checked to come without a warning (none about stored machine code)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(KernelCompileError) as info:
            hetflow.forall(N, kernel, *args, device="cpu0")
    return str(info.value)


# -- what Numba's compiler raises besides its own errors ------------------------------
LINALG = textwrap.dedent("""
    import json, sys, warnings
    sys.modules["scipy"] = None  # as where SciPy is not installed
    import numpy as np
    import hetflow

    @hetflow.kernel
    def norms(i, x, out):
        out[i] = np.linalg.norm(x[i])

    @hetflow.kernel
    def solves(i, a, b, out):
        out[i] = np.linalg.lstsq(a[i], b[i])[0][0]

    x = np.ones((2, 2, 2))
    found = {}
    for kernel, args in ((norms, (x, np.zeros(2))), (solves, (x, x, np.zeros(2)))):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                hetflow.forall(2, kernel, *args, device="cpu0")
            except Exception as exc:
                found[kernel.name] = [type(exc).__name__, str(exc), [str(w.message) for w in caught]]
    print(json.dumps(found))
""")


def test_np_linalg_without_scipy_is_a_compile_error_naming_the_kernel(tmp_path):
    script = tmp_path / "linalg_kernels.py"
    script.write_text(LINALG)
    env = dict(os.environ, HETFLOW_CACHE_DIR=str(tmp_path / "cache"))
    run = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout.strip().splitlines()[-1])
    for name, line in (("norms", 8), ("solves", 12)):  # their def lines in LINALG
        kind, message, warned = found[name]
        assert kind == "KernelCompileError"
        assert message.startswith(f"kernel {name!r} ({script}:{line}) failed to compile for cpu0 (cpu, ")
        assert message.endswith("Numba needs a module that is not installed (ImportError: scipy 0.16+ is "
                                "required for linear algebra)")
        assert warned == []  # nothing was loaded: no "could not load the machine code"


def test_bytecode_numba_does_not_take_is_a_compile_error_at_its_line():
    """A kernel without source (no check of its text when made) with an f-string's
    format spec: Numba's UnsupportedBytecodeError, not one of its NumbaErrors."""
    ns = {"hetflow": hetflow}
    exec("@hetflow.kernel\ndef formats(i, x, out):\n    s = f'{x[i]:.2f}'\n    out[i] = len(s)\n", ns)
    message = _compile_error(ns["formats"], np.ones(N), np.zeros(N))
    assert message.startswith("kernel 'formats' (<string>:3) failed to compile for cpu0 (cpu, ")
    assert message.endswith("UnsupportedBytecodeError: format spec in f-strings not supported yet. "
                            "Raised from <string> (3)")


# -- a compile error whose place Numba lost ----------------------------------------------
@hetflow.kernel
def walrus(i, x, out):  # walrus-def
    out[i] = (y := x[i]) + y


def test_a_compile_error_without_a_line_names_the_kernels_def():
    message = _compile_error(walrus, np.ones(N), np.zeros(N))
    assert message.startswith(f"kernel 'walrus' ({__file__}:{_line('walrus-def')}) failed to compile for cpu0")
    assert "Type of variable" in message and "cannot be determined" in message
    assert "line 0" not in message and "<source missing" not in message


# -- what compiled kernels keep alive ------------------------------------------------------
MODULE = textwrap.dedent("""
    import numpy as np
    import hetflow

    BIG = np.ones(1 << 20)
    QUEUE = hetflow.Queue("cpu0")

    @hetflow.kernel
    def shifted_scaled(i, x, out):
        def shifted(v):
            return v + OFFSET
        out[i] = shifted(x[i]) * SCALE
""")


def _user_module(tmp_path, name: str):
    import importlib.util

    path = tmp_path / f"{name}.py"
    path.write_text(MODULE)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_kernel_keeps_only_the_globals_it_reads_alive(tmp_path):
    user = _user_module(tmp_path, "compilepath_user_module")
    user.SCALE, user.OFFSET = 3.0, 0.5  # set after the decorator ran, before the first launch
    x = np.arange(8.0)
    out = np.zeros(8)
    hetflow.forall(8, user.shifted_scaled, x, out, device="cpu0")
    np.testing.assert_array_equal(out, (x + 0.5) * 3.0)
    big, queue = weakref.ref(user.BIG), weakref.ref(user.QUEUE)
    del user.BIG, user.QUEUE
    gc.collect()
    assert big() is None and queue() is None
    user.SCALE = 5.0  # after the first launch: frozen (Numba's rule), in every executable
    out = np.zeros(3)
    hetflow.forall(3, user.shifted_scaled, hetflow.section(x, (2,), (3,)), out, device="cpu0")
    np.testing.assert_array_equal(out, (x[2:5] + 0.5) * 3.0)


def test_kernels_with_the_same_code_are_keyed_by_the_globals_they_read(tmp_path):
    x = np.arange(6.0)
    results = []
    for k, scale in enumerate((2.0, 7.0)):
        user = _user_module(tmp_path, f"compilepath_keyed_{k}")
        user.SCALE, user.OFFSET, user.BIG = scale, 1.0, None  # BIG: not read, not in the key
        out = np.zeros(6)
        hetflow.forall(6, user.shifted_scaled, x, out, device="cpu0")
        results.append((user.shifted_scaled.source_hash, out))
    (first, got_first), (second, got_second) = results
    assert first != second
    np.testing.assert_array_equal(got_first, (x + 1.0) * 2.0)
    np.testing.assert_array_equal(got_second, (x + 1.0) * 7.0)
