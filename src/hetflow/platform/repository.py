"""The code repository: compiled executables on disk, keyed by their description data.

Layout (default root ``~/.cache/hetflow``, ``HETFLOW_CACHE_DIR`` overrides)::

    kernels/<kernel>-<source hash>/<kind>-<rank>d-<variant>-<arch>/
        description.json   description data + digest of module.py
        module.py          generated chunk entry, calling the kernel (kernels.codegen)
        __pycache__/       Numba's machine code for it (index + one file per signature),
                           the kernel's code included

Loading for a device (SPEC §2 "Kernel objects" 2): use a stored executable that is
optimal for the device; remove stale ones (other architecture or compiler); compile
the kernel's function object when none fits; fail with KernelError when the
kernel has none (a kernel whose code was dropped).
A corrupt entry (a damaged file: description.json that does not parse, module.py that
fails its digest) is removed with a warning and compiled again, never a crash.

Several processes (MPI ranks, a test run beside a benchmark) may share one repository:
entries appear whole (written aside, then renamed), Numba's cache of an entry is read
and written under a file lock, and the generated code runs in a module named after its
entry, which every process that loads the entry creates (Numba's cached machine code
imports the module it was compiled in). One process may remove an entry while another
loads it (it found it stale, or evicted it): the other looks it up again, and an entry
removed after loading runs from machine code compiled, and not stored, there.

The repository is bounded: at most ``max_entries`` entries (``HETFLOW_CACHE_MAX_ENTRIES``,
default ``DEFAULT_MAX_ENTRIES``), so that no program (one making fresh index functions
or kernels in a loop) can fill the disk. Writing an entry past the limit removes the
least recently used ones (by their folder's modification time, which loading refreshes),
except those this process has loaded.
"""
from __future__ import annotations

import builtins
import hashlib
import inspect
import json
import logging
import os
import random
import re
import shutil
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

import numba
import numpy as np

from ..errors import KernelError, warn_user
from ..kernels import atomic, checks, viewtypes
from ..kernels.codegen import BODY, ENTRY, NONNEG, PARALLEL, PIECE, ROWS, constructor, expanded, generate
from ..kernels.kernel import Kernel, function_digest
from ..cuda_compat import cuda_module
from .executable import BLOCK_THREADS, BLOCKS_PER_SM, ERROR_MODEL, Description, Executable

try:
    import fcntl
except ImportError:  # not POSIX: Numba's cache goes unlocked
    fcntl = None

log = logging.getLogger("hetflow.repository")

# The options recorded in an entry's description data. The error model is NumPy's on
# every device (see executable.ERROR_MODEL): numba-cuda's own default, given to Numba.
CPU_OPTIONS = {"nogil": True, "cache": True, "error_model": ERROR_MODEL}
GPU_OPTIONS = {"cache": True, "error_model": ERROR_MODEL}


DEFAULT_MAX_ENTRIES = 1000
# Tries to store a built entry while other processes store or replace the same one.
STORE_ATTEMPTS = 12


def max_entries_from_env() -> int:
    """``HETFLOW_CACHE_MAX_ENTRIES`` (a positive integer), else ``DEFAULT_MAX_ENTRIES``."""
    text = os.environ.get("HETFLOW_CACHE_MAX_ENTRIES")
    if not text:
        return DEFAULT_MAX_ENTRIES
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise KernelError(f"HETFLOW_CACHE_MAX_ENTRIES must be a positive integer (the code repository's "
                          f"entry limit), got {text!r}")
    return value


class CorruptEntry(Exception):
    """An on-disk entry with a damaged file (internal: always recompiled)."""


class StoredCodeUnreadable(Exception):
    """Numba's stored machine code of an executable that could not be read (internal:
    the runtime drops it and compiles again); what reading raised is its cause."""


class EntryGone(Exception):
    """An entry removed by another process while this one loaded it (internal: looked
    up again)."""

    def __init__(self, entry: Path):
        super().__init__(str(entry))
        self.entry = entry


def default_root() -> Path:
    return Path(os.environ.get("HETFLOW_CACHE_DIR") or Path.home() / ".cache" / "hetflow")


def variant_key(views: dict, checked: bool = False, options: dict | None = None) -> str:
    """Digest of what shapes the generated code besides the kernel: the views' structure
    (not their numbers), checked mode and the kernel's other options (``Kernel.options``).
    One executable per variant."""
    text = repr(sorted((name, _stable(low.key)) for name, low in views.items()))
    text += ("|boundscheck" if checked else "") + (f"|{sorted(options.items())}" if options else "")
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def _stable(key):
    """A view key with its co-map functions by their code and globals, not their address."""
    if isinstance(key, tuple):
        return tuple(_stable(k) for k in key)
    if callable(key) and hasattr(getattr(key, "py_func", key), "__code__"):
        return f"function:{function_digest(key)}"
    return key


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:60]


class CodeRepository:
    """Compiled executables, in memory for this process and on disk for the next one."""

    def __init__(self, root: str | os.PathLike | None = None, max_entries: int | None = None):
        self.root, self._private = _usable(Path(root) if root is not None else default_root())
        self.max_entries = max_entries if max_entries is not None else max_entries_from_env()
        self._memo: dict[tuple, Executable] = {}
        self._device_fns: dict[tuple, object] = {}
        self._lock = threading.RLock()
        self.compiled = 0      # executables compiled from source in this process
        self.loaded = 0        # executables found on disk
        self.replaced = 0      # stale or corrupt entries, or unloadable machine code, removed
        self.evicted = 0       # least recently used entries removed to keep max_entries

    # -- lookup -----------------------------------------------------------------------
    def executable(self, kernel, device, ndim: int, views: dict | None = None) -> Executable:
        """The executable of ``kernel`` for ``device``, a rank-``ndim`` launch and ``views``
        (checked when ``kernel.boundscheck``; compiled with ``kernel.options``)."""
        views = views or {}
        variant = variant_key(views, kernel.boundscheck, kernel.options)
        memo_key = (kernel.source_hash, kernel.name, device.id, ndim, variant)
        with self._lock:
            exe = self._memo.get(memo_key)
            if exe is None:
                exe = self._memo[memo_key] = self._find_or_load(kernel, device, ndim, views, variant)
            return exe

    def _find_or_load(self, kernel, device, ndim, views, variant) -> Executable:
        """:meth:`_find_or_build`, again where the entry went while it was being loaded:
        another process found it stale, or evicted it, between this one's finding (or
        storing) it and compiling from its module.py (under mpiexec after an upgrade)."""
        for _ in range(STORE_ATTEMPTS):
            try:
                return self._find_or_build(kernel, device, ndim, views, variant)
            except EntryGone as gone:
                log.info("%s went while it was being loaded; looking again", gone.entry)
        raise KernelError(f"cannot load the executable of kernel {kernel.name!r}: another process removed "
                          f"its entry in {self.root} each of {STORE_ATTEMPTS} times")

    def forget(self, exe: Executable, exc: StoredCodeUnreadable) -> None:
        """Drop an executable whose stored machine code could not be loaded (``exc``):
        Numba's cache of it goes, module.py (its digest held) stays, the next lookup
        compiles it again."""
        with self._lock:
            for key, value in list(self._memo.items()):
                if value is exe:
                    del self._memo[key]
            warn_user(f"hetflow: could not load the machine code stored in {exe.path} ({exc}); "
                      f"compiling it again", RuntimeWarning)
            shutil.rmtree(Path(exe.path) / "__pycache__", ignore_errors=True)
            self.replaced += 1

    def entries(self, kernel=None) -> list[Path]:
        base = self.root / "kernels"
        folders = [base / f"{kernel.name}-{kernel.source_hash[:16]}"] if kernel else _listed(base, "*")
        return sorted(p for folder in folders for p in _listed(folder, "*") if p.is_dir())

    def _find_or_build(self, kernel, device, ndim, views, variant) -> Executable:
        kdir = self.root / "kernels" / f"{kernel.name}-{kernel.source_hash[:16]}"
        prefix = f"{device.kind}-{ndim}d-{variant}-"
        stored = sorted(_listed(kdir, prefix + "*"))
        for entry in stored:
            found = self._read_or_drop(entry)
            if found is None:
                continue
            desc, text = found
            if desc.optimal(device) or (not kernel.compilable and desc.compatible(device)):
                self.loaded += 1
                _touch(entry)
                return self._instantiate(kernel, device, desc, entry, text, ndim, views)
            if kernel.compilable:  # stale: another architecture or compiler; replace it
                self._drop_stale(entry, desc)
        if not kernel.compilable:
            built = ", ".join(p.name for p in stored) or "none"
            raise KernelError(
                f"kernel {kernel.name!r} has no source and no executable compatible with {device.id} "
                f"({device.kind}, {device.arch}, rank {ndim}); stored executables: {built}")
        return self._build(kernel, device, ndim, views, variant, kdir / (prefix + _slug(device.arch)))

    # -- disk ---------------------------------------------------------------------------
    def _read_or_drop(self, entry: Path):
        """(description, module text) of a stored entry; None when it is gone or going
        (another process replaced it), corrupt or of another format (all removed)."""
        try:
            found = _read_entry(entry)
        except FileNotFoundError:
            # A whole entry has both files (it appears by a rename): a folder without one
            # is being removed, or was half made again (Numba's cache saved into an entry
            # another process removed), and would block storing a new one here.
            _remove(entry)
            return None
        except CorruptEntry as exc:
            warn_user(f"hetflow: corrupt code repository entry {entry} ({exc}) removed; recompiling",
                      RuntimeWarning)
            _remove(entry)
            self.replaced += 1
            return None
        if found is None:
            self._drop_stale(entry, None)
        return found

    def _drop_stale(self, entry: Path, desc) -> None:
        log.info("replacing stale executable %s (built for %s)", entry, desc.arch if desc else "another format")
        shutil.rmtree(entry, ignore_errors=True)
        self.replaced += 1

    def _build(self, kernel, device, ndim, views, variant, entry: Path) -> Executable:
        checked = kernel.boundscheck
        gen = _generate(kernel, device, ndim, views, checked)
        options = dict(CPU_OPTIONS if device.kind == "cpu" else GPU_OPTIONS)
        if checked:
            options["boundscheck"] = True
        options.update(kernel.options)
        desc = Description.for_device(kernel, device, ndim, variant, options)
        meta = {"description": desc.to_json(), "module_sha256": hashlib.sha256(gen.text.encode()).hexdigest(),
                "user_file": kernel.filename}
        # Several processes (MPI ranks) may build the same entry at once: each writes a
        # private folder and renames it into place, which is atomic; a loser uses the winner's.
        tmp = entry.parent / f".{entry.name}.{os.getpid()}.{threading.get_ident()}"
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "module.py").write_text(gen.text)
        (tmp / "description.json").write_text(json.dumps(meta, indent=1))
        for attempt in range(STORE_ATTEMPTS):
            try:
                os.rename(tmp, entry)
            except OSError as exc:
                error = exc
                # Ranks that found one stale entry drop it and store theirs at once: a
                # random pause lets one of them win before the others look again.
                time.sleep(random.uniform(0, 0.002 * (attempt + 1)))
                found = self._read_or_drop(entry)
                if found is None:  # the winner's entry went or was damaged: try again
                    continue
                if found[0].optimal(device):
                    shutil.rmtree(tmp, ignore_errors=True)
                    return self._instantiate(kernel, device, found[0], entry, found[1], ndim, views)
                self._drop_stale(entry, found[0])
                continue
            self.compiled += 1
            self._evict(keep=entry)
            return self._instantiate(kernel, device, desc, entry, gen.text, ndim, views)
        shutil.rmtree(tmp, ignore_errors=True)
        raise KernelError(f"cannot store the executable of kernel {kernel.name!r} as {entry}: {error}")

    def _evict(self, keep: Path) -> None:
        """Remove the least recently used entries past ``max_entries`` (not ``keep``, nor
        those this process loaded: their machine code may still be written)."""
        entries = self.entries()
        excess = len(entries) - self.max_entries
        if excess <= 0:
            return
        in_use = {Path(exe.path) for exe in self._memo.values()} | {keep}
        for entry in sorted((e for e in entries if e not in in_use), key=_last_used)[:excess]:
            log.info("code repository over %d entries: removing the least recently used, %s",
                     self.max_entries, entry)
            shutil.rmtree(entry, ignore_errors=True)
            self.evicted += 1
            try:
                entry.parent.rmdir()  # the kernel's folder, once empty
            except OSError:
                pass

    # -- turning module text into compiled functions ----------------------------------------
    def _instantiate(self, kernel, device, desc, entry: Path, text: str, ndim, views) -> Executable:
        module_file = str(entry / "module.py")
        checked = bool(desc.options.get("boundscheck"))
        try:
            ns = self._run_module(kernel, device, entry, text, ndim, views, checked)
            # (Numba's cache wants the module's file: it fails if the entry went meanwhile)
            entry_fn, parallel = _compile_functions(ns, device, checked, desc.options.get("fastmath", False))
        except Exception as exc:
            if not os.path.exists(module_file):
                raise EntryGone(entry) from exc
            raise
        if not device.simulated:  # the simulator caches nothing
            for fn in (entry_fn, parallel, ns[PIECE] if parallel is not None else None):
                _lock_machine_code(fn, entry)
                if device.kind == "cpu":
                    _mark_unreadable(fn)
        if checked:
            bounds = checks.Bounds(kernel.name, kernel.params[ndim:], views)
            entry_fn, parallel = _checked(entry_fn, device, bounds)
        user_file = kernel.filename or str(entry)
        params = tuple(p for d in kernel.params[ndim:] for p in expanded(d, views.get(d)))
        return Executable(desc, entry_fn, params, str(entry), module_file, user_file, parallel)

    def _run_module(self, kernel, device, entry: Path, text: str, ndim, views, checked) -> dict:
        """The namespace of an entry's module after running its text (functions not yet
        compiled): the kernel compiled as its body, the view constructors and what the
        entry uses."""
        ns = _module_namespace(entry)
        target = viewtypes.target_of(device)
        # A kernel without code runs only from Numba's cache of the entry, which holds it.
        module = ns["__name__"]
        ns[BODY] = self.device_function(kernel, device, checked, module) if kernel.compilable else None
        ns[NONNEG] = viewtypes.nonneg(target)
        for k, name in enumerate(kernel.params[ndim:]):
            if name in views or checked:
                ns[constructor(k)] = viewtypes.constructor(views.get(name), checked, target)
        ns["__hf_prange"], ns["__hf_np"] = numba.prange, np
        ns["__hf_claim"] = atomic.add
        if device.kind == "gpu":
            ns["__hf_cuda"] = cuda_module()
        try:
            exec(compile(text, str(entry / "module.py"), "exec"), ns)
        except SyntaxError as exc:
            raise KernelError(f"generated code for kernel {kernel.name!r} does not parse: {exc}") from exc
        return ns

    def device_function(self, kernel, device, checked: bool = False, module: str | None = None,
                        caller_fastmath=None):
        """``kernel``'s function compiled for ``device`` as a function its entry (or
        another kernel, compiled with ``caller_fastmath``) calls; kernels it calls become
        device functions too. They belong to the entry's ``module``: Numba's cached
        machine code imports the module of each function in it, and the kernel's own
        may not exist in a later process (None: the kernel's own module, for code that
        is not cached)."""
        inline = kernel.inline
        if inline is None and caller_fastmath is not None and caller_fastmath != kernel.fastmath:
            # Inlined into Numba's IR of its caller, it would take the caller's flags; a call
            # (which LLVM inlines) keeps its own on its instructions.
            inline = "never"
        key = (kernel.source_hash, repr(kernel.options), inline, device.kind, checked, module)
        with self._lock:
            fn = self._device_fns.get(key)
            if fn is None:
                fn = self._device_fns[key] = _device_wrapper(device, checked, kernel.fastmath, inline)(
                    kernel.function_with(lambda v: self._callee(v, device, checked, module, kernel.fastmath), module))
            return fn

    def _callee(self, value, device, checked, module, caller_fastmath):
        """What a global ``value`` of a kernel compiled with ``caller_fastmath`` becomes
        in compiled code on ``device``."""
        if isinstance(value, Kernel):
            return self.device_function(value, device, checked, module, caller_fastmath)
        if value is viewtypes.SLOT:
            return viewtypes.slot(viewtypes.target_of(device))
        if device.kind == "gpu" and isinstance(value, numba.core.registry.CPUDispatcher):
            return _device_wrapper(device, checked)(value.py_func)  # an @njit function, for the GPU
        return value


def _listed(folder: Path, pattern: str) -> list[Path]:
    """What in ``folder`` matches ``pattern``; nothing where there is no folder, or where
    another process removes it while it is listed (evicting a kernel's last entry)."""
    try:
        return list(folder.glob(pattern))
    except FileNotFoundError:  # (glob checks the folder is there, then lists it)
        return []


def _touch(entry: Path) -> None:
    """Mark ``entry`` used now (the eviction order)."""
    try:
        os.utime(entry)
    except OSError:  # another process removed it, or a read-only repository
        pass


def _last_used(entry: Path) -> float:
    try:
        return entry.stat().st_mtime
    except OSError:
        return 0.0


def _usable(root: Path):
    """(root, None) when ``root`` can hold entries; else (a private temporary folder, its
    handle), with one warning: a cache path that is a file or cannot be written costs
    this process its reuse of compiled code, never its run."""
    try:
        kernels = root / "kernels"
        kernels.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=kernels):
            pass
        return root, None
    except OSError as exc:
        private = tempfile.TemporaryDirectory(prefix="hetflow-code-")
        warn_user(f"hetflow: the code repository {root} cannot be used ({exc}); this process "
                  f"keeps its executables in {private.name}, removed at exit (set HETFLOW_CACHE_DIR "
                  f"to a writable folder to keep them)", RuntimeWarning)
        return Path(private.name), private


def _remove(path: Path) -> None:
    """Remove an entry, folder or (where a file took its place) file. A whole entry that
    another process renamed into place since the look stays (MPI ranks store one entry
    at once)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
        return
    try:
        path.unlink(missing_ok=True)
    except OSError:
        if not path.is_dir():  # (unlink of a folder: EISDIR on Linux, EPERM on macOS)
            raise


def _read_entry(entry: Path):
    """(description, module text), or None for an entry in another hetflow's format.
    Raises CorruptEntry for a damaged file, FileNotFoundError when the entry is gone."""
    try:
        meta = json.loads((entry / "description.json").read_text())
        text = (entry / "module.py").read_text()
    except (ValueError, NotADirectoryError, IsADirectoryError) as exc:  # undecodable, or a file for a folder
        raise CorruptEntry(f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(meta, dict) or hashlib.sha256(text.encode()).hexdigest() != meta.get("module_sha256"):
        raise CorruptEntry("module.py does not match its recorded digest")
    try:
        return Description(**meta["description"]), text
    except (KeyError, TypeError):
        return None


def _generate(kernel, device, ndim, views, checked):
    """The entry module for one executable of ``kernel``."""
    if len(kernel.params) < ndim:
        raise KernelError(f"kernel {kernel.name!r} takes {len(kernel.params)} parameters, fewer than the "
                          f"{ndim} index parameters of a rank-{ndim} launch")
    names = kernel.params[ndim:]
    passes = {f"{p}__root": k for k, p in enumerate(names)}  # which view passes a shared root

    def arrives(k, p):
        low = views.get(p)
        if low is None:
            return (0, (), k) if checked else None
        return len(low.params), viewtypes.packing(low), passes[low.root_name] if low.root_name else k

    return generate(ndim, [arrives(k, p) for k, p in enumerate(names)], device.kind, checked)


def _module_namespace(entry: Path) -> dict:
    """A fresh module for an entry's generated code.

    Numba's cached machine code names the module its functions were compiled in and
    imports it when loaded, so the code runs in a module named after the entry, which
    every process that loads the entry creates first.
    """
    name = "hetflow_generated_" + hashlib.sha1(f"{entry.parent.name}/{entry.name}".encode()).hexdigest()[:16]
    module = types.ModuleType(name)
    module.__builtins__ = builtins
    sys.modules[name] = module
    return module.__dict__


def _compile_functions(ns: dict, device, checked: bool, fastmath):
    """Wrap the module's entry for the device's compiler, in place; (entry, CPU
    parallel entry). ``fastmath``: as stored in the description data (a list of flags
    from JSON, or a bool)."""
    fastmath = _numba_fastmath(fastmath)
    entry_fn = ns[ENTRY] = _entry_wrapper(device, checked, fastmath)(ns[ENTRY])
    if device.kind != "cpu" or checked:
        return entry_fn, None
    for name in (ROWS, PIECE):  # (ROWS first: PIECE calls it)
        ns[name] = numba.njit(nogil=True, cache=True, error_model=ERROR_MODEL, fastmath=fastmath)(ns[name])
    parallel = numba.njit(parallel=True, nogil=True, cache=True, error_model=ERROR_MODEL,
                          fastmath=fastmath)(ns[PARALLEL])  # compiled on its first large launch
    return entry_fn, parallel


def _numba_fastmath(flags):
    """A kernel's ``fastmath`` as Numba takes it: a bool or a set (not a frozenset, list)."""
    return flags if isinstance(flags, bool) else set(flags)


def _device_wrapper(device, checked=False, fastmath=False, inline=None):
    """How a kernel's function is compiled to be called from an entry on ``device``.
    Checked: Numba's own boundscheck too, for arrays that are not parameters (made in
    the kernel, rows taken from one). ``inline``: the kernel's option (None: inlined at
    Numba's IR level on the CPU, numba-cuda's default, not, on a GPU)."""
    fastmath = _numba_fastmath(fastmath)
    if device.kind == "cpu":
        return numba.njit(nogil=True, error_model=ERROR_MODEL, boundscheck=checked or None, fastmath=fastmath,
                          inline="never" if inline == "never" else _unless_starred)
    if inline is None:
        return cuda_module().jit(device=True, fastmath=fastmath)
    return cuda_module().jit(device=True, fastmath=fastmath,
                             inline="never" if inline == "never" else _unless_starred)


def _unless_starred(call, caller_ir, callee_ir) -> bool:
    """Numba's inlining decision for a kernel its entry (or another kernel) calls:
    inline it into the caller's IR (compiled once, with it) unless the call passes a
    tuple of arguments (``f(*args)``, as CPython compiles a call of more than 30), which
    Numba cannot inline: then an ordinary call, which LLVM inlines."""
    return not call.vararg


def _entry_wrapper(device, checked=False, fastmath=False):
    if device.kind == "cpu":
        return numba.njit(nogil=True, cache=True, error_model=ERROR_MODEL, boundscheck=checked or None,
                          fastmath=fastmath)
    # numba-cuda's error model is ERROR_MODEL already (not debug builds)
    return gpu_entry_jit(fastmath, cache=not device.simulated, bounded=not device.simulated)


def gpu_entry_jit(fastmath=False, cache=False, bounded=True):
    """numba-cuda's ``jit`` for a GPU entry: ``bounded``, under the occupancy bound of
    BLOCKS_PER_SM blocks of BLOCK_THREADS threads (where numba-cuda takes launch bounds;
    the CUDA simulator does not)."""
    jit = cuda_module().jit
    options = dict(cache=cache, fastmath=fastmath)
    if bounded and "launch_bounds" in inspect.signature(jit).parameters:
        options["launch_bounds"] = (BLOCK_THREADS, BLOCKS_PER_SM)
    return jit(**options)


def _checked(entry_fn, device, bounds):
    """(entry, parallel entry) of a checked executable, raising IndexOutOfBoundsError."""
    if device.kind == "gpu":
        return checks.CheckedGpuEntry(entry_fn, bounds, cuda_module()), None
    entry = checks.CheckedCpuEntry(entry_fn, bounds)
    return entry, checks.CheckedCpuParallel(entry)


def _lock_machine_code(dispatcher, entry: Path) -> None:
    """Numba adds a signature to its cache index by read-modify-write: two processes
    adding different signatures at once can leave the index naming one's machine code
    for the other's signature. Loading and saving under an flock makes each step whole."""
    if dispatcher is None or fcntl is None:
        return
    cache = dispatcher._cache  # Numba's (and numba-cuda's) per-dispatcher cache
    lock = entry / f".{dispatcher.py_func.__name__}.lock"
    for name in ("load_overload", "save_overload"):
        setattr(cache, name, _under_lock(getattr(cache, name), lock))


def _mark_unreadable(dispatcher) -> None:
    """What reading Numba's stored machine code raises comes out as StoredCodeUnreadable:
    compiling raises anything too (ImportError out of np.linalg without SciPy, Numba's
    UnsupportedBytecodeError), and only a damaged cache file is dropped and compiled again."""
    if dispatcher is None:
        return
    cache = dispatcher._cache
    load = cache.load_overload

    def load_overload(*args, **kwargs):
        try:
            return load(*args, **kwargs)
        except Exception as exc:
            raise StoredCodeUnreadable(f"{type(exc).__name__}: {exc}") from exc

    cache.load_overload = load_overload


def _under_lock(method, lock: Path):
    def locked(*args, **kwargs):
        try:
            f = open(lock, "a")
        except FileNotFoundError:  # the entry went (another process evicted it): nothing to
            return None            # load (compile instead), nowhere to save
        with f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                return method(*args, **kwargs)
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    return locked


_default: CodeRepository | None = None
_default_lock = threading.Lock()


_default_env: str | None = None
_default_raw: object = None  # HETFLOW_CACHE_DIR as os.environ stores it, when _default was made
# Every launch reads HETFLOW_CACHE_DIR, and os.environ.get (Mapping.get, key encoding)
# costs as much as the rest of a small launch's binding. os.environ keeps its encoded
# entries in a dict that every assignment through os.environ updates: one look-up there,
# compared by identity (an assignment stores a new object), tells whether it changed.
_env_data = os.environ._data  # CPython's os._Environ, on every platform
_ENV_KEY = os.environ.encodekey("HETFLOW_CACHE_DIR")


def repository() -> CodeRepository:
    """The process-wide code repository; a new one when HETFLOW_CACHE_DIR changes."""
    global _default, _default_env, _default_raw
    raw = _env_data.get(_ENV_KEY)
    if _default is not None and raw is _default_raw:  # the launch hot path: no lock
        return _default
    env = os.environ.get("HETFLOW_CACHE_DIR")
    with _default_lock:
        if _default is None or env != _default_env:
            _default, _default_env = CodeRepository(), env
        _default_raw = raw
        return _default
