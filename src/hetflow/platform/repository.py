"""The code repository: compiled executables on disk, keyed by their description data.

Layout (default root ``~/.cache/hetflow``, ``HETFLOW_CACHE_DIR`` overrides)::

    kernels/<kernel>-<source hash>/<kind>-<rank>d-<variant>-<arch>/
        description.json   description data + digest of module.py
        module.py          generated body + chunk wrapper (what the compiler reads)
        __pycache__/       Numba's machine code for it (index + one file per signature)

Loading for a device (SPEC §2 "Kernel objects" 2): use a stored executable that is
optimal for the device; remove stale ones (other architecture or compiler); compile
from the source when none fits; fail with NoExecutableError when there is no source.
A corrupt entry is removed with a warning and compiled again, never a crash.
"""
from __future__ import annotations

import builtins
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import types
import threading
import warnings
from pathlib import Path

import numba
import numpy as np

from ..errors import KernelError, NoExecutableError
from ..kernels.codegen import ENTRY, PARALLEL, expanded, generate
from .cuda_compat import cuda_module
from .executable import Description, Executable

log = logging.getLogger("hetflow.repository")

CPU_OPTIONS = {"nogil": True, "cache": True}
GPU_OPTIONS = {"cache": True}


class CorruptEntry(Exception):
    """An on-disk entry that cannot be read back (internal: always recompiled)."""


def default_root() -> Path:
    return Path(os.environ.get("HETFLOW_CACHE_DIR") or Path.home() / ".cache" / "hetflow")


def variant_key(views: dict) -> str:
    """Digest of the views' structure (not their numbers): one executable per structure."""
    text = repr(sorted((name, low.key) for name, low in views.items()))
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:60]


class CodeRepository:
    """Compiled executables, in memory for this process and on disk for the next one."""

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else default_root()
        self._memo: dict[tuple, Executable] = {}
        self._device_fns: dict[tuple, object] = {}
        self._lock = threading.RLock()
        self.compiled = 0      # executables compiled from source in this process
        self.loaded = 0        # executables found on disk
        self.replaced = 0      # stale or corrupt entries removed

    # -- lookup -----------------------------------------------------------------------
    def executable(self, kernel, device, ndim: int, views: dict | None = None) -> Executable:
        """The executable of ``kernel`` for ``device``, a rank-``ndim`` launch and ``views``."""
        views = views or {}
        variant = variant_key(views)
        memo_key = (kernel.source_hash, kernel.name, device.id, ndim, variant)
        with self._lock:
            exe = self._memo.get(memo_key)
            if exe is None:
                exe = self._find_or_build(kernel, device, ndim, views, variant)
                self._memo[memo_key] = exe
            return exe

    def forget(self, exe: Executable) -> None:
        """Drop an executable whose machine code turned out unreadable (then recompile)."""
        with self._lock:
            for key, value in list(self._memo.items()):
                if value is exe:
                    del self._memo[key]
            warnings.warn(f"hetflow: corrupt code repository entry {exe.path} removed; recompiling",
                          RuntimeWarning, stacklevel=3)
            shutil.rmtree(exe.path, ignore_errors=True)
            self.replaced += 1

    def entries(self, kernel=None) -> list[Path]:
        base = self.root / "kernels"
        pattern = f"{kernel.name}-{kernel.source_hash[:16]}/*" if kernel else "*/*"
        return sorted(p for p in base.glob(pattern) if p.is_dir())

    def _find_or_build(self, kernel, device, ndim, views, variant) -> Executable:
        kdir = self.root / "kernels" / f"{kernel.name}-{kernel.source_hash[:16]}"
        prefix = f"{device.kind}-{ndim}d-{variant}-"
        stored = sorted(kdir.glob(prefix + "*")) if kdir.exists() else []
        for entry in stored:
            try:
                desc, text = self._read_entry(entry)
            except CorruptEntry as exc:
                warnings.warn(f"hetflow: corrupt code repository entry {entry} ({exc}); recompiling",
                              RuntimeWarning, stacklevel=4)
                shutil.rmtree(entry, ignore_errors=True)
                self.replaced += 1
                continue
            if desc.optimal(device) or (not kernel.has_source and desc.compatible(device)):
                self.loaded += 1
                return self._instantiate(kernel, device, desc, entry, text, ndim, views)
            if kernel.has_source:  # stale: another architecture or compiler; replace it
                log.info("replacing stale executable %s (built for %s)", entry, desc.arch)
                shutil.rmtree(entry, ignore_errors=True)
                self.replaced += 1
        if not kernel.has_source:
            built = ", ".join(p.name for p in stored) or "none"
            raise NoExecutableError(
                f"kernel {kernel.name!r} has no source and no executable compatible with {device.id} "
                f"({device.kind}, {device.arch}, rank {ndim}); stored executables: {built}")
        return self._build(kernel, device, ndim, views, variant, kdir / (prefix + _slug(device.arch)))

    # -- disk ---------------------------------------------------------------------------
    def _read_entry(self, entry: Path) -> tuple[Description, str]:
        try:
            meta = json.loads((entry / "description.json").read_text())
            text = (entry / "module.py").read_text()
            desc = Description(**meta["description"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CorruptEntry(f"{type(exc).__name__}: {exc}") from exc
        if hashlib.sha256(text.encode()).hexdigest() != meta.get("module_sha256"):
            raise CorruptEntry("module.py does not match its recorded digest")
        return desc, text

    def _build(self, kernel, device, ndim, views, variant, entry: Path) -> Executable:
        options = CPU_OPTIONS if device.kind == "cpu" else GPU_OPTIONS
        desc = Description.for_device(kernel, device, ndim, variant, options)
        gen = generate(kernel.source, ndim, views, device.kind)
        meta = {"description": desc.to_json(), "module_sha256": hashlib.sha256(gen.text.encode()).hexdigest(),
                "user_file": kernel.source.filename}
        # Several processes (MPI ranks) may build the same entry at once: each writes a
        # private folder and renames it into place, which is atomic; a loser uses the winner's.
        tmp = entry.parent / f".{entry.name}.{os.getpid()}.{threading.get_ident()}"
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "module.py").write_text(gen.text)
        (tmp / "description.json").write_text(json.dumps(meta, indent=1))
        try:
            os.rename(tmp, entry)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            desc, text = self._read_entry(entry)
            return self._instantiate(kernel, device, desc, entry, text, ndim, views)
        self.compiled += 1
        return self._instantiate(kernel, device, desc, entry, gen.text, ndim, views)

    # -- turning module text into compiled functions ----------------------------------------
    def _instantiate(self, kernel, device, desc, entry: Path, text: str, ndim, views) -> Executable:
        module_file = str(entry / "module.py")
        ns = {"__builtins__": builtins}
        if kernel.has_source:
            ns.update(kernel.namespace())
        if ns.get("__name__") not in sys.modules:
            # Numba's cached code re-imports the module its functions belong to: give a
            # generated kernel a module of its own that the import finds.
            module = types.ModuleType(f"hetflow_generated_{kernel.name}_{kernel.source_hash[:12]}")
            ns.pop("__name__", None)
            module.__dict__.update(ns)
            ns = module.__dict__
            sys.modules[module.__name__] = module
        for name, sub in kernel.subkernels.items() if kernel.has_source else ():
            ns[name] = self.device_function(sub, device)
        ns["__hf_np"] = np
        ns["__hf_prange"] = numba.prange
        if device.kind == "gpu":
            ns["__hf_cuda"] = cuda_module()
        try:
            exec(compile(text, module_file, "exec"), ns)
        except SyntaxError as exc:
            raise KernelError(f"generated code for kernel {kernel.name!r} does not parse: {exc}") from exc
        wrap_device, wrap_entry = _wrappers(device)
        for lowering in views.values():  # co_map index functions become device functions
            for name, fn in lowering.globals.items():
                ns[name] = wrap_device(fn)
        body = kernel.definition.name
        ns[body] = wrap_device(ns[body])
        entry_fn = ns[ENTRY] = wrap_entry(ns[ENTRY])
        parallel = (numba.njit(parallel=True, nogil=True, cache=True)(ns[PARALLEL])
                    if device.kind == "cpu" else None)  # compiled on its first large launch
        user_file = kernel.source.filename if kernel.has_source else str(entry)
        params = tuple(p for d in kernel.params[ndim:] for p in expanded(d, views.get(d)))
        return Executable(desc, entry_fn, params, str(entry), module_file, user_file, parallel)

    def device_function(self, kernel, device):
        """``kernel``'s body compiled as a device function (for kernels calling kernels)."""
        key = (kernel.source_hash, device.kind)
        with self._lock:
            fn = self._device_fns.get(key)
            if fn is None:
                ns = {"__builtins__": builtins, **kernel.namespace()}
                for name, sub in kernel.subkernels.items():
                    ns[name] = self.device_function(sub, device)
                exec(compile(kernel.source.padded(), kernel.source.filename, "exec"), ns)
                fn = _wrappers(device)[0](ns[kernel.definition.name])
                self._device_fns[key] = fn
            return fn


def _wrappers(device):
    """(device-function wrapper, entry wrapper) for the device's kind."""
    if device.kind == "cpu":
        # inline="always": Numba inlines the body into the chunk loop at the IR level, so
        # LLVM can vectorise the loop (a call per index would cost ~5x on axpy).
        return (numba.njit(nogil=True, cache=True, inline="always"), numba.njit(nogil=True, cache=True))
    cuda = cuda_module()
    return (cuda.jit(device=True), cuda.jit(cache=not device.simulated))


_default: CodeRepository | None = None
_default_lock = threading.Lock()


_default_env: str | None = None


def repository() -> CodeRepository:
    """The process-wide code repository; a new one when HETFLOW_CACHE_DIR changes."""
    global _default, _default_env
    env = os.environ.get("HETFLOW_CACHE_DIR")
    if _default is not None and env == _default_env:  # the launch hot path: no lock
        return _default
    with _default_lock:
        if _default is None or env != _default_env:
            _default, _default_env = CodeRepository(), env
        return _default
