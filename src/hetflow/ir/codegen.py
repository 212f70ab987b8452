"""Generated kernels for DIR actions: fused kernels and offset kernels.

Both call the kernels they are made of, compiled from their own function objects
(:mod:`hetflow.platform.repository` compiles kernels a kernel calls as device
functions); no kernel's text is pasted or rewritten. A fused kernel calls each kernel
of the chain in turn at the common launch index; an intermediate array that every
kernel touches only at the launch index is passed as a *slot* (a stack variable that
stands for the array's element at the launch index: it is never allocated).

Splitting needs a kernel that runs a piece ``[off, off + n)`` of the outermost
dimension. A kernel that uses its row index only to subscript arrays' rows
(:func:`row_sliced`) runs a piece as it is, on those arrays' rows ``[off, off + n)``:
it then still writes only the rows of its launch index, so devices can share a
piece. Any other kernel gets an offset kernel, which takes the piece's own index and
calls the kernel at that index plus ``off``.
"""
from __future__ import annotations

import ast
import dataclasses
import hashlib

import numpy as np

from ..kernels.access import Access
from ..kernels.kernel import Kernel, stable_value
from ..kernels.viewtypes import SLOT


def unfusable_reason(kernel: Kernel, ndim: int) -> str | None:
    """Why ``kernel`` cannot join a fused kernel, or None: which elements it touches is
    read from its source (:func:`launch_index_only`)."""
    if not kernel.has_source:
        return f"kernel {kernel.name!r} has no source"
    fdef = kernel.definition
    if len(fdef.args.args) < ndim:
        return f"kernel {kernel.name!r} has fewer parameters than the launch rank {ndim}"
    if fdef.args.vararg or fdef.args.kwarg or fdef.args.kwonlyargs:
        return f"kernel {kernel.name!r} has non-positional parameters"
    index = {a.arg for a in fdef.args.args[:ndim]}
    if any(isinstance(n, ast.Name) and n.id in index and not isinstance(n.ctx, ast.Load) for n in ast.walk(fdef)):
        return f"kernel {kernel.name!r} assigns to its index parameters"
    return None


def launch_index_only(kernel: Kernel, ndim: int) -> set[str]:
    """Data parameters used only as ``p[i]`` / ``p[i, j]`` with exactly the launch index."""
    fdef = kernel.definition
    params = [a.arg for a in fdef.args.args]
    index, data = params[:ndim], set(params[ndim:])
    ok, bad = set(), set()
    exact = set()
    for node in ast.walk(fdef):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in data:
            elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            if [getattr(e, "id", None) for e in elts] == index:
                ok.add(node.value.id)
                exact.add(id(node.value))
            else:
                bad.add(node.value.id)
    for node in ast.walk(fdef):
        # A bare use (passed to a call, len(p), p.shape) may touch any element.
        if isinstance(node, ast.Name) and node.id in data and id(node) not in exact:
            bad.add(node.id)
    return ok - bad


def row_sliced(kernel: Kernel, ndim: int) -> frozenset | None:
    """The data parameters to cut by rows so that ``kernel`` runs a piece of its launch
    unchanged, or None when it cannot: its row index must appear only as the first
    subscript of data parameters, or as the row index of a kernel it calls that can be
    cut too (as fused kernels call theirs); those parameters only in such places
    (``p.shape`` or ``f(p)`` would see the cut)."""
    if unfusable_reason(kernel, ndim):
        return None
    fdef = kernel.definition
    params = [a.arg for a in fdef.args.args]
    row, data = params[0], set(params[ndim:])
    cut, allowed = set(), set()
    for node in ast.walk(fdef):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in data:
            first = node.slice.elts[0] if isinstance(node.slice, ast.Tuple) and node.slice.elts else node.slice
            if isinstance(first, ast.Name) and first.id == row:
                cut.add(node.value.id)
                allowed.update((id(node.value), id(first)))
        elif isinstance(node, ast.Call):
            _called_with_rows(kernel, node, row, data, ndim, cut, allowed)
    for node in ast.walk(fdef):
        if isinstance(node, ast.Name) and node.id in cut | {row} and id(node) not in allowed:
            return None
    return frozenset(cut)


def _called_with_rows(kernel: Kernel, call: ast.Call, row: str, data: set, ndim: int,
                      cut: set, allowed: set) -> None:
    """Adds to ``cut`` and ``allowed`` what ``call`` passes a kernel that can be cut by
    rows at the same row index (its arguments then index rows there)."""
    callee = kernel.namespace().get(call.func.id) if isinstance(call.func, ast.Name) else None
    if not isinstance(callee, Kernel) or call.keywords or len(call.args) != len(callee.params):
        return
    first = call.args[0] if call.args else None
    inner = row_sliced(callee, ndim) if isinstance(first, ast.Name) and first.id == row else None
    if inner is None:
        return
    allowed.add(id(first))
    for arg, param in zip(call.args[ndim:], callee.params[ndim:]):
        if isinstance(arg, ast.Name) and arg.id in data and param in inner:
            cut.add(arg.id)
            allowed.add(id(arg))


@dataclasses.dataclass(frozen=True)
class Binding:
    """What a kernel parameter becomes in the fused kernel: a parameter or a local slot."""

    name: str
    local: bool = False
    dtype: object = None      # the local's dtype (locals only)


def fuse_source(name: str, kernels: list[Kernel], bindings: list[dict[str, Binding]],
                params: list[str], ndim: int) -> tuple[str, dict]:
    """Source and globals of one kernel running ``kernels`` in order at each index.

    ``bindings[k]`` maps each data parameter of ``kernels[k]`` to its Binding;
    ``params`` are the fused kernel's data parameters, in order.
    """
    index = [f"hf_i{d}" for d in range(ndim)]
    # The fused kernel belongs to the first kernel's module (a name for its functions).
    namespace: dict[str, object] = {"__name__": kernels[0].namespace().get("__name__", __name__),
                                    "hf_slot": SLOT}
    lines = [f"def {name}({', '.join(index + [param(p) for p in params])}):"]
    seen: set = set()
    for binding in bindings:
        for b in binding.values():
            if b.local and b.name not in seen:
                seen.add(b.name)
                ctor = f"hf_dtype_{np.dtype(b.dtype).name}"
                namespace[ctor] = np.dtype(b.dtype).type
                lines.append(f"    {param(b.name)} = hf_slot({ctor}(0))")
    for k, (kernel, binding) in enumerate(zip(kernels, bindings)):
        namespace[f"hf_k{k}"] = kernel
        args = index + [param(binding[p].name) for p in kernel.params[ndim:]]
        lines.append(f"    hf_k{k}({', '.join(args)})")
    # The code repository keys executables by the kernel's code and globals; the
    # kernels called count by their own digest.
    header = f"# fused from {', '.join(k.name for k in kernels)}; globals {_digest(namespace)}\n"
    return header + "\n".join(lines) + "\n", namespace


def param(name: str) -> str:
    """The fused kernel's parameter (or slot) for a binding's ``name``."""
    return f"hf_{name}"


def fused_access(kernels: list[Kernel], bindings: list[dict[str, Binding]], params: list[str],
                 ndim: int) -> Access:
    """The fused kernel's access, from its kernels': a parameter is read or written where
    one of them does, is indexed by the launch index where one of them does so, and is
    touched in the launch's row only when every kernel touching it is."""
    modes = {p: set() for p in params}
    identity, other = {}, set()
    for kernel, binding in zip(kernels, bindings):
        access = kernel.access(ndim)
        for p, b in binding.items():
            if b.local or not access.modes.get(p):
                continue
            modes[b.name].update(access.modes[p])
            if access.identity.get(p):
                identity[b.name] = max(identity.get(b.name, 0), access.identity[p])
            if p not in access.rows:
                other.add(b.name)
    touched = {p for p in params if modes[p]}
    return Access({param(p): "".join(m for m in "rw" if m in modes[p]) for p in params},
                  {param(p): k for p, k in identity.items()}, frozenset(map(param, touched - other)))


def _digest(namespace: dict) -> str:
    text = ";".join(f"{k}={stable_value(v)}" for k, v in sorted(namespace.items()) if k != "__name__")
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def offset_source(kernel: Kernel, ndim: int) -> tuple[str, dict]:
    """Source and globals of ``kernel`` shifted along dimension 0 by a trailing ``off`` argument."""
    rest = [f"hf_a{k}" for k in range(len(kernel.params) - 1)]
    text = (f"def {kernel.name}_at(hf_j, {', '.join(rest + ['hf_off'])}):\n"
            f"    hf_kernel(hf_j + hf_off, {', '.join(rest)})\n")
    return text, {"__name__": kernel.namespace().get("__name__", __name__), "hf_kernel": kernel}
