"""hetflow's default rules (``RuleSet.default()``), highest priority first.

- ``fuse-elementwise`` (100): fuse producer-consumer chains of ``forall`` launches over
  the same extent into one generated kernel (intermediates become local scalars).
- ``drop-lost-devices`` (90): a launch placed on a device that was removed or failed is
  placed on its remaining devices, shares renormalised (or left to the runtime).
- ``drop-idle-devices`` (85): a device that ran none of a co-executed launch's indices
  ``IDLE_RUNS`` times in a row (its copies outlast the loop on the other devices) is
  taken out of that launch's placement, which saves its copies on every later run.
- ``adopt-new-devices`` (80): when a device is added, compile every launch placed on
  fewer devices than the topology has for the devices it lacks and spread it evenly
  over all devices (work stealing then balances them). A launch already on every
  device is left alone, so a user rule that sets shares over all devices does not
  fight it.
- ``resplit-on-node-change`` (70): a launch split over nodes (one placed piece per
  node, ``node.nodes``) is cut again when the node count changes; other splits are
  left alone.
"""
from __future__ import annotations

from .actions import Compile, Fuse, Partition, Split
from .graph import Node
from .patterns import Chain, NodePattern
from .rules import Rule
from .runner import IDLE_RUNS


def _without(node: Node, gone) -> Node | None:
    """``node`` placed on its devices but ``gone``, shares renormalised (None: unchanged)."""
    placed = node.attrs.get("devices")
    if not placed:
        return None
    kept = tuple(d for d in placed if d not in gone)
    if len(kept) == len(placed):
        return None
    if not kept:
        return node.with_attrs(devices=None, shares=None)
    shares = node.attrs.get("shares") or {d: 1.0 for d in placed}
    total = sum(shares.get(d, 0.0) for d in kept)
    new = {d: round(shares.get(d, 0.0) / total, 6) if total > 0 else round(1 / len(kept), 6) for d in kept}
    return node.with_attrs(devices=kept, shares=new)


def drop_lost_devices(ctx, match) -> Node | None:
    """The matched launch without the devices the topology no longer has (None: unchanged)."""
    alive = {d.id for d in ctx.topology.devices}
    return _without(match.node, [d for d in match.node.attrs.get("devices") or () if d not in alive])


def idle_devices(ctx, node: Node, candidates) -> list:
    """Those of ``candidates`` that ran none of ``node``'s last IDLE_RUNS co-executed launches."""
    return [d for d in candidates if ctx.variables.get(f"idle.{node.kernel.name}.{d}", 0) >= IDLE_RUNS]


def drop_idle_devices(ctx, match) -> Node | None:
    """The matched launch without the devices that ran none of its last IDLE_RUNS
    co-executed launches (None: unchanged). At least one device stays."""
    placed = match.node.attrs.get("devices") or ()
    idle = idle_devices(ctx, match.node, placed)
    return _without(match.node, idle) if len(idle) < len(placed) else None


def default_rules() -> list[Rule]:
    return [
        Rule("fuse-elementwise", match=Chain(NodePattern(op="forall")), then=Fuse(), priority=100,
             description="fuse producer-consumer chains of launches over one extent"),
        Rule("drop-lost-devices", match=NodePattern(op="forall"), then=drop_lost_devices, priority=90,
             description="take removed or failed devices out of placements"),
        Rule("drop-idle-devices", when="defined('devices.idle') and devices.idle > 0",
             match=NodePattern(op="forall"), then=drop_idle_devices, priority=85,
             description="take a device that keeps running none of a co-executed launch out of it"),
        Rule("adopt-new-devices", when="happened('device_added') and node.devices < count('device')",
             match=NodePattern(op="forall"),
             then=[Compile(), Partition()], priority=80,
             description="compile for new devices and spread launches over them"),
        Rule("resplit-on-node-change", when="node.nodes > 0 and node.nodes != count('node')",
             match=NodePattern(op="forall"), then=Split(), priority=70,
             description="re-cut launches split over nodes when the node count changes"),
    ]
