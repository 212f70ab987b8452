"""Contexts (SPEC §2): a reference-counted handle on a logical device.

A context starts with one reference. ``retain`` adds one and ``release`` drops one;
after the last release every use raises :class:`InvalidContextError`, so a library
handed a context retains it to keep the application's release from pulling it away.
"""
from __future__ import annotations

import itertools
import threading

from ..errors import InvalidContextError
from .devices import Device, device_list, devices, find_devices
from .matching import LogicalDevice

_ids = itertools.count(1)
_live: dict[int, "Context"] = {}
_lock = threading.Lock()


def _as_logical(target) -> LogicalDevice:
    if target is None:  # every real device; the simulator only when asked for by id
        return LogicalDevice(tuple(d for d in devices() if not d.simulated))
    if isinstance(target, LogicalDevice):
        return target
    if isinstance(target, Device):  # checked as a list of one: a refusal names the context
        target = (target,)
    if isinstance(target, str):  # what forall's device= names: an id, 'all' or 'gpu'
        return LogicalDevice(find_devices(target))
    return LogicalDevice(device_list(target, "context device", "None, a device id, a Device, a list of ids "
                                     "or Devices, or a LogicalDevice"))


class Context:
    """A reference-counted context on a logical device: None (every real device), what
    ``forall``'s ``device=`` names (an id, ``'all'``, ``'gpu'``), a Device, a list naming
    at least one device, none twice, or a LogicalDevice."""

    def __init__(self, logical_device=None):
        self.logical_device = _as_logical(logical_device)
        self.id = next(_ids)
        self._refs = 1
        with _lock:
            _live[self.id] = self

    @property
    def devices(self) -> tuple[Device, ...]:
        self.check()
        return self.logical_device.devices

    @property
    def refcount(self) -> int:
        return self._refs

    def check(self) -> None:
        """Raise InvalidContextError unless the context is alive."""
        if self._refs <= 0:
            raise InvalidContextError(f"context {self.id} was released (devices {self.logical_device.ids})")

    def retain(self) -> "Context":
        with _lock:
            self.check()
            self._refs += 1
        return self

    def release(self) -> None:
        with _lock:
            self.check()
            self._drop_locked()

    def release_if_alive(self) -> None:
        """:meth:`release`, or nothing where the context was released already: an owner
        dropping its own reference, which the application may have released too (checked
        and dropped under one lock: another thread may release the last one meanwhile)."""
        with _lock:
            if self._refs > 0:
                self._drop_locked()

    def _drop_locked(self) -> None:
        self._refs -= 1
        if self._refs == 0:
            _live.pop(self.id, None)

    def __enter__(self):
        self.check()
        return self

    def __exit__(self, *exc):
        self.release()

    def __repr__(self):
        state = f"refs={self._refs}" if self._refs > 0 else "released"
        return f"Context({self.id}, {list(self.logical_device.ids)}, {state})"


def lookup(context_id: int) -> Context:
    """Find a live context by id; unknown or released ids raise InvalidContextError."""
    with _lock:
        ctx = _live.get(context_id)
    if ctx is None:
        raise InvalidContextError(f"unknown context id {context_id!r}: no live context has it (never "
                                  f"created, or released)")
    return ctx
