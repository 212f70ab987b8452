"""Kernel source rewriting for DIR actions: fused kernels and offset kernels.

Fusion concatenates kernel bodies (as ASTs) into one function over the common launch
index. Each kernel's parameters are renamed to the fused kernel's parameters; its local
variables get a per-kernel prefix so that bodies cannot collide; an intermediate array
that every body touches only at the launch index becomes a local scalar of the fused
body (it is never allocated).

Splitting needs a kernel that runs a piece ``[off, off + n)`` of the outermost
dimension: the offset kernel takes the piece's own index and adds ``off``.
"""
from __future__ import annotations

import ast
import copy
import dataclasses
import hashlib

import numpy as np

from ..kernels.kernel import Kernel, stable_value


def _names(fdef: ast.FunctionDef) -> set[str]:
    found = {a.arg for a in fdef.args.args}
    found.update(n.id for n in ast.walk(fdef) if isinstance(n, ast.Name))
    return found


def _assigned(fdef: ast.FunctionDef) -> set[str]:
    """Names the body binds (Python makes them local to the function)."""
    return {n.id for n in ast.walk(fdef) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}


def unfusable_reason(kernel: Kernel, ndim: int) -> str | None:
    """Why ``kernel``'s body cannot be pasted into another function, or None."""
    if not kernel.has_source:
        return f"kernel {kernel.name!r} has no source"
    fdef = kernel.definition
    params = [a.arg for a in fdef.args.args]
    if len(params) < ndim:
        return f"kernel {kernel.name!r} has fewer parameters than the launch rank {ndim}"
    if fdef.args.vararg or fdef.args.kwarg or fdef.args.kwonlyargs or fdef.args.defaults:
        return f"kernel {kernel.name!r} has non-positional parameters"
    for node in ast.walk(fdef):
        if isinstance(node, (ast.Return, ast.Yield, ast.YieldFrom)):
            return f"kernel {kernel.name!r} returns early (line {node.lineno})"
        if isinstance(node, (ast.Global, ast.Nonlocal, ast.Lambda, ast.AsyncFunctionDef,
                             ast.ClassDef, ast.Import, ast.ImportFrom)) or (
                isinstance(node, ast.FunctionDef) and node is not fdef):
            return f"kernel {kernel.name!r} uses {type(node).__name__} (line {node.lineno})"
    if set(params[:ndim]) & _assigned(fdef):
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


@dataclasses.dataclass(frozen=True)
class Binding:
    """What a kernel parameter becomes in the fused kernel: a parameter or a local scalar."""

    name: str
    local: bool = False
    dtype: object = None      # the local's dtype (locals only)


class _Rewrite(ast.NodeTransformer):
    def __init__(self, rename: dict[str, str], scalars: dict[str, str]):
        self.rename, self.scalars = rename, scalars

    def visit_Subscript(self, node):
        if isinstance(node.value, ast.Name) and node.value.id in self.scalars:
            return ast.copy_location(ast.Name(self.scalars[node.value.id], node.ctx), node)
        return self.generic_visit(node)

    def visit_Name(self, node):
        if node.id in self.rename:
            return ast.copy_location(ast.Name(self.rename[node.id], node.ctx), node)
        return node


def _prefix(kernels) -> str:
    used = set().union(*(_names(k.definition) for k in kernels))
    prefix = "hf_"
    while any(n.startswith(prefix) for n in used):
        prefix = "_" + prefix
    return prefix


def fuse_source(name: str, kernels: list[Kernel], bindings: list[dict[str, Binding]],
                params: list[str], ndim: int) -> tuple[str, dict]:
    """Source and globals of one kernel running ``kernels`` in order at each index.

    ``bindings[k]`` maps each data parameter of ``kernels[k]`` to its Binding;
    ``params`` are the fused kernel's data parameters, in order.
    """
    prefix = _prefix(kernels)
    index = [f"{prefix}i{d}" for d in range(ndim)]
    # The fused kernel belongs to the first kernel's module: Numba's cache of compiled
    # code names the module of a function's globals and imports it when loading.
    namespace: dict[str, object] = {"__name__": kernels[0].namespace().get("__name__", __name__)}
    body: list[ast.stmt] = []
    locals_seen: dict[str, object] = {}
    for k, (kernel, binding) in enumerate(zip(kernels, bindings)):
        fdef = copy.deepcopy(kernel.definition)
        kparams = [a.arg for a in fdef.args.args]
        rename = dict(zip(kparams[:ndim], index))
        scalars = {}
        for p in kparams[ndim:]:
            b = binding[p]
            if b.local:
                scalars[p] = f"{prefix}{b.name}"
                locals_seen.setdefault(scalars[p], b.dtype)
            else:
                rename[p] = f"{prefix}{b.name}"
        for local in _assigned(fdef) - set(kparams):
            rename[local] = f"{prefix}k{k}_{local}"
        kernel_ns = kernel.namespace()
        for free in _names(fdef) - set(kparams) - _assigned(fdef):
            if free not in kernel_ns:
                continue  # a builtin (range, min, ...)
            target = free
            if free in namespace and namespace[free] is not kernel_ns[free]:
                target = f"{prefix}g{k}_{free}"
                rename[free] = target
            namespace[target] = kernel_ns[free]
        stmts = fdef.body
        if stmts and isinstance(stmts[0], ast.Expr) and isinstance(getattr(stmts[0], "value", None), ast.Constant) \
                and isinstance(stmts[0].value.value, str):
            stmts = stmts[1:]  # the docstring
        rewriter = _Rewrite(rename, scalars)
        body.extend(rewriter.visit(stmt) for stmt in stmts)
    inits = []
    for local, dtype in locals_seen.items():
        ctor = f"{prefix}dtype_{np.dtype(dtype).name}"
        namespace[ctor] = np.dtype(dtype).type
        inits.append(ast.parse(f"{local} = {ctor}(0)").body[0])
    fused = _function(name, index + [f"{prefix}{p}" for p in params], inits + body)
    # The code repository keys executables by source text; compiled code freezes global
    # values, so the text must change when they do.
    header = f"# fused from {', '.join(k.name for k in kernels)}; globals {_digest(namespace)}\n"
    return header + ast.unparse(fused) + "\n", namespace


def _digest(namespace: dict) -> str:
    text = ";".join(f"{k}={stable_value(v)}" for k, v in sorted(namespace.items()) if k != "__name__")
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def offset_source(kernel: Kernel, ndim: int) -> tuple[str, dict]:
    """Source and globals of ``kernel`` shifted along dimension 0 by a trailing ``off`` argument."""
    fdef = kernel.definition
    params = [a.arg for a in fdef.args.args]
    prefix = _prefix([kernel])
    piece_index, offset = f"{prefix}j", f"{prefix}off"
    first = params[0]
    shift = ast.parse(f"{first} = {piece_index} + {offset}").body[0]
    shifted = _function(f"{kernel.name}_at", [piece_index, *params[1:], offset],
                        [shift, *copy.deepcopy(fdef.body)])
    return ast.unparse(shifted) + "\n", kernel.namespace()


def _function(name: str, params: list[str], body: list[ast.stmt]) -> ast.Module:
    """A module defining ``def name(params): body`` (built from text: portable across Pythons)."""
    module = ast.parse(f"def {name}({', '.join(params)}):\n    pass\n")
    module.body[0].body = body or [ast.Pass()]
    return ast.fix_missing_locations(module)
