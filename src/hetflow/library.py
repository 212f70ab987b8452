"""The API library (SPEC §2): built-in kernels kept as source, precompiled on request.

``precompile()`` builds executables for the common signatures into the code
repository, so a later process loads them instead of compiling.
"""
from __future__ import annotations

import numbers

import numpy as np

from .errors import ArgumentError, ArgumentTypeError, ShapeError
from .index import views as _views
from .kernels import kernel
from .runtime.forall import forall, resolve_devices
from .runtime.launch import refuse_masked
from .runtime.reductions import compiled_operand


@kernel
def axpy(i, a, x, y, out):
    out[i] = a * x[i] + y[i]


@kernel
def scale(i, a, x, out):
    out[i] = a * x[i]


@kernel
def add(i, x, y, out):
    out[i] = x[i] + y[i]


@kernel
def sub(i, x, y, out):
    out[i] = x[i] - y[i]


@kernel
def mul(i, x, y, out):
    out[i] = x[i] * y[i]


@kernel
def div(i, x, y, out):
    out[i] = x[i] / y[i]


@kernel
def fill(i, value, out):
    out[i] = value


@kernel
def copy(i, x, out):
    out[i] = x[i]


@kernel
def dot_partial(i, x, y, n, block, partial):
    """partial[i] += the sum of x[k] * y[k] over block i of length ``block`` of the first
    ``n`` elements, in the element type of ``partial`` (bools: whether some product is
    true). ``n`` is an argument: a view inside a kernel may only be subscripted."""
    lo = i * block
    hi = min(lo + block, n)
    acc = partial[i]  # partial's type: a float64 accumulator rounds int64 above 2**53
    for k in range(lo, hi):
        acc += x[k] * y[k]
    partial[i] = acc


KERNELS = {k.name: k for k in (axpy, scale, add, sub, mul, div, fill, copy, dot_partial)}


def get(name: str):
    """A library kernel by name."""
    try:
        return KERNELS[name]
    except KeyError:
        raise ArgumentError(f"no library kernel {name!r}; the library has {sorted(KERNELS)}") from None


# The graph being captured, asked as the call sites ask it: the IR's current_graph,
# handed over by hetflow.callsites (the IR is a layer above the library).
_current_graph = None


def record_with(current_graph) -> None:
    """Make :func:`dot` ask ``current_graph()`` for the graph being captured, and record
    itself there instead of running, as hetflow's call sites do."""
    global _current_graph
    _current_graph = current_graph


def dot(x, y, *, blocks: int = 256, device=None):
    """x · y of two vectors (arrays, views of rank 1, or what ``np.asarray`` reads: a
    list), as ``np.dot`` gives it (of a view's ``numpy()``): ``dot_partial`` per block,
    then a sum of the partials, both in NumPy's result type (integers wrap as NumPy's
    do; bools: whether some product is true). ``blocks``: how many partials, a positive
    integer (at most one per element).

    Inside ``with hetflow.graph()`` the product is recorded, not computed: the result is
    a handle, readable after ``g.run()``, which reads ``x`` and ``y`` as they are then.
    What the call run now would refuse of ``blocks``, ``device`` and the vectors' shapes
    and types is refused while recording (a result the graph has not computed yet is
    checked when it runs)."""
    count = _block_count(blocks)
    g = _current_graph() if _current_graph is not None else None
    if g is not None:
        # A result of the graph (read through __array__, no shape) has none until it runs.
        if all(hasattr(a, "shape") or not hasattr(a, "__array__") for a in (x, y)):
            _vectors(x, y)
        if device is not None:
            resolve_devices(device)
        return g.record("dot", fn=dot, args=(x, y), kwargs=dict(blocks=count, device=device))
    x, y, n, dtype = _vectors(x, y)
    devs = resolve_devices(device, (x, y))
    x, y = compiled_operand(x, devs, "dot", "x"), compiled_operand(y, devs, "dot", "y")
    blocks = min(count, max(n, 1))
    block = -(-n // blocks) if n else 1
    partial = np.zeros(blocks, dtype=dtype)
    forall(blocks, dot_partial, x, y, n, block, partial, device=device)
    return partial.sum(dtype=dtype)  # (a sum of bools in bools: their logical or)


def _vectors(x, y):
    """(x, y, their length, the result type) for :func:`dot`, or its error."""
    x, y = _vector(x, "x"), _vector(y, "y")
    n = x.shape[0]
    if y.shape[0] != n:
        raise ShapeError(f"dot: shapes {tuple(x.shape)} and {tuple(y.shape)} not aligned: "
                         f"{n} (dim 0) != {y.shape[0]} (dim 0)")
    dtype = np.result_type(x.dtype, y.dtype)
    if dtype.kind not in "biufc":
        raise ArgumentTypeError(f"dot: x and y hold {x.dtype} and {y.dtype}; dot takes bools and numbers "
                                f"(integers, floats, complex)")
    return x, y, n, dtype


def _block_count(blocks) -> int:
    """``dot``'s ``blocks=`` as an int: ArgumentTypeError for a non-integer (a bool, 1.5),
    ArgumentError below 1."""
    if isinstance(blocks, (bool, np.bool_)) or not isinstance(blocks, numbers.Integral):
        raise ArgumentTypeError(f"dot: blocks must be a positive integer, got {blocks!r}")
    if blocks < 1:
        raise ArgumentError(f"dot: blocks must be a positive integer, got {blocks}")
    return int(blocks)


def _vector(a, name: str):
    """``a`` as :func:`dot` takes it: of rank 1, read by ``np.asarray`` where it is no
    array or view (a view's shape: its ``numpy()``'s, elements that are tiles included),
    a NumPy array subclass as a plain array; a masked array is refused."""
    if _views.is_view(a):
        shape = tuple(a.shape) + tuple(a.element_extent)
    else:
        a = a if hasattr(a, "shape") else np.asarray(a)
        shape = tuple(a.shape)
    if len(shape) != 1:
        raise ShapeError(f"dot: {name} must be a vector (1-D); got shape {shape}")
    refuse_masked(a, f"dot: {name} is")
    return np.asarray(a) if isinstance(a, np.ndarray) else a


def precompile(dtypes=("float64", "float32"), device=None) -> int:
    """Build every library kernel for 1-D arrays of ``dtypes`` on ``device`` (default the
    CPU) by running it once on tiny data; returns how many executables were prepared."""
    count = 0
    for dt in dtypes:
        x = np.ones(4, dtype=dt)
        a = x.dtype.type(2)
        calls = {"axpy": (4, a, x, x, x.copy()), "scale": (4, a, x, x.copy()),
                 "fill": (4, a, x.copy()), "copy": (4, x, x.copy()),
                 "dot_partial": (1, x, x, 4, 4, np.zeros(1, dtype=dt))}
        for name, k in KERNELS.items():
            extent, *args = calls.get(name, (4, x, x, x.copy()))
            forall(extent, k, *args, device=device)
            count += 1
    return count


@kernel
def minloc(a, b):
    """Reduction op of ``(value, index)`` pairs: the least value, the first index among ties."""
    return a if a[0] < b[0] or (a[0] == b[0] and a[1] <= b[1]) else b


@kernel
def maxloc(a, b):
    """Reduction op of ``(value, index)`` pairs: the greatest value, the first index among ties."""
    return a if a[0] > b[0] or (a[0] == b[0] and a[1] <= b[1]) else b
