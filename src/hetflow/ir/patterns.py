"""Left-hand sides of rules: patterns on the graph, on functions, on the machine.

A graph pattern is an object matched against the nodes of the current DIR version,
yielding :class:`Match` bindings (one node, or a producer-consumer chain), in the
manner of tinygrad's ``UPat`` / torch.fx's ``replace_pattern``. :class:`NodePattern`
also covers patterns on functions and parameters (kernel name, argument dtypes and
sizes). :class:`TopologyPattern` tests the machine (device counts and kinds).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Iterator, Mapping

import numpy as np

from .graph import Node
from .values import Handle, is_data


@dataclasses.dataclass(frozen=True)
class Match:
    """A binding of a pattern: the matched nodes in program order (a chain: producer first)."""

    nodes: tuple

    @property
    def node(self) -> Node | None:
        return self.nodes[0] if self.nodes else None

    @property
    def ids(self) -> tuple:
        return tuple(n.id for n in self.nodes)


WHOLE_GRAPH = Match(())


def _one_of(value, wanted) -> bool:
    return wanted is None or value in ((wanted,) if isinstance(wanted, str) else tuple(wanted))


def array_args(node: Node) -> list:
    return [a for a in node.args if is_data(a) and not isinstance(a, Handle)]


def dtypes(node: Node) -> tuple[str, ...]:
    return tuple(np.dtype(a.dtype).name for a in array_args(node) if hasattr(a, "dtype"))


def work_size(node: Node) -> int:
    """Indices of the launch, or elements of the largest array argument."""
    if node.extent:
        return node.size
    sizes = [int(np.prod(a.shape, dtype=np.int64)) for a in array_args(node) if hasattr(a, "shape")]
    return max(sizes, default=0)


def placement_kinds(node: Node, topology) -> frozenset:
    """Kinds of device the node may run on: its ``devices`` attribute, else any in the topology."""
    ids = node.attrs.get("devices")
    if not ids:
        return topology.kinds()
    return frozenset(d.kind for d in topology.devices if d.id in ids)


@dataclasses.dataclass(frozen=True)
class NodePattern:
    """A pattern on one node; every given field must hold.

    ``op`` and ``kernel`` take a name or a tuple of names; ``dtype``: every array
    argument has this dtype; ``min_size``/``max_size`` bound :func:`work_size`;
    ``device_kinds``: the node may run on one of these kinds; ``place``: the node's
    ``place`` attribute (the process it was assigned to); ``attrs``: attribute values
    (None: absent); ``where``: a callable(node) -> bool for anything else.
    """

    op: str | tuple | None = None
    kernel: str | tuple | None = None
    dtype: str | None = None
    min_size: int | None = None
    max_size: int | None = None
    device_kinds: tuple | None = None
    place: int | None = None
    attrs: Mapping | None = None
    where: Callable[[Node], bool] | None = None

    def test(self, node: Node, topology) -> bool:
        if not _one_of(node.op, self.op):
            return False
        if self.kernel is not None and not _one_of(getattr(node.kernel, "name", None), self.kernel):
            return False
        if self.dtype is not None:
            found = dtypes(node)
            if not found or any(d != np.dtype(self.dtype).name for d in found):
                return False
        size = work_size(node)
        if (self.min_size is not None and size < self.min_size) or (
                self.max_size is not None and size > self.max_size):
            return False
        if self.device_kinds is not None and not placement_kinds(node, topology) & set(self.device_kinds):
            return False
        if self.place is not None and node.attrs.get("place") != self.place:
            return False
        for key, value in (self.attrs or {}).items():
            if node.attrs.get(key) != value:
                return False
        return self.where is None or bool(self.where(node))

    def matches(self, nodes, topology, anchor: Node | None = None) -> Iterator[Match]:
        for node in nodes:
            if (anchor is None or node.id == anchor.id) and self.test(node, topology):
                yield Match((node,))


def producers(nodes) -> dict[int, set]:
    """node id -> ids of the nodes whose results it reads (read-after-write edges only)."""
    last_writer: dict[int, int] = {}
    found: dict[int, set] = {}
    for node in nodes:
        found[node.id] = set()
        for obj, mode in node.accesses():
            if "r" in mode and id(obj) in last_writer:
                found[node.id].add(last_writer[id(obj)])
        for obj, mode in node.accesses():
            if "w" in mode:
                last_writer[id(obj)] = node.id
    return found


@dataclasses.dataclass(frozen=True)
class Chain:
    """A producer-consumer chain: each node reads a result of the one before it.

    Chains are grown greedily in program order from each unused matching node, taking
    the earliest matching consumer; with ``same_extent`` every node launches over the
    extent of the first.
    """

    element: NodePattern = NodePattern(op="forall")
    min_len: int = 2
    max_len: int | None = None
    same_extent: bool = True

    def matches(self, nodes, topology, anchor: Node | None = None) -> Iterator[Match]:
        nodes = list(nodes)
        made = producers(nodes)
        ok = {n.id for n in nodes if self.element.test(n, topology)}
        used: set[int] = set()
        for k, node in enumerate(nodes):
            if node.id in used or node.id not in ok or (anchor is not None and node.id != anchor.id):
                continue
            chain = [node]
            for later in nodes[k + 1:]:
                if self.max_len is not None and len(chain) >= self.max_len:
                    break
                if (later.id in ok and later.id not in used and chain[-1].id in made[later.id]
                        and (not self.same_extent or later.extent == node.extent)):
                    chain.append(later)
            if len(chain) >= self.min_len:
                used.update(n.id for n in chain)
                yield Match(tuple(chain))


@dataclasses.dataclass(frozen=True)
class TopologyPattern:
    """A pattern on the machine: at least / at most so many devices of each kind.

    Keys are device kinds ('cpu', 'gpu'), 'device' (all) or 'node' (processes).
    """

    at_least: Mapping = dataclasses.field(default_factory=dict)
    at_most: Mapping = dataclasses.field(default_factory=dict)

    def __call__(self, ctx, match=None) -> bool:
        topo = ctx.topology
        return (all(topo.count(k) >= n for k, n in self.at_least.items())
                and all(topo.count(k) <= n for k, n in self.at_most.items()))

