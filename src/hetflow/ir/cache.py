"""A guarded cache of compiled variants, keyed by (operation, device, conditions).

What a rule derives under some conditions (a fused kernel, an offset kernel, an
executable for a device) is stored under a *guard*: the operation it came from, the
device description it was built for and the conditions that held (ranks, dtypes). When
the same guard recurs, the variant is reused instead of being built again, in the
manner of PyTorch Dynamo's guarded code cache. Hits and misses are counted.
"""
from __future__ import annotations

import threading
from typing import Callable


def _freeze(value):
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


class VariantCache:
    """Variants by guard tuple; ``hits`` and ``misses`` count lookups."""

    def __init__(self):
        self._store: dict[tuple, object] = {}
        self._lock = threading.RLock()
        self.hits = 0
        self.misses = 0

    @staticmethod
    def guard(operation, device=(), conditions=()) -> tuple:
        """The key: every part frozen into tuples so equal conditions give equal keys."""
        return (_freeze(operation), _freeze(device), _freeze(conditions))

    def lookup(self, operation, device=(), conditions=()):
        """The stored variant, or None (counted as a hit or a miss)."""
        key = self.guard(operation, device, conditions)
        with self._lock:
            if key in self._store:
                self.hits += 1
                return self._store[key]
            self.misses += 1
            return None

    def get_or_build(self, operation, device, conditions, build: Callable[[], object]):
        """The stored variant for the guard, building and storing it on a miss."""
        key = self.guard(operation, device, conditions)
        with self._lock:
            if key in self._store:
                self.hits += 1
                return self._store[key]
            self.misses += 1
        value = build()  # outside the lock: compiling may take long
        with self._lock:
            return self._store.setdefault(key, value)

    def __contains__(self, key: tuple) -> bool:
        with self._lock:
            return key in self._store

    def __len__(self) -> int:
        with self._lock:
            return len(self._store)

    def clear(self) -> None:
        with self._lock:
            self._store.clear()

    def stats(self) -> dict:
        return {"entries": len(self), "hits": self.hits, "misses": self.misses}
