"""Generated kernels behind ``reduce``, ``scan`` and ``sort`` (compiled paths).

Each function here writes the source of a hetflow kernel for one rank (and axis, op,
accumulator type) and builds it with ``Kernel.from_source``; the binary op (or sort
key) is injected as the global ``__hf_op`` (``__hf_key``), so the code repository
compiles it as a device function inlined into the loop. The input ``x`` is a kernel
argument, so a view lowers to index arithmetic on its root: nothing is materialised.

The accumulator type appears in the text (``__hf_np.float64(...)``), never only in a
global, so that two accumulator types never share a source hash, hence an executable.

Block kernels cut the input, read in C order as a flat sequence, into contiguous
blocks: block ``b`` covers flat indices ``[b*block, min((b+1)*block, size))``. They walk
a block row segment by row segment, dividing once per row rather than per element.
"""
from __future__ import annotations

import functools
import textwrap

import numpy as np

from ..kernels import Kernel


def _idx(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{d}" for d in range(n)]


def _dims(rank: int) -> list[str]:
    """Scalar parameters d1..d{rank-1}: the extents a flat index is decomposed with."""
    return [f"d{d}" for d in range(1, rank)]


def _decompose(flat: str, names: list[str], indent: str, prefix: str = "") -> list[str]:
    """Lines setting ``names`` (C order, extents d1..) to the multi-index of ``flat``
    (the temporary and the extents named with ``prefix``)."""
    n = len(names)
    if n == 1:
        return [f"{indent}{names[0]} = {flat}"]
    t = f"{prefix}t"
    lines = [f"{indent}{t} = {flat}"]
    for d in range(n - 1, 0, -1):
        lines.append(f"{indent}{names[d]} = {t} % {prefix}d{d}")
        lines.append(f"{indent}{t} = {t} // {prefix}d{d}")
    lines.append(f"{indent}{names[0]} = {t}")
    return lines


def _cast(acc: str | None, expr: str) -> str:
    return f"__hf_np.{acc}({expr})" if acc else expr


def _row_loop(rank: int, start: str, segment) -> list[str]:
    """Lines visiting every flat index in ``[start, hi)`` one row segment at a time:
    ``segment(j0, j1, indent)`` gives the lines for columns ``[j0, j1)`` of the row
    whose index is ``i0..`` (rank 1: one segment)."""
    if rank == 1:
        return segment(start, "hi", "    ")
    last = f"d{rank - 1}"
    return [
        f"    k = {start}",
        "    while k < hi:",
        f"        r = k // {last}",
        f"        j0 = k - r * {last}",
        f"        j1 = min({last}, j0 + (hi - k))",
        *_decompose("r", _idx("i", rank - 1), "        "),
        *segment("j0", "j1", "        "),
        "        k += j1 - j0",
    ]


def _loop(body: list[str]):
    """A segment running ``body`` (which sees the column ``j``) in index order."""
    return lambda j0, j1, ind: [f"{ind}for j in range({j0}, {j1}):", *(f"{ind}    {b}" for b in body)]


def _fold(element, acc: str | None, lanes: bool):
    """A segment folding ``element(col)`` for its columns into ``acc``.

    With ``lanes`` (commutative ops only) four interleaved partial folds run side by
    side: the op's latency, not its throughput, bounds a single chain (4x on sums)."""
    def segment(j0, j1, ind):
        tail = [f"{ind}for jj in range(j, {j1}):", f"{ind}    acc = __hf_op(acc, {element('jj')})"]
        if not lanes:
            return [f"{ind}j = {j0}", *tail]
        return [
            f"{ind}if {j1} - ({j0}) >= 8:",
            *(f"{ind}    l{q} = {_cast(acc, element(f'{j0} + {q}'))}" for q in range(4)),
            f"{ind}    j = {j0} + 4",
            f"{ind}    while j + 4 <= {j1}:",
            *(f"{ind}        l{q} = __hf_op(l{q}, {element(f'j + {q}')})" for q in range(4)),
            f"{ind}        j += 4",
            f"{ind}    acc = __hf_op(acc, __hf_op(__hf_op(l0, l1), __hf_op(l2, l3)))",
            f"{ind}else:",
            f"{ind}    j = {j0}",
            *tail,
        ]
    return segment


def _at(names: list[str], array: str = "x") -> str:
    return f"{array}[{', '.join(names)}]"


def _element(rank: int, col: str = "j") -> str:
    """``x`` at the row index i0.. and column ``col``."""
    return _at(_idx("i", rank - 1) + [col])


def _flat(rank: int) -> str:
    return "j" if rank == 1 else f"r * d{rank - 1} + j"


def _build(name: str, lines: list[str], globals_: dict, **options) -> Kernel:
    return Kernel.from_source(name, "\n".join(lines) + "\n", {"__hf_np": np, **globals_}, **options)


@functools.lru_cache(maxsize=256)
def reduce_blocks(rank: int, op: Kernel, acc: str | None, lanes: bool = False) -> Kernel:
    """``partial[b]`` = the fold of block ``b`` of rank-``rank`` ``x``: in index order, or
    with ``lanes`` (commutative ops) in four interleaved chains."""
    params = ["b", "x", "size", "block", *_dims(rank), "partial"]
    first = _idx("f", rank)
    lines = [
        f"def reduce_blocks({', '.join(params)}):",
        "    lo = b * block",
        "    hi = min(lo + block, size)",
        *_decompose("lo", first, "    "),
        f"    acc = {_cast(acc, _at(first))}",
        *_row_loop(rank, "lo + 1", _fold(lambda c: _element(rank, c), acc, lanes)),
        "    partial[b] = acc",
    ]
    return _build(f"hf_reduce_{op.name}_{rank}d", lines, {"__hf_op": op})


@functools.lru_cache(maxsize=256)
def reduce_strided(rank: int, op: Kernel, acc: str | None) -> Kernel:
    """``partial[b]`` = the fold of flat indices ``b, b + stride, b + 2*stride, ...``.

    For commutative ops on a GPU: neighbouring threads read neighbouring elements
    (coalesced), at the price of combining out of index order."""
    params = ["b", "x", "size", "stride", *_dims(rank), "partial"]
    idx = _idx("i", rank)
    lines = [
        f"def reduce_strided({', '.join(params)}):",
        *_decompose("b", idx, "    "),
        f"    acc = {_cast(acc, _at(idx))}",
        "    k = b + stride",
        "    while k < size:",
        *_decompose("k", idx, "        "),
        f"        acc = __hf_op(acc, {_at(idx)})",
        "        k += stride",
        "    partial[b] = acc",
    ]
    return _build(f"hf_reduce_strided_{op.name}_{rank}d", lines, {"__hf_op": op})


def _at_axis(rank: int, axis: int, k: str, array: str = "x") -> str:
    """``array`` at the outer indices o0.. with ``k`` inserted at ``axis``."""
    idx = _idx("o", rank - 1)
    idx.insert(axis, k)
    return _at(idx, array)


@functools.lru_cache(maxsize=256)
def reduce_axis(rank: int, axis: int, op: Kernel, acc: str | None, lanes: bool = False) -> Kernel:
    """``out[o]`` = the fold of ``x`` along ``axis`` at the other indices ``o``."""
    outer = _idx("o", rank - 1)
    lines = [
        f"def reduce_axis({', '.join(outer + ['x', 'n', 'out'])}):",
        f"    acc = {_cast(acc, _at_axis(rank, axis, '0'))}",
        *_fold(lambda c: _at_axis(rank, axis, c), acc, lanes)("1", "n", "    "),
        f"    out[{', '.join(outer)}] = acc",
    ]
    return _build(f"hf_reduce_{op.name}_{rank}d_axis{axis}", lines, {"__hf_op": op})


@functools.lru_cache(maxsize=256)
def scan_blocks(rank: int, op: Kernel, acc: str | None, inclusive: bool, rows: bool = False) -> Kernel:
    """Second pass of the block scan: block ``b`` starts from ``carry[b-1]`` (the fold of
    all earlier blocks) and writes its prefixes to the flat ``out`` (``rows``: to row
    ``b`` of a 2-D ``out``). Exclusive scans start block 0 from ``init`` and write each
    prefix before combining the element."""
    params = ["b", "x", "size", "block", *_dims(rank), "carry", *([] if inclusive else ["init"]), "out"]
    first = _idx("f", rank)
    at = (lambda flat: f"out[b, {flat} - lo]") if rows else (lambda flat: f"out[{flat}]")  # noqa: E731
    lines = [
        f"def scan_blocks({', '.join(params)}):",
        "    lo = b * block",
        "    hi = min(lo + block, size)",
        "    start = lo",
        "    if b == 0:",
    ]
    if inclusive:
        lines += [*_decompose("lo", first, "        "),
                  f"        acc = {_cast(acc, _at(first))}",
                  f"        {at('lo')} = acc",
                  "        start = lo + 1"]
        body = [f"acc = __hf_op(acc, {_element(rank)})", f"{at(_flat(rank))} = acc"]
    else:
        lines.append(f"        acc = {_cast(acc, 'init')}")
        body = [f"{at(_flat(rank))} = acc", f"acc = __hf_op(acc, {_element(rank)})"]
    lines += ["    else:",
              f"        acc = {_cast(acc, 'carry[b - 1]')}",
              *_row_loop(rank, "start", _loop(body))]
    kind = "inclusive" if inclusive else "exclusive"
    return _build(f"hf_scan_{kind}_{op.name}_{rank}d{'_rows' if rows else ''}", lines, {"__hf_op": op})


@functools.lru_cache(maxsize=256)
def scan_axis(rank: int, axis: int, op: Kernel, acc: str | None, inclusive: bool) -> Kernel:
    """The scan of ``x`` along ``axis``, one sequential scan per index of the other axes."""
    outer = _idx("o", rank - 1)
    params = outer + ["x", "n", *([] if inclusive else ["init"]), "out"]
    out_at = _at_axis(rank, axis, "k", "out")
    if inclusive:
        body = [f"    acc = {_cast(acc, _at_axis(rank, axis, '0'))}",
                f"    {_at_axis(rank, axis, '0', 'out')} = acc",
                "    for k in range(1, n):",
                f"        acc = __hf_op(acc, {_at_axis(rank, axis, 'k')})",
                f"        {out_at} = acc"]
    else:
        body = [f"    acc = {_cast(acc, 'init')}",
                "    for k in range(n):",
                f"        {out_at} = acc",
                f"        acc = __hf_op(acc, {_at_axis(rank, axis, 'k')})"]
    kind = "inclusive" if inclusive else "exclusive"
    return _build(f"hf_scan_{kind}_{op.name}_{rank}d_axis{axis}",
                  [f"def scan_axis({', '.join(params)}):", *body], {"__hf_op": op})


@functools.lru_cache(maxsize=64)
def copy(rank: int) -> Kernel:
    """``out[i] = x[i]``: materialises a view into a new array, on the device."""
    idx = ", ".join(_idx("i", rank))
    return _build(f"hf_copy_{rank}d", [f"def copy({idx}, x, out):", f"    out[{idx}] = x[{idx}]"], {})


@functools.lru_cache(maxsize=64)
def combine(op: Kernel) -> Kernel:
    """``out[i] = op(a[i], b[i])``: arrays combined element by element by a binary op of
    the call sites' form (a collective's segments by a user's ``reduce`` op)."""
    return _build(f"hf_combine_{op.name}", ["def combine(i, a, b, out):", "    out[i] = __hf_op(a[i], b[i])"],
                  {"__hf_op": op})


@functools.lru_cache(maxsize=256)
def keys(rank: int, key: Kernel) -> Kernel:
    """``out[i] = key(x[i])``: the sort keys of every element."""
    idx = ", ".join(_idx("i", rank))
    return _build(f"hf_keys_{key.name}_{rank}d",
                  [f"def keys({idx}, x, out):", f"    out[{idx}] = __hf_key(x[{idx}])"], {"__hf_key": key})


# -- map-reduce ---------------------------------------------------------------------------------
# The user's kernel becomes a closure ``__hf_map`` over the index inside the block kernel,
# whose parameters carry the user's own names: views among them are then lowered in its
# body as in any kernel. Every name the block kernel adds starts with ``__hf_``, so that
# none can shadow one of the user's.
def kernel_body(kernel: Kernel) -> str:
    """The statements of ``kernel``'s function, dedented (a body on the ``def`` line too)."""
    fdef, lines = kernel.definition, kernel.source.text.splitlines()
    first = fdef.body[0]
    text = [" " * first.col_offset + lines[first.lineno - 1][first.col_offset:],
            *lines[first.lineno:fdef.end_lineno]]
    return textwrap.dedent("\n".join(text))


def _fold_range(start: str, stop: str, row: list[str], lanes: bool, ind: str, cast) -> list[str]:
    """Lines folding ``__hf_map(*row, j)`` for ``j`` in ``[start, stop)`` into ``__hf_acc``,
    with ``lanes`` in four interleaved chains where the range has eight or more."""
    at = lambda j: f"__hf_map({', '.join([*row, j])})"  # noqa: E731
    tail = [f"{ind}while __hf_j < {stop}:", f"{ind}    __hf_acc = __hf_op(__hf_acc, {at('__hf_j')})",
            f"{ind}    __hf_j += 1"]
    if not lanes:
        return [f"{ind}__hf_j = {start}", *tail]
    return [
        f"{ind}__hf_j = {start}",
        f"{ind}if {stop} - __hf_j >= 8:",
        *(f"{ind}    __hf_l{q} = {cast(at(f'__hf_j + {q}'))}" for q in range(4)),
        f"{ind}    __hf_j += 4",
        f"{ind}    while __hf_j + 4 <= {stop}:",
        *(f"{ind}        __hf_l{q} = __hf_op(__hf_l{q}, {at(f'__hf_j + {q}')})" for q in range(4)),
        f"{ind}        __hf_j += 4",
        f"{ind}    __hf_acc = __hf_op(__hf_acc, __hf_op(__hf_op(__hf_l0, __hf_l1), __hf_op(__hf_l2, __hf_l3)))",
        *tail,
    ]


def _map_fold(rank: int, fields: int, acc: str | None, mode: str) -> list[str]:
    """Lines folding ``__hf_map`` over the block's flat indices into ``__hf_acc``: for
    ``mode`` 'ordered' or 'lanes' (four interleaved chains per row segment) the range
    ``[__hf_lo, __hf_hi)``; for 'strided', ``__hf_b, __hf_b + __hf_block, ...``."""
    at = lambda names: f"__hf_map({', '.join(names)})"  # noqa: E731
    cast = (lambda e: _cast(acc, e)) if fields == 0 else (lambda e: e)
    idx = _idx("__hf_i", rank)
    if mode == "strided":
        return [*_decompose("__hf_b", idx, "    ", "__hf_"), f"    __hf_acc = {cast(at(idx))}",
                "    __hf_k = __hf_b + __hf_block",
                "    while __hf_k < __hf_size:",
                *_decompose("__hf_k", idx, "        ", "__hf_"),
                f"        __hf_acc = __hf_op(__hf_acc, {at(idx)})",
                "        __hf_k += __hf_block"]
    lines = [*_decompose("__hf_lo", idx, "    ", "__hf_"), f"    __hf_acc = {cast(at(idx))}"]
    lanes = mode == "lanes"
    if rank == 1:
        return lines + _fold_range("__hf_lo + 1", "__hf_hi", [], lanes, "    ", cast)
    last = f"__hf_d{rank - 1}"
    return lines + [  # row segment by row segment: one division per row, not per element
        "    __hf_k = __hf_lo + 1",
        "    while __hf_k < __hf_hi:",
        f"        __hf_r = __hf_k // {last}",
        f"        __hf_j0 = __hf_k - __hf_r * {last}",
        "        __hf_j1 = __hf_j0 + (__hf_hi - __hf_k)",
        f"        if __hf_j1 > {last}:",
        f"            __hf_j1 = {last}",
        *_decompose("__hf_r", idx[:-1], "        ", "__hf_"),
        *(line for v in ["__hf_j0", *idx[:-1]] for line in (f"        if {v} < 0:  # never: as __hf_lo's",
                                                              f"            {v} = 0")),
        *_fold_range("__hf_j0", "__hf_j1", idx[:-1], lanes, "        ", cast),
        "        __hf_k += __hf_j1 - __hf_j0",
    ]


@functools.lru_cache(maxsize=256)
def map_blocks(kernel: Kernel, rank: int, op: Kernel, fields: int, acc: str | None, mode: str) -> Kernel:
    """``p[b]`` = the fold by ``op`` of ``kernel``'s values at the flat indices of block
    ``b`` (a rank-``rank`` extent read in C order); ``fields``: 0 for a scalar value, else
    the length of the tuple it returns, stored field by field in ``p0``, ``p1``, ...
    ``mode`` (see ``_map_fold``): 'ordered'; for commutative ops 'lanes' (CPU)
    or 'strided' (GPU: neighbouring threads read neighbouring elements), where
    ``block`` is the stride."""
    index, data = kernel.params[:rank], kernel.params[rank:]
    outs = [f"__hf_p{f}" for f in range(max(fields, 1))]
    params = ["__hf_b", *data, "__hf_size", "__hf_block", *(f"__hf_d{d}" for d in range(1, rank)), *outs]
    store = (["    __hf_p0[__hf_b] = __hf_acc"] if fields == 0 else
             [f"    __hf_p{f}[__hf_b] = __hf_acc[{f}]" for f in range(fields)])
    bounds = [] if mode == "strided" else [
        "    __hf_lo = __hf_b * __hf_block",
        # Never true: it tells the compiler that the indices are not negative, so that
        # no access tests for a negative index (while loops keep that knowledge; an
        # assignment rather than a return keeps the loops single-exit).
        "    if __hf_lo < 0:",
        "        __hf_lo = 0",
        # No call is handed a parameter: the access analysis would count it as written.
        "    __hf_hi = __hf_lo + __hf_block",
        "    if __hf_hi > __hf_size:",
        "        __hf_hi = __hf_size",
    ]
    lines = [
        f"def map_blocks({', '.join(params)}):",
        f"    def __hf_map({', '.join(index)}):",
        textwrap.indent(kernel_body(kernel), "        "),
        *bounds,
        *_map_fold(rank, fields, acc, mode),
        *store,
    ]
    # the kernel's checked mode and fast-math flags hold for its body here too
    return _build(f"hf_mapreduce_{kernel.name}_{op.name}_{rank}d_{mode}", lines,
                  {**kernel.namespace(), "__hf_op": op}, boundscheck=kernel.boundscheck, fastmath=kernel.fastmath)


@functools.lru_cache(maxsize=64)
def gather(fields: int) -> Kernel:
    """``gather(i, p0, ...)``: the partial result at ``i``, a map kernel folding partials."""
    ps = [f"p{f}" for f in range(max(fields, 1))]
    value = "p0[i]" if fields == 0 else "(" + "".join(f"{p}[i], " for p in ps) + ")"
    return _build(f"hf_gather_{fields}", [f"def gather(i, {', '.join(ps)}):", f"    return {value}"], {})
