"""What the ``scan`` and ``sort`` call sites (SPEC §1 "Call sites", :mod:`hetflow.callsites`) run.

Both write a new array and never modify their operand.

``scan``: built-in ops over a NumPy array on the CPU run NumPy's ``accumulate``; sum
and prod over a CuPy array on a GPU run CuPy's ``cumsum``/``cumprod``. Everything else
is compiled: a scan along an axis runs one sequential scan per index of the other
axes, in parallel (along axis 0 those scans run down the columns, writing every row,
so several devices, which split a launch by rows, cannot share them: the fastest
runs the scan alone); a scan of all elements (``axis=None``, C order) is the classic
two-pass block scan — fold each block (``reductions.fold_blocks``), scan the block
totals, then rescan each block from the total of the blocks before it.

``sort``: the ordering runs in NumPy for host data — its fastest sort wherever that
gives the stable order (integers; 1-D floats, with equal-but-distinct zeros and NaNs put
back in input order), its stable sort elsewhere — and in CuPy (stable) for GPU data.
Keys, and the copy of a view, are generated kernels run on the device.
"""
from __future__ import annotations

import math

import numba
import numpy as np
from numba.core.errors import NumbaError
from numba.np.numpy_support import as_dtype

from ..errors import ArgumentTypeError, KernelCompileError
from ..index import views as _views
from ..index.arrays import array_module
from ..kernels import Kernel
from ..platform.devices import get_device
from ..platform.repository import repository
from . import binops, blockgen
from .coexec import fastest_device
from .forall import forall
from .launch import coherent, is_device_array
from .reductions import (block_plan, check_identity, compiled_operand, current_gpu, element, fold_blocks, folder,
                         normalize_axis, operand, planner, targets)


# -- scan ---------------------------------------------------------------------------------
def scan(x, op, axis=None, inclusive=True, device=None, *, identity=None):
    """:func:`hetflow.scan` (which documents it), run now."""
    op = binops.resolve(op, commutative=False)  # prefixes are built strictly in index order
    inclusive = binops.flag(inclusive, "inclusive", "scan")
    x = operand(x, "scan")
    dtype = np.dtype(x.dtype)
    op.check(dtype)
    rank = len(x.shape)
    axis = normalize_axis(axis, rank, "scan")
    devs = targets(device, x, "scan")
    if axis == 0 and rank > 1 and len(devs) > 1:
        devs = (fastest_device(devs),)  # rows cannot split its column scans
    with current_gpu(devs):  # temporaries and results on the GPU the launches run on
        init = scan_init(op, dtype, inclusive, identity)
        xp = array_module(_views.root_of(x))
        if rank == 0:
            out = xp.empty(1, op.result_dtype(dtype))
            out[0] = element(x) if inclusive else init
            return out
        if op.builtin and not _views.is_view(x) and len(devs) == 1:
            out = _library_scan(x, op, dtype, axis, inclusive, init, devs[0])
            if out is not None:
                return out
        x = compiled_operand(x, devs, "scan")
        dtype = np.dtype(x.dtype)
        res, acc = op.result_dtype(dtype), op.acc_dtype(dtype)
        if axis is None or rank == 1:
            size = math.prod(x.shape)
            if not size:
                return xp.empty(0, res)
            return _scan_flat(x, op, acc, res, inclusive, init, devs, xp)
        out = xp.empty(x.shape, res)
        if out.size:
            cast = acc.name if acc != dtype else None
            outer = x.shape[:axis] + x.shape[axis + 1:]
            kernel = blockgen.scan_axis(rank, axis, op.kernel, cast, inclusive)
            forall(outer, kernel, x, x.shape[axis], *([] if inclusive else [init]), out, device=devs)
        return out


def scan_init(op, dtype: np.dtype, inclusive: bool, identity):
    """What a scan by ``op`` of elements of ``dtype`` starts from: the op's identity (a
    built-in's own, or ``identity=`` checked by :func:`reductions.check_identity`), or
    None for an inclusive scan with none; an exclusive scan with a user op needs one."""
    identity = check_identity(op, identity, dtype, "scan")
    if op.builtin:
        return None if inclusive else op.identity(dtype)
    if identity is None and not inclusive:
        raise ArgumentTypeError(f"scan: an exclusive scan with the user op {op.name!r} needs its "
                                f"identity element: pass identity=")
    return identity


def _scan_flat(x, op, acc, res, inclusive, init, devs, xp):
    """The block scan of all of ``x`` (C order, size > 0) as a new 1-D array of ``res``.

    Several devices co-execute both passes over the blocks; the second writes block
    ``b`` into row ``b`` of a (blocks, block) array, so that each block is written at
    its launch index (what co-execution splits by), and the result is its first
    ``size`` elements. The block totals are scanned in between, on one device."""
    shape = tuple(x.shape)
    size = math.prod(shape)
    nblocks, block = block_plan(size, planner(devs))
    if nblocks > 1:
        totals, block = fold_blocks(x, op, acc, devs, xp)  # the same blocks
        carry = _scan_flat(totals, op, acc, acc, True, None, folder(devs), xp)
    else:
        carry = xp.empty(1, acc)  # block 0 never reads it
    rows = len(devs) > 1
    out = xp.empty((carry.shape[0], block) if rows else size, res)
    cast = acc.name if acc != np.dtype(x.dtype) else None
    kernel = blockgen.scan_blocks(len(shape), op.kernel, cast, inclusive, rows)
    forall(carry.shape[0], kernel, x, size, block, *shape[1:], carry,
           *([] if inclusive else [init]), out, device=devs)
    return out.reshape(-1)[:size] if rows else out


_CUPY_SCANS = {"sum": "cumsum", "prod": "cumprod"}


def _library_scan(x, op, dtype, axis, inclusive, init, dev):
    """NumPy / CuPy's scan of an array, or None where the compiled path runs."""
    res = op.result_dtype(dtype)
    if dev.kind == "cpu":
        x = np.asarray(x)  # a Buffer: its current host copy, which reshapes
        if axis is None:
            x, axis = x.reshape(-1), 0
        ufunc = op.ufunc(dtype)
        if inclusive:
            return ufunc.accumulate(x, axis=axis, dtype=res)
        out = np.empty(x.shape, res)
        head = (slice(None),) * axis
        out[head + (slice(0, 1),)] = init
        if x.shape[axis] > 1:  # out[k] = inclusive scan at k - 1
            ufunc.accumulate(x[head + (slice(0, -1),)], axis=axis, dtype=res,
                             out=out[head + (slice(1, None),)])
        return out
    name = _CUPY_SCANS.get(op.name)
    if name is None or not is_device_array(x):
        return None
    cp = array_module(x)  # (scan made the GPU current: current_gpu)
    inc = getattr(cp, name)(x, axis=axis, dtype=res)  # axis=None: CuPy's flat (CUB) scan
    if inclusive:
        return inc
    axis = axis or 0
    head = (slice(None),) * axis
    out = cp.empty(inc.shape, res)
    out[head + (slice(0, 1),)] = init
    out[head + (slice(1, None),)] = inc[head + (slice(0, -1),)]
    return out


# -- sort -----------------------------------------------------------------------------------
def sort(x, axis=-1, descending=False, key=None, device=None):
    """:func:`hetflow.sort` (which documents it), run now."""
    descending = binops.flag(descending, "descending", "sort")
    x = operand(x, "sort")
    rank = len(x.shape)
    axis = normalize_axis(axis, rank, "sort")
    devs = targets(device, x, "sort")
    if key is not None or _views.is_view(x):  # generated kernels read it: the keys' or a view's copy
        x = compiled_operand(x, devs, "sort")
    key_dtype = check_elements(np.dtype(x.dtype), key)
    with current_gpu(devs):
        xp = array_module(_views.root_of(x))
        a = _materialized(x, devs, xp)
        if axis is None:
            a, axis = a.reshape(-1), 0
        if key is None:
            return _sorted(xp, a, axis, descending)
        keys = xp.empty(a.shape, key_dtype)
        if a.size:
            forall(a.shape, blockgen.keys(a.ndim, key), a, keys, device=devs)
        perm = _argsorted(xp, keys, axis, descending)
        return xp.take_along_axis(a, perm, axis=axis)


def _materialized(x, devs, xp):
    """``x`` as an array: arrays as they are, a Buffer's current host copy (the ordering
    runs in NumPy, which takes arrays only), views copied on the devices."""
    if coherent(x):
        return np.asarray(x)
    if not _views.is_view(x):
        return x
    out = xp.empty(tuple(x.shape), x.dtype)
    if out.ndim == 0:
        out[()] = element(x)
    elif out.size:
        forall(out.shape, blockgen.copy(out.ndim), x, out, device=devs)
    return out


def _stable(xp):
    return {"kind": "stable"} if xp is np else {}  # CuPy's sorts are always stable


def _sorted(xp, a, axis, descending):
    """A stable sort of the values of ``a`` along ``axis``."""
    if descending:
        # Reverse, sort stably, reverse back: equal elements end in their original order.
        return xp.ascontiguousarray(xp.flip(_sorted(xp, xp.flip(a, axis), axis, False), axis))
    if xp is np and a.dtype.kind in "biu":
        return np.sort(a, axis=axis)  # equal integers are identical: any order is the stable one
    if xp is np and a.dtype.kind == "f" and a.ndim == 1:
        return _float_sort(a)
    return xp.sort(a, axis=axis, **_stable(xp))


def _float_sort(a):
    """NumPy's fastest (unstable) sort, made stable: equal floats are identical but for
    0.0 / -0.0 and NaN payloads, so those two runs are put back in input order (an
    extra pass over ``a`` only when such a run has several elements)."""
    out = np.sort(a)
    lo, hi = np.searchsorted(out, 0.0, "left"), np.searchsorted(out, 0.0, "right")
    if hi - lo > 1:
        out[lo:hi] = a[a == 0]
    if out.size > 1 and np.isnan(out[-2]):  # NaNs sort last
        nan = np.isnan(a)
        out[out.size - np.count_nonzero(nan):] = a[nan]
    return out


def _argsorted(xp, keys, axis, descending):
    if not descending:
        return xp.argsort(keys, axis=axis, **_stable(xp))
    n = keys.shape[axis]
    perm = xp.argsort(xp.flip(keys, axis), axis=axis, **_stable(xp))
    return xp.flip((n - 1) - perm, axis)


def check_elements(dtype: np.dtype | None, key) -> np.dtype | None:
    """The element type of the sort keys of elements of ``dtype``: what ``key`` returns
    for them, or None without a key. ArgumentTypeError for structured elements without
    a key, or a key that is no kernel of one element; ``dtype`` None (not known yet):
    only the key's kind is checked."""
    if key is None:
        if dtype is not None and dtype.names is not None:
            raise ArgumentTypeError("sort: structured elements have no order of their own; pass key=, a kernel "
                                    "returning each element's sort key")
        return None
    if not isinstance(key, Kernel):
        raise ArgumentTypeError(f"sort: key must be a hetflow kernel of one element, not "
                                f"{type(key).__name__} {key!r}; decorate it with @hetflow.kernel")
    if len(key.params) != 1:
        raise ArgumentTypeError(f"sort: key kernel {key.name!r} takes {len(key.params)} parameter(s) "
                                f"({', '.join(key.params)}); a key takes exactly one element")
    # Keys read the elements as compiled code does: in native byte order (compiled_operand).
    return None if dtype is None else _key_dtype(key, dtype.newbyteorder("="))


def _key_dtype(key: Kernel, dtype: np.dtype) -> np.dtype:
    """The element type ``key`` returns for elements of ``dtype`` (compiled to find out)."""
    fn = repository().device_function(key, get_device("cpu0"))
    try:
        args = (numba.from_dtype(dtype),)  # (long double and raw bytes, V, have no Numba type)
        fn.compile(args)
    except (NumbaError, NotImplementedError) as exc:  # (float16: Numba's CPU target has no such type)
        raise KernelCompileError(f"sort: key kernel {key.name!r} does not compile for elements of "
                                 f"dtype {dtype} on cpu0, where keys are typed: "
                                 f"{str(exc).splitlines()[0]}") from None
    returned = fn.overloads[args].signature.return_type
    try:
        kd = as_dtype(returned)
    except NumbaError:  # a tuple, a list...: no NumPy dtype
        kd = None
    if kd is None or kd.names is not None or kd.kind not in "biuf":
        raise ArgumentTypeError(f"sort: key kernel {key.name!r} returns {returned} for elements of dtype "
                                f"{dtype}; a key must be a number (bool, integer or float)")
    return kd
