"""hetflow's default rules (``RuleSet.default()``), highest priority first.

- ``fuse-elementwise`` (100): fuse producer-consumer chains of ``forall`` launches over
  the same extent into one generated kernel (intermediates become local scalars).
- ``drop-lost-devices`` (90): a launch placed on a device that was removed or failed is
  placed on its remaining devices, shares renormalised (or left to the runtime).
- ``adopt-new-devices`` (80): when a device is added, compile every launched kernel for
  the devices it lacks and spread launches evenly over all devices (work stealing
  then balances them).
- ``resplit-on-node-change`` (70): a launch split over nodes is cut again when the node
  count changes.
"""
from __future__ import annotations

from .actions import Compile, Fuse, Partition, Split
from .graph import Node
from .patterns import Chain, NodePattern
from .rules import Rule


def drop_lost_devices(ctx, match) -> Node | None:
    """The matched launch without the devices the topology no longer has (None: unchanged)."""
    node = match.node
    placed = node.attrs.get("devices")
    if not placed:
        return None
    alive = {d.id for d in ctx.topology.devices}
    kept = tuple(d for d in placed if d in alive)
    if len(kept) == len(placed):
        return None
    if not kept:
        return node.with_attrs(devices=None, shares=None)
    shares = node.attrs.get("shares") or {d: 1.0 for d in placed}
    total = sum(shares.get(d, 0.0) for d in kept)
    new = {d: round(shares.get(d, 0.0) / total, 6) if total > 0 else round(1 / len(kept), 6) for d in kept}
    return node.with_attrs(devices=kept, shares=new)


def default_rules() -> list[Rule]:
    return [
        Rule("fuse-elementwise", match=Chain(NodePattern(op="forall")), then=Fuse(), priority=100,
             description="fuse producer-consumer chains of launches over one extent"),
        Rule("drop-lost-devices", match=NodePattern(op="forall"), then=drop_lost_devices, priority=90,
             description="take removed or failed devices out of placements"),
        Rule("adopt-new-devices", when="happened('device_added')", match=NodePattern(op="forall"),
             then=[Compile(), Partition()], priority=80,
             description="compile for new devices and spread launches over them"),
        Rule("resplit-on-node-change", when="node.pieces > 1 and node.pieces != count('node')",
             match=NodePattern(op="forall"), then=Split(), priority=70,
             description="re-cut launches split over nodes when the node count changes"),
    ]
