"""Fusing a producer-consumer chain of ``forall`` nodes into one generated kernel.

Legality (anything else leaves the graph alone):

- every node is a ``forall`` over the same extent, with the same placement, whose
  kernel's accesses can be read (:func:`codegen.unfusable_reason`);
- memory written by one node of the chain and touched by another is accessed only at
  the launch index, through the same array object, by every node of the chain (in a
  fused loop an element must not be read before the index that produces it has run);
- no node outside the chain both depends on one chain node and feeds another (the
  result must stay acyclic).

An intermediate becomes a local slot (never allocated) when it is a lazy array
allocated by this graph (an ``alloc`` node of it: another graph's lazy array is that
graph's memory), not marked as read outside it, touched by no node outside the
chain, first written (not read) by the chain, always accessed at the launch index, and
left uninitialised or zero-filled (a slot starts at zero).
"""
from __future__ import annotations

import hashlib

from ..kernels.kernel import Kernel
from . import codegen
from .graph import Node, ancestors, dependencies, reachable
from .values import Handle, LazyArray, is_data, root

PLACEMENT = ("devices", "shares", "place", "schedule")


def fuse(ctx, chain: list[Node]) -> bool:
    """Replace the longest legal prefix (two nodes or more) of ``chain``; True if fused."""
    for end in range(len(chain), 1, -1):
        plan = _plan(ctx, chain[:end])
        if plan is not None:
            fused, removed = plan
            ctx.replace(removed, [fused])
            return True
    return False


def _placement(node: Node) -> tuple:
    return tuple((k, repr(node.attrs.get(k))) for k in PLACEMENT)


def _plan(ctx, chain: list[Node]):
    first = chain[0]
    if any(n.op != "forall" or n.extent != first.extent or _placement(n) != _placement(first)
           or "whole" in n.attrs or "snapshot" in n.attrs for n in chain):
        return None
    ndim = len(first.extent)
    if any(codegen.unfusable_reason(n.kernel, ndim) for n in chain):
        return None
    if not _acyclic(ctx.nodes, chain):
        return None
    uses = _uses(chain, ndim)
    if uses is None:
        return None
    local = _eliminable(ctx, chain, uses)
    return _build(ctx, chain, ndim, local)


def _acyclic(nodes, chain) -> bool:
    ids = {n.id for n in chain}
    deps = dependencies(nodes)
    return not ((reachable(deps, ids) - ids) & (ancestors(deps, ids) - ids))


def _uses(chain, ndim):
    """root id -> list of (node index, param, arg, mode, launch-index-only); None if illegal."""
    uses: dict[int, list] = {}
    for k, node in enumerate(chain):
        exact = codegen.launch_index_only(node.kernel, ndim)
        params = node.kernel.params[ndim:]
        for param, arg, mode in zip(params, node.args, node.modes):
            if is_data(arg) and not isinstance(arg, Handle):
                uses.setdefault(id(root(arg)), []).append((k, param, arg, mode, param in exact))
    for entries in uses.values():
        touched_by = {k for k, *_ in entries}
        written = any("w" in mode for _, _, _, mode, _ in entries)
        if len(touched_by) > 1 and written:
            same_object = len({id(arg) for _, _, arg, _, _ in entries}) == 1
            if not same_object or not all(exact for *_, exact in entries):
                return None
    return uses


def _eliminable(ctx, chain, uses) -> set[int]:
    chain_ids = {n.id for n in chain}
    outside: set[int] = set()
    allocated: set[int] = set()
    for node in ctx.nodes:
        if node.op == "alloc" and isinstance(node.result, LazyArray):
            allocated.add(id(node.result))
        elif node.id not in chain_ids:
            outside.update(id(obj) for obj, _ in node.accesses())
    local = set()
    for key, entries in uses.items():
        arg = entries[0][2]
        # Only this graph's own allocations: another graph's lazy array keeps its memory.
        if not isinstance(arg, LazyArray) or key not in allocated or key in outside or key in ctx.outputs:
            continue
        if arg.dtype.kind not in "biufc" or not all(exact for *_, exact in entries):
            continue
        if arg.fill not in (None, 0):
            continue  # a local slot starts at 0: elements the chain leaves unwritten would lose the fill
        if len({id(a) for _, _, a, _, _ in entries}) != 1 or entries[0][3] != "w":
            continue  # first touched by a read: the old value would be needed
        local.add(key)
    return local


def _build(ctx, chain, ndim, local: set[int]):
    bindings, params, args, by_object, locals_by_root = [], [], [], {}, {}
    for node in chain:
        binding = {}
        for param, arg in zip(node.kernel.params[ndim:], node.args):
            data = is_data(arg)
            if data and not isinstance(arg, Handle) and id(root(arg)) in local:
                name = locals_by_root.setdefault(id(root(arg)), f"t{len(locals_by_root)}")
                binding[param] = codegen.Binding(name, local=True, dtype=arg.dtype)
                continue
            if data and id(arg) in by_object:
                binding[param] = codegen.Binding(by_object[id(arg)])
                continue
            name = f"p{len(params)}"
            if data:
                by_object[id(arg)] = name
            params.append(name)
            args.append(arg)
            binding[param] = codegen.Binding(name)
        bindings.append(binding)
    kernels = [n.kernel for n in chain]
    name = _fused_name(kernels)
    shape = tuple(tuple(sorted((p, b.name, b.local, str(b.dtype))
                               for p, b in binding.items())) for binding in bindings)
    operation = ("fuse", tuple((k.name, k.source_hash) for k in kernels), shape)

    def build():
        src, namespace = codegen.fuse_source(name, kernels, bindings, params, ndim)
        fused = Kernel.from_source(name, src, namespace)
        fused.set_access(ndim, codegen.fused_access(kernels, bindings, params, ndim))
        return fused

    kernel = ctx.cache.get_or_build(operation, (), (("ndim", ndim),), build)
    access = kernel.access(ndim)
    modes = tuple(access.modes.get(p, "") for p in kernel.params[ndim:])
    eliminated = [n for n in ctx.nodes if n.op == "alloc" and id(n.result) in local]
    attrs = {k: v for k, v in chain[0].attrs.items() if k in PLACEMENT}
    attrs["fused"] = tuple(n.name for n in chain)
    if eliminated:
        attrs["eliminated"] = tuple(a.result.name for a in eliminated)
    fused = Node(id=ctx.new_id(), op="forall", args=tuple(args), modes=modes, kernel=kernel,
                 extent=chain[0].extent, attrs=attrs,
                 rules=tuple(dict.fromkeys(r for n in chain for r in n.rules)),
                 origin=tuple(o for n in chain for o in (n.origin or (n.id,))))
    return fused, list(chain) + eliminated


def _fused_name(kernels) -> str:
    name = "fused_" + "_".join(k.name for k in kernels)
    if len(name) <= 48:
        return name
    digest = hashlib.sha1(name.encode()).hexdigest()[:8]
    return f"fused_{len(kernels)}ops_{digest}"

