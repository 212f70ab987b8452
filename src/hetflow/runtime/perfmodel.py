"""History-based performance model: measured throughput per (kernel, device), StarPU style.

After each loop the throughput every worker achieved (indices per second of busy time)
refines an exponential moving average stored per ``(kernel key, device key)``; before
the next loop :meth:`PerfModel.shares` turns those figures into the fractions of the
range each worker starts with, so stealing only has to fix the residual error.

The history is one JSON file, ``perfmodel.json`` in the code repository directory
(``$HETFLOW_CACHE_DIR``, else ``~/.cache/hetflow``). It is written atomically (a temporary
file then ``os.replace``), and merged with what other processes wrote meanwhile; a
loop run hundreds of times a second saves at most every ``SAVE_INTERVAL`` seconds, and
what is left is saved when the process exits. A cache that cannot be written is warned
of once; the history then lives in memory. :func:`forget_performance_history` (``hetflow
forget-performance-history``) removes it, for a model to learn afresh.
Keys are opaque strings; device keys should name the kind of unit, not its slot (e.g.
one key for every core of a CPU model, one per GPU model), so that history carries over
between machines of the same build.
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import pathlib
import tempfile
import threading
import time

from ..errors import ArgumentError
from ..platform.repository import default_root, repository

log = logging.getLogger(__name__)

FILE_NAME = "perfmodel.json"
COEXEC = "co-execution"  # the entry holding a kernel's co-execution overhead
SAVE_INTERVAL = 2.0
_VERSION = 1


class PerfModel:
    """Throughput history for ``(kernel_key, device_key)`` pairs, backed by a JSON file.

    ``alpha`` is the weight of a new measurement in the moving average (1: keep only the
    latest run). The file is read lazily on first use.
    """

    def __init__(self, path: str | os.PathLike | None = None, alpha: float = 0.5):
        if not 0 < alpha <= 1:
            raise ArgumentError(f"alpha must lie in (0, 1], got {alpha!r}")
        self.path = pathlib.Path(path) if path is not None else default_root() / FILE_NAME
        self.alpha = alpha
        self._entries: dict[str, dict[str, dict]] | None = None
        self._dirty: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._saved_at = -float("inf")
        self._save_failed = False  # warned once that the cache is unwritable
        self._exit_hook = False
        self.version = 0  # bumped at every change of what the model holds (estimates keyed by it)

    # reading -------------------------------------------------------------------------
    def _read_file(self) -> dict[str, dict[str, dict]]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable performance history %s: %s", self.path, exc)
            return {}
        if not isinstance(data, dict) or data.get("version") != _VERSION \
                or not isinstance(data.get("entries"), dict):
            log.warning("ignoring performance history %s: unknown format", self.path)
            return {}
        return data["entries"]

    def _table(self):
        if self._entries is None:
            self._entries = self._read_file()
            self.version += 1
        return self._entries

    def throughput(self, kernel_key: str, device_key: str) -> float | None:
        """The averaged throughput (indices/s) of a kernel on a device, None if never measured."""
        with self._lock:
            entry = self._table().get(kernel_key, {}).get(device_key)
        return None if entry is None else entry["throughput"]

    def throughputs(self, kernel_key: str, device_keys) -> list:
        """:meth:`throughput` of each of ``device_keys``, looked up at once."""
        with self._lock:
            per_kernel = self._table().get(kernel_key, {})
            found = [per_kernel.get(k) for k in device_keys]
        return [None if e is None else e["throughput"] for e in found]

    def shares(self, kernel_key: str, device_keys) -> list[float]:
        """Predicted fractions of a loop for workers on ``device_keys`` (one key per worker).

        Proportional to the known throughputs; a device never measured is predicted at
        the mean of the known ones; with no history at all the shares are equal.
        """
        keys = list(device_keys)
        if not keys:
            raise ArgumentError("shares needs at least one device key")
        rates = self.throughputs(kernel_key, keys)
        known = [r for r in rates if r]
        if not known:
            return [1.0 / len(keys)] * len(keys)
        guess = sum(known) / len(known)
        rates = [r if r else guess for r in rates]
        total = sum(rates)
        return [r / total for r in rates]

    # learning --------------------------------------------------------------------------
    def observe(self, kernel_key: str, device_key: str, throughput: float) -> None:
        """Fold one measured throughput into the moving average (not yet saved)."""
        if not throughput > 0 or throughput == float("inf"):
            raise ArgumentError(f"throughput must be positive and finite, got {throughput!r}")
        with self._lock:
            per_kernel = self._table().setdefault(kernel_key, {})
            old = per_kernel.get(device_key)
            if old is None:
                value, samples = throughput, 1
            else:
                value = self.alpha * throughput + (1 - self.alpha) * old["throughput"]
                samples = old["samples"] + 1
            per_kernel[device_key] = {"throughput": value, "samples": samples,
                                      "updated": time.time()}
            self._dirty.add((kernel_key, device_key))
            self.version += 1

    def record(self, kernel_key: str, device_key: str, throughput: float) -> None:
        """:meth:`observe`, then save (throttled) as :meth:`update` does."""
        self.observe(kernel_key, device_key, throughput)
        self._save_throttled()

    def overhead(self, kernel_key: str) -> float | None:
        """Seconds a co-executed launch of the kernel costs beyond its work (thread hand-offs,
        halo copies, stealing), averaged; None if never measured."""
        with self._lock:
            entry = self._table().get(kernel_key, {}).get(COEXEC)
        return None if entry is None else entry["overhead_s"]

    def observe_overhead(self, kernel_key: str, seconds: float) -> None:
        """Fold one co-executed launch's wall time beyond its workers' ideal into the average."""
        seconds = max(0.0, float(seconds))
        with self._lock:
            per_kernel = self._table().setdefault(kernel_key, {})
            old = per_kernel.get(COEXEC)
            value = seconds if old is None else self.alpha * seconds + (1 - self.alpha) * old["overhead_s"]
            per_kernel[COEXEC] = {"overhead_s": value, "samples": (old or {}).get("samples", 0) + 1,
                                  "updated": time.time()}
            self._dirty.add((kernel_key, COEXEC))
            self.version += 1

    def update(self, kernel_key: str, report, device_key=None, save: bool = True) -> None:
        """Refine the model from a :class:`~hetflow.runtime.report.RunReport`.

        Each device key gets the mean throughput of the workers that map to it (failed
        workers and workers that ran nothing are left out). ``device_key(stats)`` maps a
        worker's stats to its key; the default is the worker's ``device_id``.
        """
        key_of = device_key or (lambda stats: stats.device_id)
        rates: dict[str, list[float]] = {}
        for stats in report.workers:
            if not stats.failed and stats.indices > 0 and stats.busy_s > 0 and key_of(stats) is not None:
                rates.setdefault(key_of(stats), []).append(stats.throughput)
        for key, values in rates.items():
            self.observe(kernel_key, key, sum(values) / len(values))
        if save and rates:
            self._save_throttled()

    def _save_throttled(self) -> None:
        if time.monotonic() - self._saved_at >= SAVE_INTERVAL:
            self._save_logged()
        elif not self._exit_hook:
            self._exit_hook = True
            atexit.register(self._save_if_dirty)

    def _save_if_dirty(self) -> None:
        if self._dirty:
            self._save_logged()

    def _save_logged(self) -> None:
        """:meth:`save`, an unwritable cache warned of (the history stays in memory, to
        be saved with the next measurements): a launch must not fail for it."""
        try:
            self.save()
        except OSError as exc:
            self._saved_at = time.monotonic()  # not again at every launch
            log.log(logging.DEBUG if self._save_failed else logging.WARNING,
                    "could not save the performance history %s: %s", self.path, exc)
            self._save_failed = True

    # writing ---------------------------------------------------------------------------
    def save(self) -> None:
        """Write the history: our new measurements over what the file holds now."""
        with self._lock:
            merged = self._read_file()
            for kernel_key, device_key in self._dirty:
                merged.setdefault(kernel_key, {})[device_key] = \
                    self._entries[kernel_key][device_key]
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".perfmodel-", suffix=".json",
                                       dir=self.path.parent)
            try:
                with os.fdopen(fd, "w") as fh:
                    # compact: json's C encoder takes no indent, and a save of a few
                    # hundred entries runs in a launch's thread (2 ms with indent=1)
                    fh.write(json.dumps({"version": _VERSION, "entries": merged}, separators=(",", ":"),
                                        sort_keys=True))
                os.replace(tmp, self.path)
            except BaseException:
                os.unlink(tmp)
                raise
            self._entries = merged  # other processes' measurements too
            self._dirty.clear()
            self._saved_at = time.monotonic()
            self.version += 1

    def forget(self) -> dict[str, list[str]]:
        """Remove the history, saved and not yet saved: the model then knows nothing, as
        on a first run. Returns what it held: kernel key -> its device keys."""
        with self._lock:
            held = self._read_file()
            for kernel_key, per_device in (self._entries or {}).items():
                held.setdefault(kernel_key, {}).update(per_device)
            self.path.unlink(missing_ok=True)
            self._entries = {}
            self._dirty.clear()
            self.version += 1
        return {k: sorted(devices) for k, devices in sorted(held.items()) if devices}


_shared_lock = threading.Lock()
_shared: tuple | None = None  # (the code repository, its performance model)


def perf_model() -> PerfModel:
    """The process's model, kept beside the code repository in use (``HETFLOW_CACHE_DIR``)."""
    global _shared
    repo = repository()
    found = _shared
    if found is not None and found[0] is repo:  # every co-executed launch asks: kept cheap
        return found[1]
    path = repo.root / FILE_NAME
    with _shared_lock:
        if _shared is None or _shared[1].path != path:
            _shared = (repo, PerfModel(path))
        else:
            _shared = (repo, _shared[1])
        return _shared[1]


def forget_performance_history() -> dict[str, list[str]]:
    """Forget the performance model's measured history (``perfmodel.json`` in
    ``$HETFLOW_CACHE_DIR``, else ``~/.cache/hetflow``) and what this process measured:
    after new hardware, or a history learnt on a loaded machine. Launches then learn
    the rates afresh. Returns what was forgotten: kernel key -> its device keys. A
    process running meanwhile keeps what it had read, and saves only what it measures
    afterwards."""
    return perf_model().forget()


def kernel_key(kernel, ndim: int) -> str:
    """The model's key of a kernel launched with rank ``ndim``: its name and source digest."""
    return f"{kernel.name}-{kernel.source_hash[:12]}-{ndim}d"


_device_keys: dict = {}


def device_key(device) -> str:
    """The model's key of a kind of device (every core of one CPU model shares it)."""
    found = _device_keys.get(device.id)
    if found is None:
        found = _device_keys[device.id] = f"{device.kind}:{device.name}:{device.arch}"
    return found
