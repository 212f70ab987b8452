"""Per-device code generation: a kernel body plus a chunk wrapper, as one module text.

The body is the user's function with every view parameter lowered to index arithmetic
on its root array (SPEC §1: views cost no more than hand-written indexing). The wrapper
runs a *chunk* ``[lo, hi)`` of the outermost launch dimension:

- CPU: nested loops calling the body; compiled by Numba with ``nogil`` so any runtime
  thread can execute any chunk.
- GPU: a grid-stride loop over the chunk's flattened indices; compiled by numba-cuda.

The module text keeps the body at its original line numbers so that compiler errors
point at the user's file and line. In checked mode (:mod:`.checks`) every index into an
array parameter is wrapped in a check, and on a GPU each store into one is guarded by
an ``if`` on its line. A kernel whose source cannot be read gets the wrapper alone
(:func:`generate_entry`), calling its function object compiled as the body.
"""
from __future__ import annotations

import ast
import dataclasses

from ..errors import KernelError
from . import checks
from .source import KernelSource, SpanEditor

ENTRY = "__hf_entry"
PARALLEL = "__hf_parallel"
BODY = "__hf_body"


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
    if lowering.root_name is not None:  # the root comes with another view (Lowering.sharing)
        return list(lowering.param_names)
    return [f"{name}__root", *lowering.param_names]


def generate(src: KernelSource, ndim: int, views: dict, target: str, checked: bool = False) -> Generated:
    """Module text for ``target`` ('cpu' or 'gpu'); ``views`` maps parameter -> Lowering;
    ``checked``: every subscript of an array parameter is bounds-checked (:mod:`.checks`)."""
    fdef = src.function()
    params = [a.arg for a in fdef.args.args]
    if len(params) < ndim:
        raise KernelError(f"kernel {fdef.name!r} takes {len(params)} parameters, fewer than the "
                          f"{ndim} index parameters of a rank-{ndim} launch")
    editor = SpanEditor(src.text)
    rewriter = _BodyRewriter(editor, fdef, ndim, views, target, checked)
    body = editor.rewrite(fdef, rewriter.replace)
    data = data_params(fdef, ndim)
    entry_params = [p for d in data for p in expanded(d, views.get(d))]
    err = [checks.ERR] if checked and target == "gpu" else []
    wrapper = (_cpu_wrapper if target == "cpu" else _gpu_wrapper)(fdef.name, ndim, entry_params + err)
    helpers = checks.HELPERS[target][0].strip() + "\n\n\n" if checked else ""
    head = src.text[: editor.span(fdef)[0]]
    text = src.padded(head + body + "\n\n\n" + helpers + wrapper)
    return Generated(text, fdef.name, tuple(entry_params))


def generate_entry(params: tuple[str, ...], ndim: int, target: str) -> Generated:
    """Module text of the entry alone, calling the body ``BODY`` that the repository
    compiles from the kernel's function object (a kernel whose source cannot be read)."""
    data = [f"__a{k}" for k in range(len(params) - ndim)]  # the user's names may clash with ours
    wrapper = (_cpu_wrapper if target == "cpu" else _gpu_wrapper)(BODY, ndim, data)
    return Generated(wrapper, BODY, tuple(data))


class _BodyRewriter:
    """The ``replace`` callback of :meth:`SpanEditor.rewrite` for a kernel body: views
    lowered to root indexing, launch indices made unsigned where exact, and in checked
    mode every index into an array parameter wrapped in a check (:mod:`.checks`)."""

    def __init__(self, editor: SpanEditor, fdef, ndim: int, views: dict, target: str, checked: bool):
        self.editor, self.views, self.name = editor, views, fdef.name
        self.checked, self.gpu_checked = checked, checked and target == "gpu"
        self.position = {p: k for k, p in enumerate(data_params(fdef, ndim))}
        self.last_arg = id(fdef.args.args[-1]) if fdef.args.args else None
        # Checked mode keeps indices signed: a negative one must fail, not wrap to a huge one.
        self.unsigned = set() if checked else _unsigned_indices(fdef, ndim, views)
        self.wrap: dict[int, tuple] = {}  # index node -> (parameter, axis, wrap) to check
        self.guarded: set[int] = set()    # store subscripts an ``if`` guard checks already

    def replace(self, node):
        if id(node) in self.wrap:
            name, axis, wrap = self.wrap.pop(id(node))
            return self._call("__hf_ix", name, name, (self.editor.rewrite(node, self.replace), axis, wrap))
        if isinstance(node, ast.arg):
            return self._arg(node)
        if self.gpu_checked and isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            return self._guarded_store(node)
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
            if node.value.id in self.views:
                return self._view_subscript(node)
            if self.checked and node.value.id in self.position and id(node) not in self.guarded:
                for part, axis, wrap in _tests(node):
                    self.wrap[id(part)] = (node.value.id, axis, wrap)
                return None
        if id(node) in self.unsigned:
            return f"__hf_np.uint64({node.id})"
        if isinstance(node, ast.Name) and node.id in self.views:
            raise KernelError(
                f"kernel {self.name!r} line {node.lineno}: view parameter {node.id!r} can only be "
                f"subscripted inside a kernel (pass view.numpy() or the parent array instead)")
        return None

    def _arg(self, node):
        text = ", ".join(expanded(node.arg, self.views[node.arg])) if node.arg in self.views else None
        if self.gpu_checked and id(node) == self.last_arg:
            return f"{text or node.arg}, {checks.ERR}"
        return text

    def _view_index(self, node):
        """The root array's name and root index texts of a view subscript."""
        low = self.views[node.value.id]
        parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        texts = [self.editor.rewrite(p, self.replace) for p in parts]
        if len(parts) == 1 and low.rank > 1:  # a tuple-valued index variable
            texts = [f"({texts[0]})[{k}]" for k in range(low.rank)]
        if len(texts) != low.rank:
            raise KernelError(f"line {node.lineno}: view {node.value.id!r} has rank {low.rank} but is "
                              f"subscripted with {len(texts)} indices")
        # Root indices of a valid view are never negative; saying so (unsigned) lets Numba
        # drop its negative-index wraparound check, which otherwise costs 2x on stencils.
        cast = None if self.checked else "__hf_np.uint64"
        return low.root_name or f"{node.value.id}__root", list(low.index_source(tuple(f"({t})" for t in texts), cast=cast))

    def _view_subscript(self, node) -> str:
        root, index = self._view_index(node)
        if self.checked and id(node) not in self.guarded:  # 0: a negative root index fails
            index = [self._call("__hf_ix", node.value.id, root, (t, axis, 0)) for axis, t in enumerate(index)]
        return f"{root}[{', '.join(index)}]"

    def _call(self, helper, name, array, test) -> str:
        """``helper`` checking index ``test`` = (text, axis, wrap) into ``array``, the
        array of parameter ``name`` (a view's root array for a view)."""
        text, axis, wrap = test
        err = f", {checks.ERR}" if self.gpu_checked else ""
        return f"{helper}({text}, {array}.shape[{axis}], {wrap}, {self.position[name]}, {axis}{err})"

    def _guarded_store(self, node):
        """GPU: ``if <every index in range>: <the store>``, so a failed store is skipped."""
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        stores = [s for t in targets for s in _stored_subscripts(t, self.position)]
        if not stores:
            return None
        if not self.editor.own_line(node):
            raise KernelError(
                f"kernel {self.name!r} line {node.lineno}: checked mode on a GPU needs each store into "
                f"an array on a line of its own (not after ':' nor beside ';')")
        tests = []
        for sub in stores:
            if sub.value.id in self.views:
                root, index = self._view_index(sub)
                tests += [self._call("__hf_ok", sub.value.id, root, (t, axis, 0)) for axis, t in enumerate(index)]
            else:
                name = sub.value.id
                tests += [self._call("__hf_ok", name, name, (self.editor.rewrite(p, self.replace), axis, wrap))
                          for p, axis, wrap in _tests(sub)]
            self.guarded.add(id(sub))
        statement = self.editor.rewrite(node, lambda n: None if n is node else self.replace(n))
        return f"if {' and '.join(tests)}: {statement}" if tests else statement


def _tests(node) -> list:
    """(component, axis, 1) for each integer component of an array subscript; 1: Python's
    negative indices count from the end."""
    parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    if any(isinstance(p, ast.Starred) or (isinstance(p, ast.Constant) and p.value in (None, Ellipsis))
           for p in parts):
        return []  # axes past ``...``, ``None`` or ``*t`` cannot be counted
    return [(p, axis, 1) for axis, p in enumerate(parts) if not isinstance(p, ast.Slice)]


def _stored_subscripts(target, arrays) -> list:
    """Subscripts of ``arrays`` that a store into ``target`` writes through
    (``x[i] = ...``, ``p[i].f = ...``, ``x[i][j] = ...``, ``x[i], y[i] = ...``)."""
    if isinstance(target, (ast.Tuple, ast.List)):
        return [s for e in target.elts for s in _stored_subscripts(e, arrays)]
    while isinstance(target, (ast.Subscript, ast.Attribute)):
        if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) and target.value.id in arrays:
            return [target]
        target = target.value
    return []


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
    """Rank 2: a 2-D grid, columns on x (coalesced; the grid covers every column, see
    runtime.gpu.launch_config), rows on y striding; no index division. A loop over
    columns too, never taken twice, cost 20% of a 4096^2 stencil on an H100."""
    call = f"{body}(__i0, __i1, {', '.join(params)})" if params else f"{body}(__i0, __i1)"
    head = ", ".join(["__lo", "__hi", "__e1", *params])
    return "\n".join([
        f"def {ENTRY}({head}):",
        "    __i1 = __hf_cuda.blockIdx.x * __hf_cuda.blockDim.x + __hf_cuda.threadIdx.x",
        "    __i0 = __lo + __hf_cuda.blockIdx.y * __hf_cuda.blockDim.y + __hf_cuda.threadIdx.y",
        "    __rs = __hf_cuda.gridDim.y * __hf_cuda.blockDim.y",
        "    if __i1 < __e1:",
        "        while __i0 < __hi:",
        f"            {call}",
        "            __i0 += __rs",
    ]) + "\n"
