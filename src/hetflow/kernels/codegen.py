"""Per-device chunk entries: the generated code that calls a kernel over a chunk.

The kernel itself is compiled from its function object (bytecode), never from its
text; views reach it as values of :mod:`.viewtypes`, whose subscripts Numba lowers.
The entry runs a *chunk* ``[lo, hi)`` of the outermost launch dimension:

- CPU: nested loops calling the kernel (``__hf_body``), compiled by Numba with
  ``nogil`` so any runtime thread can execute any chunk, and ``__hf_parallel``, rows
  ``[lo, hi)`` over all cores through Numba's threading layer.
- GPU: a grid-stride loop over the chunk's flattened indices (a 2-D grid for rank 2).

The entry takes each view as its root array and its lowering's integers (what the
launch passes), builds the view values once (``__hf_view<k>``) and calls the kernel
with explicit arguments. In checked mode every array parameter is such a value, and the
entry takes the error record (``__hf_err``) last.
"""
from __future__ import annotations

import dataclasses

from . import checks

ENTRY = "__hf_entry"
PARALLEL = "__hf_parallel"
PIECE = "__hf_piece"
ROWS = "__hf_rows"
BODY = "__hf_body"
NONNEG = "__hf_nonneg"


@dataclasses.dataclass(frozen=True)
class Generated:
    """A generated entry module."""

    text: str


def expanded(name: str, lowering) -> list[str]:
    """The entry parameters standing for one kernel parameter (a view expands)."""
    if lowering is None:
        return [name]
    if lowering.root_name is not None:  # the root comes with another view (Lowering.sharing)
        return list(lowering.param_names)
    return [f"{name}__root", *lowering.param_names]


def constructor(k: int) -> str:
    """The name the entry calls to build the value of data parameter ``k``."""
    return f"__hf_view{k}"


def generate(ndim: int, data: list, target: str, checked: bool = False) -> Generated:
    """The entry module for ``target`` ('cpu' or 'gpu'). ``data[k]`` says how data
    parameter ``k`` arrives: None (passed as it is) or (its number of lowering
    integers, how they pack into its value: :func:`.viewtypes.packing`, the data
    parameter whose root it reads: ``k`` itself unless another view passes it), the
    value built by ``constructor(k)``."""
    params, setup, args = [], [], []
    err = checks.ERR if checked else "0"
    for k, how in enumerate(data):
        name = f"__a{k}"
        if how is None:
            params.append(name)
            args.append(name)
            continue
        nparams, packing, root = how
        ints = [f"{name}_p{j}" for j in range(nparams)]
        params += [f"{name}_root"] * (root == k) + ints
        sums = [" + ".join([str(const)] * bool(const) + [ints[j] for j in added]) or "0"
                for const, added in packing]
        packed = f"({', '.join(sums)}{',' if len(sums) == 1 else ''})"
        setup.append(f"{name}_v = {constructor(k)}(__a{root}_root, {packed}, {k}, {err})")
        args.append(f"{name}_v")
    if err != "0":
        params.append(err)
    wrapper = _cpu_wrapper if target == "cpu" else _gpu_wrapper
    return Generated(wrapper(ndim, params, setup, args))


def _index_names(ndim):
    return [f"__i{d}" for d in range(ndim)]


def _call(idx, args) -> str:
    return f"{BODY}({', '.join([f'{NONNEG}({i})' for i in idx] + args)})"


GROUP = 24  # parameters per tuple handed to a piece of the parallel entry (_cpu_wrapper)


def _cpu_wrapper(ndim: int, params: list, setup: list, args: list) -> str:
    idx = _index_names(ndim)
    extents = [f"__e{d}" for d in range(1, ndim)]
    head = ", ".join(["__lo", "__hi", *extents, *params])
    lines = [f"def {ENTRY}({head}):"] + [f"    {s}" for s in setup]
    indent = "    "
    for d in range(ndim):
        bound = "range(__lo, __hi)" if d == 0 else f"range(__e{d})"
        lines.append(f"{indent}for {idx[d]} in {bound}:")
        indent += "    "
    lines.append(f"{indent}{_call(idx, args)}")
    # Rows [lo, hi) over all cores at once, through Numba's threading layer (a whole
    # launch, or a co-executed loop's CPU chunk): cut into ``__parts`` even pieces, each
    # run by the chunk entry above. Numba deals each thread a fixed share of the
    # ``prange``: piece ``p`` runs on the thread that iteration ``p`` falls to, as a
    # hand-written ``prange`` would (the same rows on the same thread launch after
    # launch). With ``__claim``, each iteration instead claims pieces from a shared
    # counter (``__hf_claim``, an atomic add) until none is left, so the threads take
    # pieces as they come free: one whose core is shared (by a GPU worker spinning in a
    # wait on its stream, another process) delays only the pieces it claimed, not the
    # whole range (a co-executed loop's chunks, which move between workers anyway).
    # Numba's threads lose what a piece raises (only the calling thread's comes out), so
    # each piece catches it, and the entry returns the first piece that raised (-1:
    # none), whose rows the runtime runs again to raise it.
    #
    # A piece's rows run in ROWS, the entry's loops over the parameters in tuples of at
    # most GROUP: Python compiles a call of more than 30 arguments (a kernel of many views)
    # as a list turned into a tuple (LIST_TO_TUPLE), an op-code Numba refuses. (The call
    # stays inside the piece's ``try``: loops inside it lose a raise on Numba's threads.)
    tail = ", ".join(["__lo", "__hi", *extents, *params])
    groups = [params[k:k + GROUP] for k in range(0, len(params), GROUP)]
    names = [f"__g{k}" for k in range(len(groups))]
    grouped = ", ".join(["__lo", "__hi", *extents, *names])
    piece = (f"{PIECE}(__lo + (__hi - __lo) * __p // __parts, __lo + (__hi - __lo) * (__p + 1) // __parts, "
             f"{', '.join([*extents, *names])})")
    lines += ["", "", f"def {ROWS}({grouped}):"] + [f"    {', '.join(g)}, = {n}" for g, n in zip(groups, names)] + [
              *lines[1:],
              "", "", f"def {PIECE}({grouped}):",
              "    try:",
              f"        {ROWS}({grouped})",
              "    except Exception:",
              "        return True",
              "    return False",
              "", "", f"def {PARALLEL}(__parts, __claim, {tail}):"] + [
              f"    {n} = ({', '.join(g)},)" for g, n in zip(groups, names)] + [
              "    __failed = __hf_np.zeros(__parts, __hf_np.bool_)",
              "    if __claim:",
              "        __next = __hf_np.zeros(1, __hf_np.int64)",
              "        for __t in __hf_prange(__parts):",
              "            __p = __hf_claim(__next, 0, 1)",
              "            while __p < __parts:",
              f"                __failed[__p] = {piece}",
              "                __p = __hf_claim(__next, 0, 1)",
              "    else:",
              "        for __p in __hf_prange(__parts):",
              f"            __failed[__p] = {piece}",
              "    for __p in range(__parts):",
              "        if __failed[__p]:",
              "            return __p",
              "    return -1"]
    return "\n".join(lines) + "\n"


def _gpu_wrapper(ndim: int, params: list, setup: list, args: list) -> str:
    if ndim == 2:
        return _gpu_wrapper_2d(params, setup, args)
    idx = _index_names(ndim)
    extents = [f"__e{d}" for d in range(1, ndim)]
    head = ", ".join(["__lo", "__hi", *extents, *params])
    inner = " * ".join(extents) or "1"
    lines = [f"def {ENTRY}({head}):"] + [f"    {s}" for s in setup] + [
        "    __inner = " + inner,
        "    __k = __lo * __inner + __hf_cuda.grid(1)",
        "    __stop = __hi * __inner",
        "    __step = __hf_cuda.gridsize(1)",
        "    while __k < __stop:",
    ]
    # Decompose the flat index, outermost dimension first.
    rest = "__k"
    for d in range(ndim - 1):
        stride = " * ".join(extents[d:])
        lines.append(f"        {idx[d]} = {rest} // ({stride})")
        lines.append(f"        __r{d} = {rest} - {idx[d]} * ({stride})")
        rest = f"__r{d}"
    lines.append(f"        {idx[ndim - 1]} = {rest}")
    lines.append(f"        {_call(idx, args)}")
    lines.append("        __k += __step")
    return "\n".join(lines) + "\n"


def _gpu_wrapper_2d(params: list, setup: list, args: list) -> str:
    """Rank 2: a 2-D grid, columns on x (coalesced; the grid covers every column, see
    runtime.gpu.launch_config), rows on y striding; no index division. A loop over
    columns too, never taken twice, cost 20% of a 4096^2 stencil on an H100. The x
    threads start ``__sx`` columns early, so that warps store aligned rows of the
    written array (runtime.gpu.column_shift)."""
    head = ", ".join(["__lo", "__hi", "__e1", "__sx", *params])
    return "\n".join([f"def {ENTRY}({head}):"] + [f"    {s}" for s in setup] + [
        "    __i1 = __hf_cuda.blockIdx.x * __hf_cuda.blockDim.x + __hf_cuda.threadIdx.x - __sx",
        "    __i0 = __lo + __hf_cuda.blockIdx.y * __hf_cuda.blockDim.y + __hf_cuda.threadIdx.y",
        "    __rs = __hf_cuda.gridDim.y * __hf_cuda.blockDim.y",
        "    if 0 <= __i1 < __e1:",
        "        while __i0 < __hi:",
        f"            {_call(['__i0', '__i1'], args)}",
        "            __i0 += __rs",
    ]) + "\n"
