"""Kernel objects (SPEC §1 "vector functions", §2 "Kernel objects").

``@hetflow.kernel`` marks a Python function whose first parameters are the launch
index (one integer per dimension) and whose others are arrays, views and scalars. The
kernel object keeps the source; executables for each device are compiled from it and
kept in the code repository (:mod:`hetflow.platform.repository`).
"""
from __future__ import annotations

import ast
import builtins
import functools
import hashlib
import inspect

from .access import Access, analyze
from .source import KernelSource


class Kernel:
    """A data-parallel kernel: source, and the executables compiled from it."""

    def __init__(self, pyfunc=None, *, source: KernelSource | None = None, name: str | None = None,
                 globals_: dict | None = None):
        self.pyfunc = pyfunc
        self._source = source if source is not None else (KernelSource.from_function(pyfunc) if pyfunc else None)
        self.name = name or (pyfunc.__name__ if pyfunc else self._source.function().name)
        self._globals = globals_ if globals_ is not None else _function_namespace(pyfunc)
        self._access: dict[int, Access] = {}
        # Launch plans (runtime.launch): per repository, device and argument types. They
        # live on the kernel so that they go when the kernel does.
        self.plans: dict[tuple, object] = {}
        if pyfunc is not None:
            functools.update_wrapper(self, pyfunc)

    # -- construction -------------------------------------------------------------
    @classmethod
    def from_source(cls, name: str, source: str, globals_: dict | None = None) -> "Kernel":
        """A kernel from generated source text (used by fusion and the API library)."""
        src = KernelSource.from_text(source, f"<hetflow generated kernel {name}>")
        namespace = dict(globals_ or {})
        namespace.setdefault("__builtins__", builtins)
        exec(compile(src.padded(), src.filename, "exec"), namespace)
        fn = namespace[src.function().name]
        return cls(fn, source=src, name=name, globals_=namespace)

    def without_source(self) -> "Kernel":
        """The same kernel with its source dropped: only stored executables can run it."""
        self.params, self.source_hash  # computed while the source is still here
        k = Kernel.__new__(Kernel)
        k.__dict__.update(self.__dict__)
        k._source = None
        return k

    # -- facts ----------------------------------------------------------------------
    @property
    def source(self) -> KernelSource | None:
        return self._source

    @property
    def has_source(self) -> bool:
        return self._source is not None

    @functools.cached_property
    def definition(self) -> ast.FunctionDef:
        return self._source.function()

    @functools.cached_property
    def params(self) -> tuple[str, ...]:
        return tuple(a.arg for a in self.definition.args.args)

    @functools.cached_property
    def subkernels(self) -> dict[str, "Kernel"]:
        """Kernels this kernel calls, by the name it calls them by."""
        names = {n.id for n in ast.walk(self.definition) if isinstance(n, ast.Name)}
        return {n: self._globals[n] for n in names if isinstance(self._globals.get(n), Kernel)}

    @functools.cached_property
    def source_hash(self) -> str:
        """Digest of this kernel's source and of the globals it reads (kernels it calls
        by their own digest): compiled code freezes global values, so two kernels with
        the same text but other constants must not share an executable."""
        h = hashlib.sha256(self._source.text.encode())
        names = {n.id for n in ast.walk(self.definition) if isinstance(n, ast.Name)}
        for name in sorted(names & self._globals.keys()):
            h.update(f"{name}={stable_value(self._globals[name])};".encode())
        return h.hexdigest()

    def access(self, ndim: int) -> Access:
        """Read/write modes of the data parameters for a rank-``ndim`` launch."""
        known = self._access.get(ndim)
        if known is None:
            def callee(name):
                sub = self.subkernels.get(name)
                return None if sub is None else [sub.access(0).modes.get(p, "") for p in sub.params]

            known = self._access[ndim] = analyze(self.definition, ndim, callee)
        return known

    def namespace(self) -> dict:
        """Globals the body is compiled with (the user's module globals and closure)."""
        return dict(self._globals)

    def __call__(self, *args):
        """Calling a kernel runs its Python function (host code, debugging, sub-kernels)."""
        return self.pyfunc(*args)

    def __repr__(self):
        return f"<hetflow kernel {self.name} from {self._source.filename if self._source else '(no source)'}>"

    def __hash__(self):
        return id(self)


def stable_value(value) -> str:
    """A description of a global's value that is the same in every process."""
    import numpy as np

    if isinstance(value, Kernel):
        return f"kernel:{value.source_hash}"
    if isinstance(value, (int, float, complex, str, bool, type(None), np.generic, tuple)):
        return f"{type(value).__name__}:{value!r}"
    if isinstance(value, np.ndarray):
        return f"ndarray:{value.dtype}:{value.shape}:{hashlib.sha1(value.tobytes()).hexdigest()}"
    name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
    module = getattr(value, "__module__", None) or ""
    return f"{type(value).__name__}:{module}.{name}" if name else type(value).__qualname__


def _function_namespace(fn) -> dict:
    if fn is None:
        return {}
    ns = dict(fn.__globals__)
    ns.update(inspect.getclosurevars(fn).nonlocals)
    return ns


def kernel(fn=None):
    """Decorator marking a kernel: ``@hetflow.kernel`` over ``def k(i, x, out): ...``."""
    if fn is None:
        return kernel
    return Kernel(fn)
