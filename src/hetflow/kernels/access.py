"""Which kernel parameters are read and which written, found from the kernel's code.

The runtime infers dependencies from these (read-after-write, write-after-read,
write-after-write), the launcher copies back from a GPU only what was written,
parameters subscripted by exactly the launch index are checked against the extent, and
those touched only in the row of the launch's first index (``x[i, ...]``) can be split
by rows over devices.
"""
from __future__ import annotations

import ast
import dataclasses


@dataclasses.dataclass(frozen=True)
class Access:
    """Per data parameter: 'r', 'w' or 'rw' ('' if unused), and the identity-indexed ones."""

    modes: dict
    identity: dict  # parameter -> k: subscripted by the first k launch indices (i, j, ...)
    rows: frozenset = frozenset()  # parameters only ever subscripted as x[i, ...] (i: the row index)
    # Parameters only ever subscripted as x[i, j, ..., more] (all the launch indices first):
    # the kernel at launch index I touches only their elements x[I, ...].
    aligned: frozenset = frozenset()

    def reads(self, name) -> bool:
        return "r" in self.modes.get(name, "")

    def writes(self, name) -> bool:
        return "w" in self.modes.get(name, "")


def analyze(fdef: ast.FunctionDef, ndim: int, callee_modes) -> Access:
    """Access modes of ``fdef``'s data parameters for a launch of rank ``ndim``.

    ``callee_modes(name)`` returns the modes of a called kernel's positional parameters
    (its index parameters included, as ''), or None when ``name`` is not a kernel.
    """
    params = [a.arg for a in fdef.args.args]
    index, data = params[:ndim], set(params[ndim:])
    modes = {p: set() for p in params[ndim:]}
    identity = {}
    other = set()  # parameters subscripted other than x[i, ...], or handed whole to a call
    unaligned = set()  # parameters subscripted other than x[i, j, ..., more]
    row = index[0] if index else None
    if any(isinstance(n, ast.Name) and n.id == row and isinstance(n.ctx, ast.Store) for n in ast.walk(fdef)):
        row = None  # a reassigned row index says nothing about which row is touched

    for node in ast.walk(fdef):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                base = _base_name(target)
                if base in data:  # x[i] = ..., p[i].x = ..., p[i]['f'] += ...
                    modes[base].update("rw" if isinstance(node, ast.AugAssign) else "w")
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in data:
            name = node.value.id
            if not isinstance(node.ctx, ast.Store):
                modes[name].add("r")
            k = _identity_rank(node.slice, index)
            if k:
                identity[name] = max(k, identity.get(name, 0))
            first = node.slice.elts[0] if isinstance(node.slice, ast.Tuple) and node.slice.elts else node.slice
            if row is None or not (isinstance(first, ast.Name) and first.id == row):
                other.add(name)
            if not _leads_with(node.slice, index):
                unaligned.add(name)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            callee = callee_modes(node.func.id)
            for k, arg in enumerate(node.args):
                if isinstance(arg, ast.Name) and arg.id in data:
                    # An unknown callee may do anything with an array it is handed.
                    modes[arg.id].update(callee[k] if callee and k < len(callee) else "rw")
                    other.add(arg.id)
    ordered = {p: "".join(m for m in "rw" if m in modes[p]) for p in modes}
    touched = {p for p, m in modes.items() if m}
    # a reassigned index variable says nothing about which elements are touched
    moved = any(isinstance(n, ast.Name) and n.id in index and isinstance(n.ctx, ast.Store) for n in ast.walk(fdef))
    aligned = frozenset() if moved or not index else frozenset(touched - other - unaligned)
    return Access(ordered, identity, frozenset(touched - other), aligned)


def _base_name(target):
    """The parameter an assignment target stores into (through subscripts and fields)."""
    while isinstance(target, (ast.Subscript, ast.Attribute)):
        target = target.value
    return target.id if isinstance(target, ast.Name) else None


def _leads_with(slice_node, index) -> bool:
    """The subscript starts with all the launch indices, in order."""
    elts = slice_node.elts if isinstance(slice_node, ast.Tuple) else [slice_node]
    return len(elts) >= len(index) and all(isinstance(e, ast.Name) and e.id == name
                                           for e, name in zip(elts, index))


def _identity_rank(slice_node, index) -> int:
    """k when the subscript is exactly the first k launch indices, else 0."""
    elts = slice_node.elts if isinstance(slice_node, ast.Tuple) else [slice_node]
    if not elts or len(elts) > len(index):
        return 0
    ok = all(isinstance(e, ast.Name) and e.id == index[k] for k, e in enumerate(elts))
    return len(elts) if ok else 0
