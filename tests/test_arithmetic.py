"""Arithmetic has NumPy's meaning on every device (issue 23 item 2): a float division by
zero gives inf/nan, an integer // or % by zero gives 0, and nothing raises; oracle: NumPy."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import hetflow


@hetflow.kernel
def fdiv(i, x, y, out):
    out[i] = x[i] / y[i]


@hetflow.kernel
def ifloordiv(i, x, y, out):
    out[i] = x[i] // y[i]


@hetflow.kernel
def imod(i, x, y, out):
    out[i] = x[i] % y[i]


CASES = [(fdiv, np.float64, np.true_divide), (ifloordiv, np.int64, np.floor_divide),
         (imod, np.int64, np.remainder), (fdiv, np.float32, np.true_divide)]


@pytest.mark.parametrize("device", ["cpu0", pytest.param("gpu0", marks=pytest.mark.simgpu)])
@pytest.mark.parametrize("kernel, dtype, op", CASES, ids=lambda c: getattr(c, "name", getattr(c, "__name__", None)))
def test_division_by_zero_means_what_numpy_says(kernel, dtype, op, device):
    x = np.array([1, -1, 0, 5, 7, -6], dtype=dtype)
    y = np.array([0, 0, 0, 2, 0, 4], dtype=dtype)
    with np.errstate(all="ignore"):
        expected = op(x, y)
    out = np.full(6, 9, dtype=dtype)
    with np.errstate(all="ignore"):
        hetflow.forall(6, kernel, x, y, out, device=device)
    np.testing.assert_array_equal(out, expected)


def test_entries_of_another_error_model_are_stale(tmp_path):
    program = textwrap.dedent("""
        import json, numpy as np, hetflow
        from hetflow.platform.repository import repository

        @hetflow.kernel
        def halve(i, x, out):
            out[i] = x[i] // 0

        out = np.full(3, 7)
        hetflow.forall(3, halve, np.arange(3), out)
        assert (out == 0).all(), out
        exe = repository().executable(halve, hetflow.get_device("cpu0"), 1, {})
        print(json.dumps({"compiled": repository().compiled, "path": exe.path}))
    """)
    script = tmp_path / "prog.py"
    script.write_text(program)
    env = dict(os.environ, HETFLOW_CACHE_DIR=str(tmp_path / "cache"))

    def run():
        done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    first = run()
    meta_path = os.path.join(first["path"], "description.json")
    meta = json.load(open(meta_path))
    assert meta["description"]["options"]["error_model"] == "numpy"
    del meta["description"]["options"]["error_model"]  # as written before the error model was recorded
    json.dump(meta, open(meta_path, "w"))
    assert run()["compiled"] == 1
    assert json.load(open(meta_path))["description"]["options"]["error_model"] == "numpy"
