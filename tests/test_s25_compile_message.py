"""A compile error keeps the reason an overload gave, which Numba nests below its
candidates (past the first lines that a message keeps)."""
import re

import numpy as np
import pytest

import hetflow
from hetflow import atomic, project
from hetflow.errors import KernelCompileError


@hetflow.kernel
def short_counts(i, h):
    atomic.add(h, i % 2, 1)


@hetflow.kernel
def view_length(i, a, out):
    out[i] = len(a)


def test_an_overloads_refusal_reaches_the_message():
    with pytest.raises(KernelCompileError) as info:
        hetflow.forall(4, short_counts, np.zeros(4, np.int16), device="cpu0")
    assert re.search(r"\| TypingError: hetflow\.atomic\.add: needs an array of int32, .*; got array\(int16, 1d, C\)$",
                     str(info.value)), str(info.value)
    with pytest.raises(KernelCompileError, match=r"\| \.\.\. \| Rejected as the implementation raised a specific "
                                                 r"error: \| TypingError: a view argument \(hetflow\.view\d+_cpu\("
                                                 r"array\(float64, 1d, C\)\)\): len\(\) of a rank-0 view"):
        hetflow.forall(4, view_length, project(np.arange(8.0), 0, 3), np.zeros(4), device="cpu0")
