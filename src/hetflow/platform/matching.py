"""Capability matching (SPEC §2): score devices against requirement lists, pick devices.

A requirement list is a dict ``{capability: wanted}``. A string or bool ``wanted`` must
equal the device's value; a number is a minimum; a callable is a predicate. Each
device's *match score* is the number of requirements it meets. ``prefer`` works the
same way but only breaks ties. The result is a :class:`LogicalDevice`, holding at most
one device per requirement list.
"""
from __future__ import annotations

import dataclasses
import numbers

from ..errors import ArgumentError, ArgumentTypeError, DeviceError
from .devices import Device, device_list, devices

_CAPABILITIES = tuple(field.name for field in dataclasses.fields(Device))


@dataclasses.dataclass(frozen=True)
class LogicalDevice:
    """A group of selected physical devices, used as one (SPEC §2): Devices or device ids
    (looked up in the table), none twice. An empty group (a selection that matched
    nothing) is refused where it would run."""

    devices: tuple[Device, ...]

    def __post_init__(self):
        # Checked here, not where a launch first touches a device's fields.
        found = device_list(self.devices, "LogicalDevice devices", "a list of device ids or Devices", empty=True)
        object.__setattr__(self, "devices", found)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(d.id for d in self.devices)

    def __iter__(self):
        return iter(self.devices)

    def __len__(self):
        return len(self.devices)


def _meets(device: Device, capability: str, wanted) -> bool:
    have = getattr(device, capability, None)
    if have is None:
        return False
    if callable(wanted):
        return bool(wanted(have))
    if isinstance(wanted, bool) or isinstance(have, (str, bool)):
        return have == wanted
    if isinstance(wanted, numbers.Number):
        return have >= wanted
    return have == wanted


def unmet(device: Device, require: dict) -> list[str]:
    """The requirements of ``require`` that ``device`` does not meet, as text."""
    out = []
    for cap, wanted in require.items():
        if not _meets(device, cap, wanted):
            shown = getattr(wanted, "__name__", repr(wanted))
            out.append(f"{cap}={shown} (has {getattr(device, cap, 'nothing')!r})")
    return out


def score(device: Device, require: dict) -> int:
    """Match score: how many requirements of ``require`` the device meets."""
    return sum(_meets(device, c, w) for c, w in require.items())


def _speed(device: Device) -> tuple:
    # Among equal matches prefer real hardware, then GPUs, then more compute units.
    return (not device.simulated, device.kind == "gpu", device.compute_units)


def _pick(require: dict, prefer: dict, candidates, strict: bool) -> Device:
    ranked = sorted(
        candidates,
        key=lambda d: (score(d, require), score(d, prefer), _speed(d)),
        reverse=True,
    )
    best = ranked[0]
    if strict and score(best, require) < len(require):
        lines = [f"  {d.id} ({d.name}): unmet {', '.join(unmet(d, require))}" for d in ranked]
        raise DeviceError(f"no device meets all of {require!r}:\n" + "\n".join(lines))
    return best


def select(*requirement_lists: dict, require: dict | None = None, prefer: dict | None = None,
           strict: bool = True) -> LogicalDevice:
    """Pick one device per requirement list and return them as a logical device.

    ``select(require={'kind': 'gpu'})`` picks one GPU; ``select({'kind': 'cpu'},
    {'kind': 'gpu'})`` picks a CPU and a GPU. With ``strict`` (the default) a list that
    no device fully meets raises :class:`DeviceError` naming, per device, what is
    unmet; otherwise the highest-scoring device is taken.
    """
    lists = list(requirement_lists) + ([require] if require is not None else [])
    lists = [_requirements(req, "a requirement list") for req in lists] or [{}]
    prefer = _requirements(prefer or {}, "prefer")
    table = devices()
    if len(lists) > len(table):
        raise DeviceError(f"select: {len(lists)} requirement lists pick one device each, but the machine "
                          f"has {len(table)}: {', '.join(d.id for d in table)}")
    chosen: list[Device] = []
    for req in lists:
        remaining = [d for d in table if d not in chosen]
        chosen.append(_pick(req, prefer, remaining, strict))
    return LogicalDevice(tuple(chosen))


def _requirements(given, what: str) -> dict:
    """``given``, checked to be a dict of capabilities: a misspelt one would match no
    device (or, not strict, be ignored)."""
    if not isinstance(given, dict):
        raise ArgumentTypeError(f"select: {what} must be a dict {{capability: wanted}}; got "
                                f"{type(given).__name__} {given!r}")
    unknown = [repr(cap) for cap in given if cap not in _CAPABILITIES]
    if unknown:
        raise ArgumentError(f"select: {what} {given!r} names no capability {', '.join(unknown)}; "
                            f"capabilities are {', '.join(_CAPABILITIES)}")
    return given
