"""Faults that once cost valid work (issue 18): unsupported element types.

A launch with an element type the device cannot run raises hetflow's ArgumentTypeError naming
kernel, argument and type before anything is compiled, and leaves the code repository's
valid entries alone (compared file by file with what was there before).
"""
import hashlib
import warnings
from pathlib import Path

import numpy as np
import pytest

import hetflow
from hetflow.errors import ArgumentTypeError
from hetflow.platform.repository import repository


@hetflow.kernel
def halve_into(i, x, out):
    out[i] = 0.5 * x[i]


def _entries() -> dict:
    root = Path(repository().root)
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("bad", ["x", "out"])
def test_float16_is_refused_before_compiling_and_valid_entries_stay(bad):
    x = np.arange(6.0)
    out = np.zeros(6)
    hetflow.forall(6, halve_into, x, out, device="cpu0")
    before = _entries()
    args = {"x": x, "out": out}
    args[bad] = args[bad].astype(np.float16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "corrupt ... removed" or recompiling warning
        with pytest.raises(ArgumentTypeError, match=rf"kernel 'halve_into' argument '{bad}': element type "
                                             r"float16 is not supported on cpu0"):
            hetflow.forall(6, halve_into, args["x"], args["out"], device="cpu0")
    assert _entries() == before
    out[:] = 0
    hetflow.forall(6, halve_into, x, out, device="cpu0")
    np.testing.assert_array_equal(out, 0.5 * np.arange(6.0))
