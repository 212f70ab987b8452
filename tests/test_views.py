"""Views (SPEC §1) against their NumPy meanings."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from view_chains import BOX_OPS, chains

from hetflow.errors import ArgumentTypeError, IndexOutOfBoundsError, ShapeError
from hetflow.index import (Partition, Section, asarray, co_map, cshift, extent, extent_of,
                           index, interior, is_view, partition, project, rank, root_of, section,
                           tile, transpose)
from hetflow.cuda_compat import cupy_module


def grid(*shape):
    return np.arange(np.prod(shape), dtype=np.float64).reshape(shape) * 0.5 - 3


# -- each operator ---------------------------------------------------------------------
def test_project_is_numpy_integer_indexing():
    a = grid(3, 20, 4)
    v = project(a, 1, 17)
    assert np.array_equal(v.numpy(), a[:, 17, :])
    assert v.rank == 2 and v.extent == (3, 4) and v.offset == (0, 17, 0)
    assert v.transform((2, 3)) == (2, 17, 3)
    assert v.transform_offset((1, 2)) == (1, 17, 2)
    assert v.transform_extent((3, 4)) == (3, 1, 4)
    assert v.cotransform_extent((3, 20, 4)) == (3, 4)
    assert v[2, 3] == a[2, 17, 3]


@pytest.mark.parametrize("shift", [-13, -6, -1, 0, 1, 2, 5, 6, 14])
@pytest.mark.parametrize("dim", [0, 1])
def test_cshift_is_np_roll(dim, shift):
    a = grid(6, 5)
    v = cshift(a, dim, shift)
    assert np.array_equal(v.numpy(), np.roll(a, -shift, axis=dim))
    assert v.extent == a.shape
    expect = [0, 0]
    expect[dim] = shift % a.shape[dim]
    assert v.offset == tuple(expect)


def test_interior_is_slicing_with_int_or_per_dim_delta():
    a = grid(7, 6, 5)
    assert np.array_equal(interior(a, 1).numpy(), a[1:6, 1:5, 1:4])
    v = interior(a, (2, 0, 1))
    assert np.array_equal(v.numpy(), a[2:5, 0:6, 1:4])
    assert v.offset == (2, 0, 1) and v.extent == (3, 6, 3)
    assert v.transform_extent(v.extent) == a.shape


def test_interiors_nest_as_the_spec_says():
    a = grid(6, 6)
    v = interior(interior(a, 1), 1)
    assert v.offset == index(2, 2) and v.extent == extent(2, 2)
    assert np.array_equal(v.numpy(), a[2:4, 2:4])
    assert v.root_extent == (6, 6)  # the halos of both interiors
    assert section(v, (1, 0), (1, 2)).root_extent == (5, 6)


def test_transpose_is_swapaxes():
    a = grid(2, 3, 4)
    for d1, d2 in [(0, 2), (1, 2), (2, 0), (1, 1)]:
        v = transpose(a, d1, d2)
        assert np.array_equal(v.numpy(), np.swapaxes(a, d1, d2))
        assert v.extent == np.swapaxes(a, d1, d2).shape


def test_section_is_slicing():
    a = grid(6, 7)
    v = section(a, (1, 2), (4, 3))
    assert np.array_equal(v.numpy(), a[1:5, 2:5])
    assert v.offset == (1, 2) and v.extent == (4, 3)
    w = section(v, (1, 1), (2, 2))
    assert np.array_equal(w.numpy(), a[2:4, 3:5]) and w.offset == (2, 3)


def test_co_map_is_integer_indexing_with_f():
    a = grid(4, 6)

    def f(i):
        return (3 - i[1], 2 * i[0] + 1)
    v = co_map(a, f, (3, 4))
    i, j = np.indices((3, 4))
    assert np.array_equal(v.numpy(), a[3 - j, 2 * i + 1])
    assert v.offset == (3, 1) and v[2, 1] == a[2, 5]
    assert v.transform_extent((3, 4)) == (4, 5)


def test_co_map_changes_rank():
    a = grid(5)
    v = co_map(a, lambda i: (i[0] + i[1],), (3, 3))
    i, j = np.indices((3, 3))
    assert np.array_equal(v.numpy(), a[i + j])
    s = co_map(a, lambda i: (4,), ())
    assert s.numpy().shape == () and s.numpy() == a[4] and s[()] == a[4]


def test_views_of_views_compose_deeply():
    a = grid(8, 9)
    v = a
    expect = a
    for _ in range(6):
        v, expect = transpose(cshift(v, 1, 2), 0, 1), np.swapaxes(np.roll(expect, -2, 1), 0, 1)
    v = interior(v, 1)
    assert np.array_equal(v.numpy(), expect[1:-1, 1:-1])


def test_view_properties():
    a = grid(4, 5).astype(np.float32)
    p = section(a, (1, 1), (2, 3))
    v = transpose(p, 0, 1)
    assert v.parent is p and v.root is a and v.dtype == np.float32
    assert v.shape == v.extent == (3, 2) and v.rank == 2
    assert is_view(v) and not is_view(a)
    assert rank(v) == 2 and extent_of(v) == (3, 2) and root_of(v) is a
    assert rank(a) == 2 and extent_of(a) == (4, 5) and root_of(a) is a
    assert repr(v) == ("transpose(section(ndarray<float32>(4, 5), start=index(1, 1), "
                       "size=extent(2, 3)), d1=0, d2=1)")


def test_array_types_exporting_from_the_class_are_checked_once():
    class DeviceLike:  # exports __cuda_array_interface__ from its class, as CuPy does
        evaluated = 0

        def __init__(self, shape):
            self.shape, self.strides, self.dtype = shape, None, np.dtype(np.float64)

        @property
        def __cuda_array_interface__(self):
            DeviceLike.evaluated += 1
            return {"shape": self.shape, "typestr": "<f8", "data": (0, False), "version": 3}

    class Exporter:  # exports an interface from the instance alone: checked every time
        def __init__(self):
            self.shape, self.__array_interface__ = (3, 4), np.zeros((3, 4)).__array_interface__

    first = interior(DeviceLike((6, 7)), 1)
    seen = DeviceLike.evaluated
    views = [cshift(DeviceLike((6, 7)), 1, 2), interior(DeviceLike((5, 3)), 1)]
    assert DeviceLike.evaluated == seen  # not asked again for the same type
    assert [extent_of(v) for v in (first, *views)] == [(4, 5), (6, 7), (3, 1)]
    assert is_view(section(Exporter(), (1, 1), (2, 2)))
    with pytest.raises(ArgumentTypeError, match=r"interior: expected an array or a view, got object"):
        interior(object(), 1)


def test_reads_and_writes_go_through_to_the_root():
    a = grid(5, 5)
    v = transpose(cshift(interior(a, 1), 0, 1), 0, 1)
    expect = np.swapaxes(np.roll(a[1:4, 1:4], -1, 0), 0, 1)
    assert v[2, 0] == expect[2, 0]
    v[2, 0] = 100.0
    assert a[2, 3] == 100.0  # interior row 1 (rolled from 0) col 2 -> root (2, 3)
    v.assign(-1.0)
    assert np.all(a[1:4, 1:4] == -1.0) and a[0, 0] == grid(5, 5)[0, 0]


def test_numpy_is_a_copy_and_array_protocol_materialises():
    a = grid(3, 3)
    v = section(a, (0, 1), (3, 2))
    out = v.numpy()
    out[:] = 7
    assert not np.any(a == 7)
    assert np.array_equal(np.asarray(v), a[:, 1:]) and np.asarray(v, np.int32).dtype == np.int32
    assert np.array_equal(asarray(v), a[:, 1:])
    with pytest.raises(ShapeError, match="cannot become an array without a copy"):
        np.asarray(v, copy=False)


def test_iteration_and_len():
    a = grid(3, 4)
    v = section(a, (1, 0), (2, 4))
    assert len(v) == 2
    assert [r.numpy().tolist() for r in v] == a[1:3].tolist()
    assert list(project(v, 0, 1)) == list(a[2])
    with pytest.raises(ArgumentTypeError, match="len\\(\\) of a rank-0 project view"):
        len(project(project(a, 0, 1), 0, 1))


def test_zero_size_views():
    a = grid(0, 3)
    v = interior(cshift(a, 0, 5), (0, 1))
    assert v.extent == (0, 1) and v.numpy().shape == (0, 1)
    assert section(grid(4, 4), (4, 0), (0, 4)).numpy().shape == (0, 4)


def test_rank_zero_root():
    a = np.array(2.5)
    v = section(a, (), ())
    assert v.extent == () and v.numpy() == 2.5 and v[()] == 2.5
    v.numpy()[()] = 1.0
    assert a == 2.5
    v[()] = 4.0
    assert a == 4.0


def test_structured_dtype():
    dt = np.dtype([("x", np.float64), ("n", np.int32)])
    a = np.zeros((3, 4), dtype=dt)
    a["x"] = grid(3, 4)
    v = project(a, 0, 2)
    assert v.dtype == dt and np.array_equal(v.numpy(), a[2])
    v[1] = (9.0, 3)
    assert a[2, 1]["n"] == 3


# -- tiles and partitions ---------------------------------------------------------------
def blocks(a, te):
    """NumPy view_as_blocks: shape (counts..., tile...)."""
    counts = [n // t for n, t in zip(a.shape, te)]
    inter = a.reshape([x for c, t in zip(counts, te) for x in (c, t)])
    r = a.ndim
    return inter.transpose(list(range(0, 2 * r, 2)) + list(range(1, 2 * r, 2)))


def test_tile_is_a_view_of_sections():
    a = grid(6, 6)
    t = tile(a, (2, 3))
    assert t.extent == (3, 2) and t.element_extent == (2, 3)
    tij = t[2, 1]
    assert isinstance(tij, Section) and tij.offset == (4, 3)
    assert np.array_equal(tij.numpy(), a[4:6, 3:6])
    assert np.array_equal(t.numpy(), blocks(a, (2, 3)))
    assert t.transform_offset((1, 1)) == (2, 3) and t.transform_extent((3, 2)) == (6, 6)
    assert t.tile_at((0, 1)).offset == (0, 3)


def test_views_over_tiles_and_tiles_of_tiles():
    a = grid(4, 6)
    tt = transpose(tile(a, (2, 2)), 0, 1)
    assert tt.extent == (3, 2)
    assert np.array_equal(tt[2, 1].numpy(), a[2:4, 4:6])
    assert np.array_equal(tt.numpy(), np.swapaxes(blocks(a, (2, 2)), 0, 1))
    nested = tile(tile(a, (2, 3)), (1, 2))
    assert nested.extent == (2, 1) and nested.element_extent == (1, 2, 2, 3)
    # result[P, Q, m, n, k, l] = blocks(a)[P + m, 2Q + n, k, l]
    b = blocks(a, (2, 3)).reshape(2, 1, 1, 2, 2, 3).transpose(0, 2, 1, 3, 4, 5)
    assert np.array_equal(nested.numpy(), b)
    assert np.array_equal(nested[1, 0][0, 1].numpy(), a[2:4, 3:6])


def test_writing_a_tile_fills_its_block():
    a = grid(4, 4)
    t = tile(a, (2, 2))
    t[1, 0] = 0.0
    assert np.all(a[2:4, 0:2] == 0) and np.all(a[0:2] == grid(4, 4)[0:2])


def test_partition_by_count():
    a = grid(10, 3)
    p = partition(a, 4, 0)
    assert len(p) == 4 and p.sizes == (3, 3, 2, 2)
    assert p.bounds == ((0, 3), (3, 6), (6, 8), (8, 10))
    got = [s.numpy() for s in p]
    for g, e in zip(got, np.array_split(a, 4, axis=0)):
        assert np.array_equal(g, e)
    assert np.array_equal(p[-1].numpy(), a[8:10]) and len(p[1:3]) == 2
    assert all(isinstance(s, Section) for s in p)
    col = partition(transpose(a, 0, 1), 3, 0)
    assert [s.extent for s in col] == [(1, 10)] * 3


@pytest.mark.parametrize("shares,n,sizes", [
    ([0.7, 0.3], 10, (7, 3)), ([1, 1, 1], 10, (4, 3, 3)), ([2, 1], 7, (5, 2)),
    ([0.5, 0.25, 0.25], 3, (1, 1, 1)), ([0.6, 0.2, 0.2], 4, (2, 1, 1)), ([3], 5, (5,)),
    ([0.01, 0.99], 4, (0, 4))])
def test_partition_by_shares_rounds_to_integers(shares, n, sizes):
    p = partition(grid(n), shares, 0)
    assert p.sizes == sizes
    assert np.array_equal(np.concatenate([s.numpy() for s in p]), grid(n))


# -- random compositions against an independent NumPy construction -------------------
def check_against_oracle(root, view, ids, data_index):
    assert view.extent == ids.shape and view.rank == ids.ndim
    assert np.array_equal(view.numpy(), root.reshape(-1)[ids])
    if ids.size:
        origin = np.unravel_index(ids.reshape(-1)[0], root.shape)
        assert view.offset == tuple(int(x) for x in origin)
        idx = data_index(ids.shape)
        assert view[idx] == root.reshape(-1)[ids[idx]]
        before = root.copy()
        view[idx] = -99.0
        expect = before.copy()
        expect.reshape(-1)[ids[idx]] = -99.0
        assert np.array_equal(root, expect)


@settings(max_examples=200, deadline=None)
@given(chains(), st.data())
def test_random_chains_match_numpy(chain, data):
    root, view, ids, names = chain

    def data_index(shape):
        return tuple(data.draw(st.integers(0, n - 1)) for n in shape)
    check_against_oracle(root, view, ids, data_index)
    # assign writes a value determined by the target, so duplicates agree.
    before = root.copy()
    view.assign(ids * 2.0 + 1)
    expect = before.copy()
    expect.reshape(-1)[ids.reshape(-1)] = ids.reshape(-1) * 2.0 + 1
    assert np.array_equal(root, expect)


@pytest.mark.gpu
def test_random_chains_over_cupy_roots():
    cupy = cupy_module()

    @settings(max_examples=60, deadline=None)
    @given(chains(xp=cupy))
    def check(chain):
        root, view, ids, names = chain
        expect = cupy.asnumpy(root).reshape(-1)[ids]
        assert np.array_equal(view.numpy(), expect)
        assert np.array_equal(view.cupy().get(), expect)
        view.assign(cupy.asarray(ids * 2.0 + 1))
        assert np.array_equal(cupy.asnumpy(root).reshape(-1)[ids], ids * 2.0 + 1)
    check()


@settings(max_examples=100, deadline=None)
@given(chains(ops=BOX_OPS))
def test_root_extent_of_box_chains_is_the_bounding_box(chain):
    root, view, ids, names = chain
    if ids.size:
        coords = np.unravel_index(ids.reshape(-1), root.shape)
        box = tuple(int(c.max() - c.min() + 1) for c in coords)
        assert view.root_extent == box


# -- bad input ------------------------------------------------------------------------------
@pytest.mark.parametrize("make,err,msg", [
    (lambda a: project(a, 1, 17), ShapeError,
     r"project: value 17 is out of range \[0, 5\) of dim 1 \(parent extent \(4, 5\)\)"),
    (lambda a: project(a, 1, -1), ShapeError, r"project: value -1 is out of range"),
    (lambda a: project(a, 2, 0), ShapeError,
     r"project: dim 2 is out of range for a rank-2 parent \(valid 0..1\)"),
    (lambda a: project(a, -1, 0), ShapeError, r"project: dim -1 is out of range"),
    (lambda a: project(a, 0.5, 0), ArgumentTypeError, r"project: dim must be an integer, got 0.5"),
    (lambda a: cshift(a, 3, 1), ShapeError, r"cshift: dim 3 is out of range for a rank-2"),
    (lambda a: cshift(a, 0, "1"), ArgumentTypeError, r"cshift: shift must be an integer"),
    (lambda a: interior(a, 3), ShapeError,
     r"interior: delta \(3, 3\) leaves a negative extent on dim 0: 4 - 2\*3 = -2"),
    (lambda a: interior(a, (1, 3)), ShapeError,
     r"interior: delta \(1, 3\) leaves a negative extent on dim 1: 5 - 2\*3 = -1"),
    (lambda a: interior(a, (1, -1)), ShapeError, r"interior: delta \(1, -1\) is negative on dim 1"),
    (lambda a: interior(a, (1, 1, 1)), ShapeError, r"interior: delta \(1, 1, 1\) has rank 3"),
    (lambda a: transpose(a, 0, 2), ShapeError, r"transpose: d2 2 is out of range for a rank-2"),
    (lambda a: transpose(a, -1, 0), ShapeError, r"transpose: d1 -1 is out of range"),
    (lambda a: section(a, (2, 3), (3, 2)), ShapeError,
     r"section: offset \(2, 3\) \+ extent \(3, 2\) = \(5, 5\) exceeds the parent extent "
     r"\(4, 5\) on dim 0"),
    (lambda a: section(a, (0, -1), (1, 1)), ShapeError, r"section: offset \(0, -1\) is negative"),
    (lambda a: section(a, (0,), (1, 1)), ShapeError, r"must both have the parent's rank 2"),
    (lambda a: section(a, (0, 0), (1, -1)), ShapeError,
     r"section: bad extent: extent components must be >= 0, got \(1, -1\)"),
    (lambda a: section(a, (0, 0.5), (1, 1)), ArgumentTypeError,
     r"section: bad offset: index components must be integers, got 0.5"),
    (lambda a: interior(a, (1, "x")), ArgumentTypeError, r"interior: bad delta: index components"),
    (lambda a: tile(a, 2.0), ArgumentTypeError, r"tile: bad tile extent: extent takes integers"),
    (lambda a: co_map(a, lambda i: (0, 0), (-1,)), ShapeError, r"co_map: bad extent: extent"),
    (lambda a: Partition(a, 0, (5, -1)), ShapeError, r"partition: bad sizes: extent components"),
    (lambda a: tile(a, (3, 5)), ShapeError,
     r"tile: tile extent \(3, 5\) does not divide the parent extent \(4, 5\): dim 0 "
     r"\(4 = 1\*3 \+ 1\) would leave a partial tile of 1"),
    (lambda a: tile(a, (0, 5)), ShapeError, r"tile: tile extent \(0, 5\) is 0 on dim 0"),
    (lambda a: tile(a, (2,)), ShapeError, r"tile: tile extent \(2,\) has rank 1"),
    (lambda a: partition(a, 0, 0), ShapeError,
     r"partition: 0 parts of dim 0 with extent 4: parts must be in \[1, 4\]"),
    (lambda a: partition(a, 6, 1), ShapeError, r"partition: 6 parts of dim 1 with extent 5"),
    (lambda a: partition(a, 2, 2), ShapeError, r"partition: dim 2 is out of range"),
    (lambda a: partition(a, [0.5, 0], 0), ShapeError,
     r"partition: shares must be a non-empty list of positive finite numbers, got \[0.5, 0\]"),
    (lambda a: partition(a, [], 0), ShapeError, r"shares must be a non-empty list"),
    (lambda a: partition(a, 2.5, 0), ArgumentTypeError,
     r"partition: parts must be a count or a list of shares, got 2.5"),
    (lambda a: Partition(a, 0, (1, 2)), ShapeError,
     r"partition: sizes \(1, 2\) add up to 3, not to the extent 4 of dim 0"),
    (lambda a: co_map(a, lambda i: (i[0],), (4,)), ShapeError,
     r"co_map: f maps the rank-1 index \(0,\) to the rank-1 index \(0,\), but the parent "
     r"has rank 2"),
    (lambda a: co_map(a, lambda i: (i[0] + 4, 0), (2,)), ShapeError,
     r"co_map: f reaches parent index 4 on dim 0, outside the parent extent \(4, 5\)"),
    (lambda a: co_map(a, lambda i: 3, (2,)), ArgumentTypeError,
     r"co_map: f must return an index tuple, got 3"),
    (lambda a: co_map(a, "f", (2,)), ArgumentTypeError, r"co_map: f must be callable"),
    (lambda a: project([[1, 2]], 0, 0), ArgumentTypeError,
     r"project: expected an array or a view, got list"),
    (lambda a: rank("x"), ArgumentTypeError, r"rank: expected an array or a view, got str"),
])
def test_bad_parameters_fail_at_creation(make, err, msg):
    with pytest.raises(err, match=msg):
        make(grid(4, 5))


def test_out_of_range_reads_and_writes():
    a = grid(4, 5)
    v = interior(a, 1)
    with pytest.raises(IndexOutOfBoundsError, match=r"index \(2, 3\) is outside the interior "
                       r"view's extent \(2, 3\)"):
        v[2, 3]
    with pytest.raises(IndexError, match=r"index \(-1, 0\) is outside"):
        v[-1, 0] = 1.0
    with pytest.raises(ShapeError, match=r"interior view of rank 2 indexed with 1 components"):
        v[1]
    with pytest.raises(ArgumentTypeError, match=r"indices must be integers \(use section\(\) "
                       r"for ranges\)"):
        v[0:1, 0]
    with pytest.raises(IndexOutOfBoundsError, match=r"partition: part 2 does not exist; there "
                       r"are 2 parts"):
        partition(a, 2, 0)[2]
    with pytest.raises(IndexOutOfBoundsError, match=r"outside the tile view's extent \(2, 1\)"):
        tile(a, (2, 5)).tile_at((2, 0))


def test_co_map_reaching_outside_fails_at_creation():
    # every index is checked, not just index 0: kernels read outside the parent silently
    a = grid(5)
    with pytest.raises(ShapeError, match=r"co_map: f reaches parent index 6 on dim 0, outside the parent "
                                         r"extent \(5,\), at index \(3,\)"):
        co_map(a, lambda i: (2 * i[0],), (4,))  # index 3 maps to 6
