"""Distributed arrays whose blocks are coherent arrays (issue 16: the main job's grids
stay where they are used, under mpiexec too).

A rank with a GPU of its own keeps each block as a hetflow array, so co-executing on its
cores and GPU moves only halo rows and stolen rows, not the block, every launch. Results
are checked against NumPy; bytes moved against the rows a halo exchange must move.
"""
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from test_distributed import run_script

import hetflow
from hetflow import cluster
from hetflow.cluster import darray
from hetflow.errors import ArgumentError, ArgumentTypeError, IndexOutOfBoundsError, ShapeError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import heat_distributed as heat  # noqa: E402


@hetflow.kernel
def twice(i, x):
    x[i] = 2.0 * x[i]


@hetflow.kernel
def twice2(i, j, x):
    x[i, j] = 2.0 * x[i, j]


@hetflow.kernel
def stencil(i, out, left, centre, right):
    out[i] = left[i] + 10.0 * centre[i] + 100.0 * right[i]


def _session(*devices):
    return types.SimpleNamespace(devices=devices)


def test_the_default_place_follows_the_rank_devices():
    f8 = np.dtype(np.float64)
    assert darray._element_and_place(_session("cpu0", "gpu1"), f8, None, 0) == (f8, None, True)
    assert darray._element_and_place(_session("cpu0"), f8, None, 0) == (f8, None, False)
    # rows along another dimension, or elements a kernel cannot compute with: host memory
    assert darray._element_and_place(_session("cpu0", "gpu1"), f8, None, 1)[2] is False
    pair = np.dtype([("a", "i4"), ("b", "f8")])
    assert darray._element_and_place(_session("cpu0", "gpu1"), pair, None, 0) == (pair, None, False)
    # asked for by name: coherent on a rank without a GPU too (its cores use the host copy)
    assert darray._element_and_place(_session("cpu0"), f8, "coherent", 0) == (f8, None, True)
    assert darray._element_and_place(_session("cpu0", "gpu1"), f8, "host", 0) == (f8, None, False)


def test_coherent_blocks_are_refused_where_they_cannot_hold_the_rows():
    with pytest.raises(ShapeError, match="coherent arrays are distributed along dim 0 only"):
        cluster.empty((4, 6), dim=1, device="coherent")
    with pytest.raises(ArgumentError, match="a coherent distributed array needs numeric data"):
        cluster.empty(4, dtype=[("a", "i4")], device="coherent")
    with pytest.raises(ArgumentTypeError, match="device must be None, 'host', 'coherent', a GPU id"):
        cluster.empty(4, device=3.5)


def test_a_coherent_array_on_the_cpu_alone_matches_numpy():
    x = np.arange(30.0).reshape(10, 3)
    a = cluster.asarray(x, device="coherent")
    assert a.coherent and isinstance(a.local, hetflow.Buffer) and "on coherent" in repr(a)
    b = cluster.zeros_like(a)
    assert b.coherent and not b.block.any()
    np.testing.assert_array_equal(a.allgather(), x)
    assert a.sum() == x.sum() and a.max() == x.max()
    np.testing.assert_array_equal(a.block, x)
    a.block[2] = -1.0  # the host rows, written in place as a NumPy block is
    expected = x.copy()
    expected[2] = -1.0
    np.testing.assert_array_equal(a.allgather(), expected)
    # a launch outside a program: on the rank's own devices, halos through the host copy
    y = np.random.default_rng(3).random(9)
    c = cluster.asarray(y, device="coherent")
    d = cluster.zeros_like(c)
    cluster.forall(9, stencil, d, hetflow.cshift(c, 0, -1), c, hetflow.cshift(c, 0, 1))
    np.testing.assert_allclose(d.allgather(), np.roll(y, 1) + 10 * y + 100 * np.roll(y, -1), rtol=1e-14)


@pytest.mark.simgpu
def test_a_halo_exchange_moves_the_halo_rows_only(gpu_device):
    x = np.arange(8.0)
    a = cluster.asarray(x, device="coherent", halo=1)
    hetflow.forall(a.local.shape, twice, a.local, device=gpu_device.id)  # current on the GPU alone
    assert a.local.valid == (gpu_device.id,)
    before = dict(a.local.moved)
    a.exchange_halos()  # periodic onto itself: row 7 above the block, row 0 below it
    # the two rows sent come out, and the two received go straight back to the GPU
    assert a.local.moved["to_host"] - before["to_host"] == 2 * 8
    assert a.local.moved["to_device"] - before["to_device"] == 2 * 8
    assert a.local.valid == (gpu_device.id,)  # the host's halo rows are stale, not current
    assert a.local.stale_rows(hetflow.get_device("cpu0"), [(0, 10)]) == [(0, 10)]
    before = dict(a.local.moved)
    assert a.sum() == 2 * x.sum()  # a reduction reads the block's host rows: they stay current on the GPU
    assert a.local.moved["to_host"] - before["to_host"] == 8 * 8 and a.local.moved["to_device"] == before["to_device"]
    whole = np.asarray(a.local)
    np.testing.assert_array_equal(whole[1:-1], 2 * x)
    assert whole[0] == 2 * x[-1] and whole[-1] == 2 * x[0]
    before = dict(a.local.moved)
    assert a.local.stale_rows(gpu_device, [(0, 10)]) == []
    a.block[3] = 0.5  # written through the block, which is mapped whole: it goes to the GPU again
    hetflow.forall(a.local.shape, twice, a.local, device=gpu_device.id)
    assert a.local.moved["to_device"] - before["to_device"] == 8 * 8  # the block; the halo rows are there
    assert a.allgather()[3] == 1.0


@pytest.mark.simgpu
def test_rows_out_and_in_go_through_the_gpu_copy_that_holds_them(gpu_device):
    buf = hetflow.array(np.arange(12.0).reshape(6, 2))
    out = [np.empty((1, 2)), np.empty((2, 2))]
    assert buf.rows_out([(0, 1), (3, 5)], out) is None  # current on the host alone: nothing copied
    assert buf.moved == {"to_device": 0, "to_host": 0}
    assert buf.gpu_ordinals == ()
    hetflow.forall(buf.shape, twice2, buf, device=gpu_device.id)
    assert buf.gpu_ordinals == (gpu_device.ordinal,)
    assert buf.rows_out([(0, 1), (3, 5)], out) == gpu_device.id
    np.testing.assert_array_equal(out[0], [[0.0, 2.0]])
    np.testing.assert_array_equal(out[1], [[12.0, 14.0], [16.0, 18.0]])
    assert buf.moved["to_host"] == 3 * 2 * 8 and buf.valid == (gpu_device.id,)  # the host copy unchanged
    buf.rows_in(gpu_device.id, [(1, 2), (5, 6)], [np.full((1, 2), -1.0), np.full((1, 2), -2.0)])
    assert buf.moved["to_device"] == 12 * 8 + 2 * 2 * 8
    assert buf.stale_rows(hetflow.get_device("cpu0"), [(0, 6)]) == [(0, 6)]
    expected = 2 * np.arange(12.0).reshape(6, 2)
    expected[1], expected[5] = -1.0, -2.0
    np.testing.assert_array_equal(buf.read(), expected)
    buf.host_rows(2, 3, write=True)[...] = 7.0  # row 2 current on the host alone
    assert buf.rows_out([(2, 3)], [np.empty((1, 2))]) is None  # no GPU copy holds it
    assert buf.gpu_ordinals == (gpu_device.ordinal,)  # a copy, current or not
    with pytest.raises(IndexOutOfBoundsError, match=r"rows_out: rows 5:7 are not rows of it \(0:6\)"):
        buf.rows_out([(5, 7)], [np.empty((2, 2))])
    with pytest.raises(IndexOutOfBoundsError, match=r"rows_in: rows -1:1 are not rows of it \(0:6\)"):
        buf.rows_in(gpu_device.id, [(-1, 1)], [np.empty((2, 2))])
    with pytest.raises(ArgumentError, match=r"rows_out: 2 row ranges but 1 host arrays"):
        buf.rows_out([(0, 1), (3, 5)], [np.empty((1, 2))])
    with pytest.raises(ArgumentError, match=r"rows_out: rows 3:5 need a NumPy array of shape \(2, 2\) and "
                                            r"dtype float64, not \(2, 3\) float64"):
        buf.rows_out([(0, 1), (3, 5)], [np.empty((1, 2)), np.empty((2, 3))])
    with pytest.raises(ArgumentError, match=r"rows_in: rows 0:1 need a NumPy array of shape \(1, 2\) and "
                                            r"dtype float64, not \(1, 2\) int64"):
        buf.rows_in(gpu_device.id, [(0, 1)], [np.zeros((1, 2), np.int64)])
    with pytest.raises(ArgumentError, match=r"rows_in: rows 0:1 need a NumPy array .* not list"):
        buf.rows_in(gpu_device.id, [(0, 1)], [[1.0, 2.0]])
    with pytest.raises(ArgumentError, match=r"rows_in: it has no copy on 'gpu7' \(its GPU copies: gpu0\)"):
        buf.rows_in("gpu7", [(0, 1)], [np.zeros((1, 2))])
    np.testing.assert_array_equal(buf.read()[[0, 1, 5]], [[0.0, 2.0], [-1.0, -1.0], [-2.0, -2.0]])  # untouched


@pytest.mark.simgpu
def test_host_rows_move_only_the_rows_asked_for(gpu_device):
    buf = hetflow.array(np.arange(12.0).reshape(6, 2))
    hetflow.forall(buf.shape, twice2, buf, device=gpu_device.id)
    rows = buf.host_rows(2, 4)
    np.testing.assert_array_equal(rows, [[8.0, 10.0], [12.0, 14.0]])
    assert not rows.flags.writeable and buf.moved["to_host"] == rows.nbytes
    target = buf.host_rows(0, 1, overwrite=True)  # to be overwritten: nothing is brought
    target[...] = -1.0
    assert buf.moved["to_host"] == rows.nbytes
    mapped = buf.host_rows(5, 6, write=True)  # read and written: brought up to date first
    np.testing.assert_array_equal(mapped, [[20.0, 22.0]])
    mapped += 1.0
    assert buf.moved["to_host"] == rows.nbytes + mapped.nbytes
    hetflow.forall(buf.shape, twice2, buf, device=gpu_device.id)  # rows 0 and 5 go back, alone
    assert buf.moved["to_device"] == 12 * 8 + target.nbytes + mapped.nbytes
    expected = 4 * np.arange(12.0).reshape(6, 2)
    expected[0], expected[5] = -2.0, [42.0, 46.0]
    np.testing.assert_array_equal(buf.read(), expected)


@pytest.mark.simgpu
def test_rows_kept_under_a_new_cut_stay_in_the_memory_that_holds_them(gpu_device):
    x = np.arange(16.0).reshape(8, 2)
    old = hetflow.array(x)
    hetflow.forall(old.shape, twice2, old, device=gpu_device.id)  # current on the GPU alone
    old.host_rows(6, 8)  # rows 6, 7 current on the host too
    new = hetflow.Buffer((5, 2))
    new.copy_rows(old, 3, 8, 0)
    assert new.moved == {"to_device": 0, "to_host": 0}  # nothing crossed the bus
    assert new.stale_rows(gpu_device, [(0, 5)]) == []
    assert new.stale_rows(hetflow.get_device("cpu0"), [(0, 5)]) == [(0, 3)]
    np.testing.assert_array_equal(new.read(), 2 * x[3:])
    assert new.moved["to_host"] == 3 * 2 * 8  # read: the rows current on the GPU alone


def test_row_copies_refuse_rows_a_buffer_does_not_have():
    a, b = hetflow.array(np.zeros((4, 2))), hetflow.Buffer((3, 2))
    with pytest.raises(IndexOutOfBoundsError, match=r"host_rows: rows 2:5 are not rows of it \(0:4\)"):
        a.host_rows(2, 5)
    with pytest.raises(IndexOutOfBoundsError, match=r"copy_rows: rows 2:5 are not rows of it \(0:3\)"):
        b.copy_rows(a, 1, 4, 2)
    with pytest.raises(ArgumentError, match="the source must be another Buffer of rows like this one's"):
        a.copy_rows(a, 0, 1, 2)
    with pytest.raises(ArgumentError, match="the source must be another Buffer of rows like this one's"):
        b.copy_rows(hetflow.array(np.zeros((4, 3))), 0, 1, 0)
    assert a.valid == ("host",) and b.valid == ("host",)  # nothing changed


@pytest.mark.simgpu
def test_heat_over_coherent_blocks_co_executed_matches_numpy(gpu_device):
    n, iterations = 12, 5

    def body():
        u = cluster.asarray(heat.initial(n), device="coherent")
        v = cluster.asarray(heat.initial(n), like=u)
        assert v.coherent
        with hetflow.graph("heat") as g:
            shape = hetflow.interior(u, 1).shape
            cluster.forall(shape, heat.heat_step, *heat.step_args(u, v))
            cluster.forall(shape, heat.heat_step, *heat.step_args(v, u))
        program = cluster.DistributedProgram(g, devices=["cpu0", gpu_device.id])
        return heat.advance(program, u, v, iterations).gather(0)

    grid = cluster.run_distributed(body)
    np.testing.assert_allclose(grid, heat.numpy_solve(n, iterations), rtol=0, atol=1e-12)


@pytest.mark.mpi
@pytest.mark.simgpu
def test_ranks_move_halo_rows_not_blocks_and_rebalance_coherent_blocks():
    output = run_script(2, "s27_coherent.py", "sim", timeout=240)
    assert "rank 0: coherent ok" in output and "rank 1: coherent ok" in output, output


@pytest.mark.mpi
@pytest.mark.gpu
@pytest.mark.skipif(not any(d.kind == "gpu" and not d.simulated for d in hetflow.devices()),
                    reason="needs a real GPU")
def test_a_rank_with_its_own_gpu_keeps_coherent_blocks_by_default():
    output = run_script(2, "s27_coherent.py", "auto", timeout=240)
    assert "rank 0: coherent ok" in output and "rank 1: coherent ok" in output, output
