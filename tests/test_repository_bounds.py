"""The code repository stays bounded (issue 23 item 4): fresh index functions with the
same code reuse one entry, and past max_entries the least recently used entries go.
Oracles: the folders on disk, NumPy for results."""
import os

import numpy as np
import pytest

import hetflow
from hetflow.errors import KernelError
from hetflow.index import co_map
from hetflow.platform.repository import DEFAULT_MAX_ENTRIES, CodeRepository, max_entries_from_env, repository


@hetflow.kernel
def gather(i, v, out):
    out[i] = v[i]


@hetflow.kernel
def k_one(i, out):
    out[i] = 1.0


@hetflow.kernel
def k_two(i, out):
    out[i] = 2.0


@hetflow.kernel
def k_three(i, out):
    out[i] = 3.0


def test_a_fresh_lambda_each_launch_compiles_once(tmp_path, monkeypatch):
    monkeypatch.setenv("HETFLOW_CACHE_DIR", str(tmp_path))
    u = np.arange(10.0)
    for _ in range(6):
        out = np.zeros(10)
        hetflow.forall(10, gather, co_map(u, lambda idx: (9 - idx[0],), (10,)), out)
        np.testing.assert_array_equal(out, u[::-1])
    assert repository().compiled == 1
    assert len(repository().entries(gather)) == 1


def _build(repo, kernel):
    return repo.executable(kernel, hetflow.get_device("cpu0"), 1, {})


def test_past_the_limit_the_least_recently_used_entries_go(tmp_path):
    first = CodeRepository(tmp_path, max_entries=2)
    paths = [_build(first, k).path for k in (k_one, k_two)]
    os.utime(paths[0], (1_000, 1_000))   # k_one: used long ago
    os.utime(paths[1], (2_000, 2_000))
    later = CodeRepository(tmp_path, max_entries=2)   # another process
    _build(later, k_two)                  # loading marks k_two used now
    _build(later, k_three)                # a third entry: k_one goes
    assert later.evicted == 1
    left = {p.parent.name.split("-")[0] for p in later.entries()}
    assert left == {"k_two", "k_three"}
    assert not (tmp_path / "kernels" / os.path.basename(os.path.dirname(paths[0]))).exists()
    out = np.zeros(4)                     # an evicted kernel compiles again and runs
    again = CodeRepository(tmp_path, max_entries=2)
    exe = _build(again, k_one)
    exe.entry(0, 4, out)
    np.testing.assert_array_equal(out, np.ones(4))
    assert again.compiled == 1 and len(again.entries()) == 2


def test_entries_this_process_loaded_are_kept(tmp_path):
    repo = CodeRepository(tmp_path, max_entries=1)
    for k in (k_one, k_two, k_three):
        _build(repo, k)
    assert repo.evicted == 0 and len(repo.entries()) == 3


def test_the_limit_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("HETFLOW_CACHE_MAX_ENTRIES", raising=False)
    assert max_entries_from_env() == DEFAULT_MAX_ENTRIES
    monkeypatch.setenv("HETFLOW_CACHE_MAX_ENTRIES", "7")
    assert max_entries_from_env() == 7
    for bad in ("0", "-3", "many"):
        monkeypatch.setenv("HETFLOW_CACHE_MAX_ENTRIES", bad)
        with pytest.raises(KernelError, match="HETFLOW_CACHE_MAX_ENTRIES must be a positive integer"):
            max_entries_from_env()
