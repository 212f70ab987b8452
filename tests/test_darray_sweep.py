"""A sweep of distributed arrays and programs against NumPy: views reaching rows by any
periodic route, launch checks made on the global arrays, misuse refused with hetflow's
errors. Runs over several ranks go through tests/mpi/darray_sweep.py under mpiexec."""
import numpy as np
import pytest
from test_distributed import run_script

import hetflow
from hetflow import cluster
from hetflow.errors import ArgumentError, ArgumentTypeError, ShapeError


@hetflow.kernel
def copy(i, out, src):
    out[i] = src[i]


@hetflow.kernel
def copy2(i, j, out, src):
    out[i, j] = src[i, j]


@hetflow.kernel
def add_sum(i, out, src, w):
    out[i] = src[i] + np.sum(w)


def copied(extent, kernel, out, into, view):
    cluster.forall(extent, kernel, into, view)
    return out.gather()


@pytest.mark.parametrize("shift", [6, -8, 15, -1])
def test_a_cshift_by_a_whole_turn_and_more_reads_the_rolled_rows(shift):
    x = np.arange(7.0)
    u = cluster.asarray(x)
    y = cluster.zeros_like(u)
    np.testing.assert_array_equal(copied(7, copy, y, y, hetflow.cshift(u, 0, shift)), np.roll(x, -shift))


def test_rows_read_periodically_need_only_the_halo_that_holds_them():
    x = np.arange(14.0).reshape(7, 2)
    for halo in (0, 1):  # one rank: rows 5..6 are its own, no halo needed
        u = cluster.asarray(x, halo=halo)
        y = cluster.zeros_like(u)
        got = copied((2, 2), copy2, y, hetflow.section(y, (0, 0), (2, 2)), hetflow.section(u, (5, 0), (2, 2)))
        want = np.zeros_like(x)
        want[:2] = x[5:]
        np.testing.assert_array_equal(got, want)
    u = cluster.asarray(x[:, 0], halo=1)
    y = cluster.zeros_like(u)
    with pytest.raises(ShapeError, match=r"rows 0\.\.6 with a halo of 1, src reads rows 3\.\.6 and 0\.\.2; "
                                         r"give the array a halo of at least 3"):
        cluster.forall(7, copy, y, hetflow.cshift(u, 0, 3))


def test_extents_are_checked_on_the_global_arrays():
    a = cluster.zeros((4, 3))
    narrow = cluster.zeros_like(a, shape=(4, 2))
    # the part's own check named its rows, not the arrays': here the same words as one process's
    with pytest.raises(ShapeError, match=r"kernel 'copy2' argument 'out': view of extent \(1, 2\) does not "
                                         r"fit the launch extent \(1, 3\) \(a view must match it exactly\)"):
        cluster.forall((1, 3), copy2, hetflow.section(narrow, (0, 0), (1, 2)), hetflow.section(a, (0, 0), (1, 3)))
    with pytest.raises(ShapeError, match=r"kernel 'copy2' argument 'out': array of extent \(4, 2\) does not "
                                         r"fit the launch extent \(4, 3\)"):
        cluster.forall((4, 3), copy2, narrow, a)


def test_a_host_array_is_refused_after_a_scalar_in_its_place():
    u = cluster.asarray(np.arange(4.0))
    y = cluster.zeros_like(u)
    cluster.forall(4, add_sum, y, u, 1.0)
    np.testing.assert_array_equal(y.gather(), np.arange(4.0) + 1)
    with pytest.raises(ShapeError, match="argument w is a ndarray, not a distributed array"):
        cluster.forall(4, add_sum, y, u, np.ones(3))


def test_launch_over_arrays_of_other_distributions_names_them():
    a, b = cluster.zeros(4), cluster.zeros(4)
    with pytest.raises(ShapeError, match=rf"2 different distributions \(out: {a.name} over 1 rank\(s\), "
                                         rf"rows \(4,\), src: {b.name} over 1 rank\(s\), rows \(4,\)\)"):
        cluster.forall(4, copy, a, b)


@pytest.mark.parametrize("call,error,words", [
    pytest.param(lambda u: cluster.asarray([[1.0], []]), ArgumentTypeError,
                 "cluster.asarray: x is not an array on rank 0 (ValueError: setting an array element", id="ragged x"),
    pytest.param(lambda u: cluster.asarray([[1.0], []], root=0), ArgumentTypeError,
                 "cluster.asarray: x on rank 0, the root, is not an array (ValueError", id="ragged x at the root"),
    pytest.param(lambda u: cluster.asarray(np.zeros(4), like=np.zeros(4)), ArgumentTypeError,
                 "cluster.asarray: like must be a DistArray, not ndarray", id="like a host array"),
    pytest.param(lambda u: cluster.asarray(np.zeros(4), like=hetflow.interior(u, 1)), ArgumentTypeError,
                 "like must be a DistArray, not DistView", id="like a view"),
    pytest.param(lambda u: cluster.asarray(np.zeros(4), like=u, halo=3), ArgumentError,
                 "like= gives the distribution; halo cannot be given with it", id="like and a halo"),
    pytest.param(lambda u: cluster.zeros(4, parts=4), ArgumentTypeError,
                 "parts must be a list of shares, one per rank; got 4", id="parts a number"),
    pytest.param(lambda u: cluster.zeros(4, dtype="float65"), ArgumentTypeError,
                 "a distributed array's dtype must be a NumPy dtype; got 'float65'", id="no dtype"),
    pytest.param(lambda u: u.distribution.resize([4.5]), ShapeError,
                 "a partition of 4 rows over 1 ranks needs 1 whole numbers of rows; got [4.5]", id="rows a float"),
    pytest.param(lambda u: u.distribution.resize("4"), ShapeError, "whole numbers of rows; got '4'",
                 id="rows a string"),
])
def test_misuse_is_a_hetflow_error_naming_it(call, error, words):
    u = cluster.asarray(np.arange(4.0), halo=0)
    with pytest.raises(error) as caught:
        call(u)
    assert words in str(caught.value)
    assert u.distribution.sizes == (4,) and u.halo == 0


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, 3, 5])
def test_sweep_over_ranks_matches_numpy(ranks):
    output = run_script(ranks, "darray_sweep.py", timeout=120)
    for rank in range(ranks):
        assert f"rank {rank}: darray sweep ok" in output, output


@pytest.mark.parametrize("call", [lambda a: hetflow.reduce(a, "sum"), lambda a: hetflow.scan(a, "sum"),
                                  lambda a: hetflow.sort(a)])
def test_a_one_process_call_site_names_a_distributed_array_and_its_own_reductions(call):
    a = cluster.asarray(np.arange(12.0))
    with pytest.raises(ArgumentTypeError, match=r"got a distributed array \(DistArray\), which this process "
                                                r"holds only a part of; use its own reductions \(a\.reduce"):
        call(a)
    assert a.sum() == np.arange(12.0).sum()
