"""Per-device code generation: a kernel body plus a chunk wrapper, as one module text.

The body is the user's function with every view parameter lowered to index arithmetic
on its root array (SPEC §1: views cost no more than hand-written indexing). The wrapper
runs a *chunk* ``[lo, hi)`` of the outermost launch dimension:

- CPU: nested loops calling the body; compiled by Numba with ``nogil`` so any runtime
  thread can execute any chunk.
- GPU: a grid-stride loop over the chunk's flattened indices; compiled by numba-cuda.

The module text keeps the body at its original line numbers so that compiler errors
point at the user's file and line.
"""
from __future__ import annotations

import ast
import dataclasses

from ..errors import KernelError
from .source import KernelSource, SpanEditor

ENTRY = "__hf_entry"
PARALLEL = "__hf_parallel"


@dataclasses.dataclass(frozen=True)
class Generated:
    """A generated module: its text, the body's name, and the entry's parameters."""

    text: str
    body: str
    entry_params: tuple[str, ...]


def data_params(fdef: ast.FunctionDef, ndim: int) -> list[str]:
    return [a.arg for a in fdef.args.args][ndim:]


def expanded(name: str, lowering) -> list[str]:
    """The generated parameters standing for one kernel parameter (a view expands)."""
    if lowering is None:
        return [name]
    return [f"{name}__root", *lowering.param_names]


def generate(src: KernelSource, ndim: int, views: dict, target: str) -> Generated:
    """Module text for ``target`` ('cpu' or 'gpu'); ``views`` maps parameter -> Lowering."""
    fdef = src.function()
    params = [a.arg for a in fdef.args.args]
    if len(params) < ndim:
        raise KernelError(f"kernel {fdef.name!r} takes {len(params)} parameters, fewer than the "
                          f"{ndim} index parameters of a rank-{ndim} launch")
    editor = SpanEditor(src.text)
    unsigned = _unsigned_indices(fdef, ndim, views)
    body = editor.rewrite(fdef, _view_replacer(editor, views, fdef.name, unsigned))
    data = data_params(fdef, ndim)
    entry_params = [p for d in data for p in expanded(d, views.get(d))]
    wrapper = (_cpu_wrapper if target == "cpu" else _gpu_wrapper)(fdef.name, ndim, entry_params)
    head = src.text[: editor.span(fdef)[0]]
    text = src.padded(head + body + "\n\n\n" + wrapper)
    return Generated(text, fdef.name, tuple(entry_params))


def _unsigned_indices(fdef, ndim, views) -> set:
    """ids of the Name nodes that can index unsigned: a launch index the body never
    reassigns, used as a whole component of a subscript of an array parameter.

    Launch indices are never negative, but Numba cannot know it and guards every
    ``x[i]`` against wraparound, which stops vectorisation (3-4x on axpy). Casting such
    an index to uint64 at the subscript is exact.
    """
    params = [a.arg for a in fdef.args.args]
    index, arrays = set(params[:ndim]), set(params[ndim:]) - set(views)
    for node in ast.walk(fdef):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            index.discard(node.id)
    targets = set()
    for node in ast.walk(fdef):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in arrays:
            parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            targets.update(id(p) for p in parts if isinstance(p, ast.Name) and p.id in index)
    return targets


def _view_replacer(editor: SpanEditor, views: dict, kernel_name: str, unsigned: set):
    def replace(node):
        if isinstance(node, ast.arg) and node.arg in views:
            return ", ".join(expanded(node.arg, views[node.arg]))
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in views:
            return _lower_subscript(editor, node, views[node.value.id], replace)
        if id(node) in unsigned:
            return f"__hf_np.uint64({node.id})"
        if isinstance(node, ast.Name) and node.id in views:
            raise KernelError(
                f"kernel {kernel_name!r} line {node.lineno}: view parameter {node.id!r} can only be "
                f"subscripted inside a kernel (pass view.numpy() or the parent array instead)")
        return None

    return replace


def _lower_subscript(editor, node, lowering, replace) -> str:
    rank = lowering.rank
    parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    texts = [editor.rewrite(p, replace) for p in parts]
    if len(parts) == 1 and rank > 1:  # a tuple-valued index variable
        texts = [f"({texts[0]})[{k}]" for k in range(rank)]
    if len(texts) != rank:
        raise KernelError(f"line {node.lineno}: view {node.value.id!r} has rank {rank} but is "
                          f"subscripted with {len(texts)} indices")
    root = f"{node.value.id}__root"
    # Root indices of a valid view are never negative; saying so (unsigned) lets Numba
    # drop its negative-index wraparound check, which otherwise costs 2x on stencils.
    index = lowering.index_source(tuple(f"({t})" for t in texts), cast="__hf_np.uint64")
    return f"{root}[{', '.join(index)}]"


def _index_names(ndim):
    return [f"__i{d}" for d in range(ndim)]


def _cpu_wrapper(body: str, ndim: int, params: list[str]) -> str:
    idx = _index_names(ndim)
    extents = [f"__e{d}" for d in range(1, ndim)]
    head = ", ".join(["__lo", "__hi", *extents, *params])
    lines = [f"def {ENTRY}({head}):"]
    indent = "    "
    for d in range(ndim):
        bound = "range(__lo, __hi)" if d == 0 else f"range(__e{d})"
        lines.append(f"{indent}for {idx[d]} in {bound}:")
        indent += "    "
    lines.append(f"{indent}{body}({', '.join(idx + params)})")
    # The whole launch over all cores at once, through Numba's threading layer: the
    # rows cut into ``__parts`` even pieces, each run by the chunk entry above.
    tail = ", ".join(["__rows", *extents, *params])
    lines += ["", "", f"def {PARALLEL}(__parts, {tail}):",
              "    for __p in __hf_prange(__parts):",
              f"        {ENTRY}(__rows * __p // __parts, __rows * (__p + 1) // __parts, "
              f"{', '.join([*extents, *params])})"]
    return "\n".join(lines) + "\n"


def _gpu_wrapper(body: str, ndim: int, params: list[str]) -> str:
    if ndim == 2:
        return _gpu_wrapper_2d(body, params)
    idx = _index_names(ndim)
    extents = [f"__e{d}" for d in range(1, ndim)]
    head = ", ".join(["__lo", "__hi", *extents, *params])
    inner = " * ".join(extents) or "1"
    lines = [
        f"def {ENTRY}({head}):",
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
    lines.append(f"        {body}({', '.join(idx + params)})")
    lines.append("        __k += __step")
    return "\n".join(lines) + "\n"


def _gpu_wrapper_2d(body: str, params: list[str]) -> str:
    """Rank 2: a 2-D grid, columns on x (coalesced), rows on y; no index division."""
    call = f"{body}(__i0, __i1, {', '.join(params)})" if params else f"{body}(__i0, __i1)"
    head = ", ".join(["__lo", "__hi", "__e1", *params])
    return "\n".join([
        f"def {ENTRY}({head}):",
        "    __c0 = __hf_cuda.blockIdx.x * __hf_cuda.blockDim.x + __hf_cuda.threadIdx.x",
        "    __cs = __hf_cuda.gridDim.x * __hf_cuda.blockDim.x",
        "    __i0 = __lo + __hf_cuda.blockIdx.y * __hf_cuda.blockDim.y + __hf_cuda.threadIdx.y",
        "    __rs = __hf_cuda.gridDim.y * __hf_cuda.blockDim.y",
        "    while __i0 < __hi:",
        "        __i1 = __c0",
        "        while __i1 < __e1:",
        f"            {call}",
        "            __i1 += __cs",
        "        __i0 += __rs",
    ]) + "\n"
