"""The IR: a dependency dataflow graph of data operations, kept as immutable versions.

A :class:`Node` is one data operation (``forall``, ``reduce``, ``scan``, ``sort``,
``view``, ``alloc``, library kernels): its parameters are its in-edges, its results its
out-edges. Edges are not stored; they follow from what each node reads and writes
(``kernel.access()`` for kernels) in program order: a node reading memory an earlier
node writes depends on it (read-after-write), and so do later writers of memory it
reads or writes (write-after-read, write-after-write). Nothing in a node names a
device unless a rule put it there (``devices``, ``shares``): the captured graph is
machine-independent.

A :class:`Version` is one DIR version: the node sequence (a valid execution order),
its parent version and why it was made. Rewrites build new versions; old ones stay.
"""
from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Iterable, Mapping

import numpy as np

from .values import Handle, LazyArray, is_data, root

EMPTY: Mapping = types.MappingProxyType({})


def frozen_attrs(attrs: Mapping | None) -> Mapping:
    """A read-only copy of node attributes."""
    return types.MappingProxyType(dict(attrs or {}))


@dataclasses.dataclass(frozen=True, eq=False)
class Node:
    """One data operation of the DIR."""

    id: int
    op: str
    args: tuple = ()
    modes: tuple = ()                 # per argument: 'r', 'w', 'rw' or '' (scalars, unused)
    kernel: object = None
    extent: tuple | None = None
    # op options, placement (devices, shares, place), provenance (fused, whole, piece)
    attrs: Mapping = dataclasses.field(default_factory=lambda: EMPTY)
    result: object = None             # the Handle or LazyArray this node produces
    rules: tuple = ()                 # rules attached to this node
    origin: tuple = ()                # ids of the captured nodes this one was derived from

    def __post_init__(self):
        if not isinstance(self.attrs, types.MappingProxyType):
            object.__setattr__(self, "attrs", frozen_attrs(self.attrs))

    def evolve(self, **changes) -> "Node":
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    def with_attrs(self, **attrs) -> "Node":
        """A copy with attributes set (a value of None removes the attribute)."""
        merged = dict(self.attrs)
        for key, value in attrs.items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = value
        return self.evolve(attrs=merged)

    @property
    def name(self) -> str:
        """The kernel's name for kernel launches, else the operation."""
        return getattr(self.kernel, "name", None) or self.attrs.get("name") or self.op

    @property
    def size(self) -> int:
        """Number of indices in the launch extent (0 for operations without one)."""
        return int(math.prod(self.extent)) if self.extent else 0

    def accesses(self) -> list[tuple[object, str]]:
        """(root, mode) for every memory access, the produced result included."""
        found = []
        for arg, mode in zip(self.args, self.modes):
            if isinstance(arg, Handle):
                found.append((arg, "r"))        # the producing node must have run
            if is_data(arg) and mode:
                found.append((root(arg), mode))
        if self.result is not None:
            found.append((self.result, "w"))
        return found

    def signature(self) -> tuple:
        """A hashable summary: equal signatures mean the same operation, same placement.
        Worked out once (a node does not change; the rule interpreter compares every
        node's at each safe point)."""
        found = self.__dict__.get("_signature")
        if found is None:
            found = (self.id, self.op, freeze(self.kernel), self.extent,
                     tuple(freeze(a) for a in self.args), self.modes, freeze(dict(self.attrs)),
                     tuple(getattr(r, "name", id(r)) for r in self.rules))
            object.__setattr__(self, "_signature", found)
        return found


_ATOM, _SEQUENCE, _MAPPING, _NODE, _OBJECT = range(5)
# How freeze() treats a value, by its type (found once per type: the rule interpreter
# freezes every node before each firing, and isinstance tests against ABCs such as
# Mapping cost more than the rest of it together).
_KINDS: dict[type, int] = {t: _ATOM for t in (str, int, float, bool, type(None))}


def _kind(t: type) -> int:
    if len(_KINDS) > 4096:  # types made on the fly: keep the table small
        _KINDS.clear()
    kind = (_MAPPING if issubclass(t, Mapping) else _SEQUENCE if issubclass(t, (list, tuple))
            else _ATOM if issubclass(t, (str, int, float, bool, np.generic)) else _NODE
            if issubclass(t, Node) else _OBJECT)
    _KINDS[t] = kind
    return kind


def freeze(value):
    """A hashable stand-in for a value: containers by content, other objects by identity."""
    kind = _KINDS.get(type(value))
    if kind is None:
        kind = _kind(type(value))
    if kind == _ATOM:
        return value
    if kind == _SEQUENCE:
        return tuple(freeze(v) for v in value)
    if kind == _MAPPING:
        return tuple(sorted((str(k), freeze(v)) for k, v in value.items()))
    if kind == _NODE:
        return ("node", value.id)
    return ("object", id(value))


def dependencies(nodes: Iterable[Node]) -> dict[int, frozenset]:
    """node id -> ids of the nodes it depends on (RAW, WAR, WAW), from program order."""
    last_writer: dict[int, int] = {}
    readers: dict[int, set] = {}
    deps: dict[int, frozenset] = {}
    for node in nodes:
        needs = set()
        for obj, mode in node.accesses():
            key = id(obj)
            if "r" in mode and key in last_writer:
                needs.add(last_writer[key])
            if "w" in mode:
                if key in last_writer:
                    needs.add(last_writer[key])
                needs.update(readers.get(key, ()))
        for obj, mode in node.accesses():
            key = id(obj)
            if "w" in mode:
                last_writer[key] = node.id
                readers[key] = set()
            elif "r" in mode:
                readers.setdefault(key, set()).add(node.id)
        needs.discard(node.id)
        deps[node.id] = frozenset(needs)
    return deps


@dataclasses.dataclass(frozen=True, eq=False)
class Version:
    """One version of the DIR: nodes in a valid execution order."""

    number: int
    nodes: tuple
    parent: int | None = None
    reason: str = "captured"

    def signature(self) -> tuple:
        return tuple(n.signature() for n in self.nodes)

    def dependencies(self) -> dict[int, frozenset]:
        return dependencies(self.nodes)

    def lazy_arrays(self) -> set[int]:
        """ids of the lazy arrays this version still reads or writes."""
        return {id(obj) for n in self.nodes for obj, _ in n.accesses() if isinstance(obj, LazyArray)}


# -- naming, diff and drawing -------------------------------------------------------------

class Names:
    """Readable names for the values of a graph (x0, x1 for arrays from outside)."""

    def __init__(self):
        self._names: dict[int, str] = {}
        self._keep: list = []          # holds the objects so that their ids stay unique

    def of(self, obj) -> str:
        if isinstance(obj, (LazyArray, Handle)):
            return obj.name
        if not is_data(obj):
            return repr(obj.item() if isinstance(obj, np.generic) else obj)
        base = root(obj)
        if isinstance(base, (LazyArray, Handle)):
            return base.name if base is obj else f"view({base.name})"
        key = id(base)
        if key not in self._names:
            self._names[key] = f"x{len(self._names)}"
            self._keep.append(base)
        name = self._names[key]
        return name if base is obj else f"view({name})"


def describe(node: Node, names: Names) -> str:
    """``#3 forall scale(x0:r, t0:w, 2.0) extent=(1000,)`` and placement, if any; keyword
    arguments of other operations by name (``reduce(x0:r, 'sum', axis=None, ...)``)."""
    items = [f"{names.of(a)}:{m}" if m else names.of(a) for a, m in zip(node.args, node.modes)]
    keywords = node.attrs.get("keywords", ())
    if keywords:
        split = len(items) - len(keywords)
        items[split:] = [f"{k}={v}" for k, v in zip(keywords, items[split:])]
    args = ", ".join(items)
    text = f"#{node.id} {node.op} {node.name}({args})"
    if node.extent is not None:
        text += f" extent={node.extent}"
    if node.result is not None:
        text += f" -> {names.of(node.result)}"
    shown = {k: v for k, v in node.attrs.items() if k in SHOWN_ATTRS}
    if shown:
        text += " " + " ".join(f"{k}={_show(v)}" for k, v in sorted(shown.items()))
    if node.rules:
        text += " rules=[" + ", ".join(r.name for r in node.rules) + "]"
    return text


SHOWN_ATTRS = ("devices", "shares", "place", "piece", "fused", "eliminated", "substituted", "compiled")


def _show(value) -> str:
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_show(v)}" for k, v in value.items()) + "}"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(_show(v) for v in value) + ")"
    return str(value)


def diff(a: Version, b: Version, names: Names) -> str:
    """Readable text of the nodes added, removed and changed from ``a`` to ``b``."""
    lines = [f"--- v{a.number} ({a.reason})", f"+++ v{b.number} ({b.reason})"]
    old = {n.id: n for n in a.nodes}
    new = {n.id: n for n in b.nodes}
    for node in a.nodes:
        if node.id not in new:
            lines.append("- " + describe(node, names))
    for node in b.nodes:
        if node.id not in old:
            origin = f"  [from {', '.join('#%d' % o for o in node.origin)}]" if node.origin else ""
            lines.append("+ " + describe(node, names) + origin)
        elif node.signature() != old[node.id].signature():
            lines.append(f"~ #{node.id} {node.op} {node.name}: " + "; ".join(_changes(old[node.id], node, names)))
    if len(lines) == 2:
        lines.append("  (no changes)")
    return "\n".join(lines)


def _changes(a: Node, b: Node, names: Names) -> list[str]:
    out = []
    if a.kernel is not b.kernel:
        out.append(f"kernel {a.name} -> {b.name}")
    if a.extent != b.extent:
        out.append(f"extent {a.extent} -> {b.extent}")
    if [freeze(x) for x in a.args] != [freeze(x) for x in b.args] or a.modes != b.modes:
        out.append("args (" + ", ".join(names.of(x) for x in a.args) + ") -> ("
                   + ", ".join(names.of(x) for x in b.args) + ")")
    for key in sorted(set(a.attrs) | set(b.attrs)):
        va, vb = a.attrs.get(key), b.attrs.get(key)
        if freeze(va) != freeze(vb):
            out.append(f"{key}: {'none' if va is None else _show(va)} -> {'none' if vb is None else _show(vb)}")
    ra, rb = [r.name for r in a.rules], [r.name for r in b.rules]
    if ra != rb:
        out.append(f"rules {ra} -> {rb}")
    return out


def to_dot(version: Version, names: Names, title: str = "hetflow") -> str:
    """Graphviz text: operations as boxes, data as ellipses, edges as reads and writes."""
    lines = [f'digraph "{_esc(title)} v{version.number}" {{', "  rankdir=LR;",
             '  node [fontname="Helvetica", fontsize=10];']
    values: dict[str, object] = {}
    ids: dict[str, str] = {}

    def value_id(obj) -> str:
        name = names.of(obj)
        values.setdefault(name, obj)
        return ids.setdefault(name, f"v{len(ids)}")

    for node in version.nodes:
        label = [f"#{node.id} {node.op} {node.name}"]
        if node.extent is not None:
            label.append(f"extent={node.extent}")
        label += [f"{k}={_show(v)}" for k, v in sorted(node.attrs.items()) if k in SHOWN_ATTRS]
        if node.rules:
            label.append("rules: " + ", ".join(r.name for r in node.rules))
        lines.append(f'  n{node.id} [shape=box, style=rounded, label="{_esc(chr(10).join(label))}"];')
        for arg, mode in zip(node.args, node.modes):
            if not is_data(arg):
                continue
            if "r" in mode or isinstance(arg, Handle):
                lines.append(f"  {value_id(arg)} -> n{node.id};")
            if "w" in mode:
                lines.append(f"  n{node.id} -> {value_id(arg)};")
        if node.result is not None:
            lines.append(f"  n{node.id} -> {value_id(node.result)};")
    for name, obj in values.items():
        shape = getattr(obj, "shape", None)
        dtype = getattr(obj, "dtype", None)
        extra = f"\n{dtype} {tuple(shape)}" if shape is not None and dtype is not None else ""
        lines.append(f'  {value_id(obj)} [shape=ellipse, label="{_esc(name + extra)}"];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def _esc(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def reachable(deps: Mapping[int, frozenset], start: Iterable[int]) -> set[int]:
    """ids of the nodes that (transitively) depend on any node in ``start``."""
    users: dict[int, set] = {}
    for node_id, needs in deps.items():
        for n in needs:
            users.setdefault(n, set()).add(node_id)
    seen, todo = set(), list(start)
    while todo:
        for user in users.get(todo.pop(), ()):
            if user not in seen:
                seen.add(user)
                todo.append(user)
    return seen


def ancestors(deps: Mapping[int, frozenset], start: Iterable[int]) -> set[int]:
    """ids of the nodes that any node in ``start`` (transitively) depends on."""
    seen, todo = set(), list(start)
    while todo:
        for need in deps.get(todo.pop(), ()):
            if need not in seen:
                seen.add(need)
                todo.append(need)
    return seen


def replace_nodes(nodes: tuple, old_ids: set, new_nodes: list[Node]) -> tuple:
    """``nodes`` with the nodes ``old_ids`` replaced by ``new_nodes``, order kept valid.

    The new nodes go where the last old node was; nodes between the first and the last
    old node that depend on an old node move after the new ones. The caller has checked
    that no node both depends on an old node and feeds one (the result is then acyclic).
    """
    order = [n.id for n in nodes]
    positions = [order.index(i) for i in old_ids]
    first, last = min(positions), max(positions)
    deps = dependencies(nodes)
    after = reachable(deps, old_ids) - set(old_ids)
    head = list(nodes[:first])
    middle = [n for n in nodes[first:last + 1] if n.id not in old_ids]
    tail = list(nodes[last + 1:])
    before = [n for n in middle if n.id not in after]
    moved = [n for n in middle if n.id in after]
    return tuple(head + before + list(new_nodes) + moved + tail)
