"""Random chains of view operators with an independent NumPy construction.

Each step applies one operator to a view and the NumPy meaning of that operator
(np.take, np.roll, slicing, np.swapaxes, np.flip, strides, broadcasting) to ``ids``,
the array of root flat indices that the view must select. The oracle never calls
hetflow's transforms.
"""
import numpy as np
from hypothesis import strategies as st

from hetflow.index import co_map, cshift, interior, partition, project, section, tile, transpose


def _box(ids, starts, stops):
    return ids[tuple(slice(a, b) for a, b in zip(starts, stops))]


def _project(data, v, ids):
    dims = [d for d, n in enumerate(ids.shape) if n]
    if not dims:
        return None
    d = data.draw(st.sampled_from(dims))
    k = data.draw(st.integers(0, ids.shape[d] - 1))
    return project(v, d, k), np.take(ids, k, axis=d)


def _cshift(data, v, ids):
    if not ids.ndim:
        return None
    d = data.draw(st.integers(0, ids.ndim - 1))
    n = ids.shape[d]
    s = data.draw(st.integers(-2 * n - 1, 2 * n + 1))
    return cshift(v, d, s), np.roll(ids, -s, axis=d)


def _interior(data, v, ids):
    if not ids.ndim:
        return None
    delta = tuple(data.draw(st.integers(0, n // 2)) for n in ids.shape)
    if data.draw(st.booleans()) and all(2 * delta[0] <= n for n in ids.shape):
        delta = (delta[0],) * ids.ndim
        view = interior(v, delta[0])
    else:
        view = interior(v, delta)
    return view, _box(ids, delta, [n - k for n, k in zip(ids.shape, delta)])


def _transpose(data, v, ids):
    if not ids.ndim:
        return None
    d1, d2 = (data.draw(st.integers(0, ids.ndim - 1)) for _ in range(2))
    return transpose(v, d1, d2), np.swapaxes(ids, d1, d2)


def _section(data, v, ids):
    starts = [data.draw(st.integers(0, n)) for n in ids.shape]
    sizes = [data.draw(st.integers(min(1, n - a), n - a)) for n, a in zip(ids.shape, starts)]
    stops = [a + e for a, e in zip(starts, sizes)]
    return section(v, starts, sizes), _box(ids, starts, stops)


def _flip(data, v, ids):
    if not ids.ndim:
        return None
    d = data.draw(st.integers(0, ids.ndim - 1))
    n = ids.shape[d]

    def f(i, d=d, n=n):
        return i[:d] + (n - 1 - i[d],) + i[d + 1:]
    return co_map(v, f, ids.shape), np.flip(ids, axis=d)


def _stride(data, v, ids):
    if not ids.ndim:
        return None
    d = data.draw(st.integers(0, ids.ndim - 1))
    sliced = ids[(slice(None),) * d + (slice(None, None, 2),)]

    def f(i, d=d):
        return i[:d] + (2 * i[d],) + i[d + 1:]
    return co_map(v, f, sliced.shape), sliced


def _broadcast(data, v, ids):
    if ids.ndim >= 3:
        return None
    k = data.draw(st.integers(1, 3))

    def f(i):
        return tuple(i[1:])
    return co_map(v, f, (k,) + ids.shape), np.broadcast_to(ids, (k,) + ids.shape)


def _part(data, v, ids):
    dims = [d for d, n in enumerate(ids.shape) if n]
    if not dims:
        return None
    d = data.draw(st.sampled_from(dims))
    n = ids.shape[d]
    parts = data.draw(st.integers(1, n))
    p = partition(v, parts, d)
    k = data.draw(st.integers(0, parts - 1))
    # Independent meaning: np.array_split cuts in sizes differing by at most 1.
    return p[k], np.array_split(ids, parts, axis=d)[k]


def _one_tile(data, v, ids):
    if not ids.ndim:
        return None
    divisors = [[t for t in range(1, n + 1) if n % t == 0] or [1] for n in ids.shape]
    te = tuple(data.draw(st.sampled_from(ds)) for ds in divisors)
    counts = [n // t for n, t in zip(ids.shape, te)]
    if not all(counts):
        return None
    at = tuple(data.draw(st.integers(0, c - 1)) for c in counts)
    starts = [a * t for a, t in zip(at, te)]
    return tile(v, te)[at], _box(ids, starts, [a + t for a, t in zip(starts, te)])


OPS = {"project": _project, "cshift": _cshift, "interior": _interior,
       "transpose": _transpose, "section": _section, "flip": _flip, "stride": _stride,
       "broadcast": _broadcast, "partition": _part, "tile": _one_tile}
# Operators whose chained transform_extent is the bounding box of the selected indices
# (interior adds its halo back: its parent extent seen from the view is larger).
BOX_OPS = ("project", "transpose", "section", "partition", "tile")


@st.composite
def chains(draw, ops=tuple(OPS), xp=np):
    """(root, view, ids, names): a random chain of 1-5 operators over a rank 1-3 root
    (a NumPy array, or an array of the array module ``xp``, e.g. CuPy)."""
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
    root = np.arange(np.prod(shape, dtype=int), dtype=np.float64).reshape(shape) * 1.5 + 0.25
    root = xp.asarray(root)
    ids = np.arange(root.size).reshape(shape)
    data = draw(st.data())
    view, names = root, []
    for _ in range(draw(st.integers(1, 5))):
        name = draw(st.sampled_from(ops))
        step = OPS[name](data, view, ids)
        if step is not None:
            (view, ids), names = step, names + [name]
    if not names:
        view, ids, names = section(root, (0,) * root.ndim, shape), ids, ["section"]
    return root, view, ids, names
