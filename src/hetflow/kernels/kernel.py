"""Kernel objects (SPEC §1 "vector functions", §2 "Kernel objects").

``@hetflow.kernel`` marks a Python function whose first parameters are the launch
index (one integer per dimension) and whose others are arrays, views and scalars.
Executables for each device are compiled from the function object (its bytecode, as
``numba.njit`` does) and kept in the code repository
(:mod:`hetflow.platform.repository`), so a kernel may be defined anywhere Python runs
(``python -c``, stdin, the plain REPL, ``exec``, closures). Where Python can read the
source, access analysis reads it; elsewhere every array parameter counts as read and
written, unless the kernel declares what it writes (``writes=``, see :func:`kernel`).
"""
from __future__ import annotations

import ast
import builtins
import functools
import hashlib
import inspect
import threading
import types

from ..errors import ArgumentError, ArgumentTypeError, KernelCompileError, KernelError
from ..index.lowering import global_names
from . import checks, support
from .access import Access, analyze, declared
from .source import KernelSource


class Kernel:
    """A data-parallel kernel: source, and the executables compiled from it."""

    hetflow_kernel = True  # what access analysis (which this module imports) knows a called kernel by

    def __init__(self, pyfunc=None, *, source: KernelSource | None = None, name: str | None = None,
                 globals_: dict | None = None, boundscheck: bool | None = None,
                 fastmath=False, inline: str | None = None, writes=None, reads=None):
        self.pyfunc = pyfunc
        self._source = source if source is not None or pyfunc is None else _readable_source(pyfunc)
        self._code = pyfunc.__code__ if pyfunc is not None else None  # what is compiled
        self.name = name or (pyfunc.__name__ if pyfunc else self._source.function().name)
        support.check_definition(self)
        self._globals_checked = False  # support.check_globals passed (at the first launch)
        # Read at the first launch (see _globals), not now: a global may change before.
        self._module_globals = globals_ if globals_ is not None else getattr(pyfunc, "__globals__", {})
        # Checked mode (kernels.checks): the decorator's option, else HETFLOW_BOUNDSCHECK.
        self.boundscheck = checks.enabled_by_env() if boundscheck is None else _boundscheck(self.name, boundscheck)
        self.fastmath = _fastmath(self.name, fastmath)
        self.inline = _inline(self.name, inline)
        self.writes = self._declared("writes", writes)
        self.reads = self._declared("reads", reads)
        self._access: dict[int, Access] = {}
        # Launch plans (runtime.launch): per repository, device and argument types. They
        # live on the kernel so that they go when the kernel does.
        self.plans: dict[tuple, object] = {}
        self.recent: dict[str, tuple] = {}  # per device id: the plan it ran last, with its guard
        if pyfunc is not None:
            functools.update_wrapper(self, pyfunc)

    def _declared(self, option: str, names):
        """``writes=``/``reads=``: a set of parameter names (one name may be a string)."""
        if names is None:
            return None
        names = (names,) if isinstance(names, str) else names
        try:
            names = frozenset(names)
        except TypeError:
            raise ArgumentTypeError(f"kernel {self.name!r}: {option}= takes parameter names (an iterable "
                                    f"of strings), not {type(names).__name__}") from None
        unknown = sorted(map(repr, names - set(self.params)))
        if unknown:
            raise ArgumentError(f"kernel {self.name!r}: {option}= names {', '.join(unknown)}, not a "
                                f"parameter of the kernel (its parameters: {', '.join(self.params)})")
        return names

    @functools.cached_property
    def options(self) -> dict:
        """The options that change what is compiled or assumed, where not the default
        (``boundscheck`` apart: see ``Kernel.boundscheck``), as JSON data: part of the
        description data and the variant of every executable, and of the key of each
        kernel that calls this one."""
        found = {}
        if self.fastmath:
            found["fastmath"] = True if self.fastmath is True else sorted(self.fastmath)
        if self.inline is not None:
            found["inline"] = self.inline
        for option in ("writes", "reads"):
            if getattr(self, option) is not None:
                found[option] = sorted(getattr(self, option))
        return found

    # -- construction -------------------------------------------------------------
    @classmethod
    def from_source(cls, name: str, source: str, globals_: dict | None = None, *, filename: str | None = None,
                    lines: tuple = (), **options) -> "Kernel":
        """A kernel from generated source text (used by fusion, the API library and
        wavefronts); ``options`` as :func:`kernel` takes them (those of the kernel it
        wraps). Text made from a user's kernel names its ``filename``, and ``lines``
        the line there of each of its lines: compile errors and tracebacks name those."""
        src = KernelSource.from_text(source, filename or f"<hetflow generated kernel {name}>", lines)
        namespace = dict(globals_ or {})
        namespace.setdefault("__builtins__", builtins)
        exec(compile(src.module(), src.filename, "exec"), namespace)
        fn = namespace[src.function().name]
        return cls(fn, source=src, name=name, globals_=namespace, **options)

    def without_source(self) -> "Kernel":
        """The same kernel with its source dropped: only stored executables can run it."""
        self.params, self.source_hash  # computed while the source is still here
        k = Kernel.__new__(Kernel)
        k.__dict__.update(self.__dict__)
        k._source = k._code = None
        return k

    # -- facts ----------------------------------------------------------------------
    @property
    def source(self) -> KernelSource | None:
        return self._source

    @property
    def has_source(self) -> bool:
        return self._source is not None

    @property
    def compilable(self) -> bool:
        """Has a function object to compile (not a kernel whose code was dropped)."""
        return self._code is not None

    @property
    def filename(self) -> str | None:
        """The file the kernel was defined in (``<string>``, ``<stdin>`` without source)."""
        if self.has_source:
            return self._source.filename
        return self._code.co_filename if self._code is not None else None

    @functools.cached_property
    def definition(self) -> ast.FunctionDef:
        return self._source.function()

    @functools.cached_property
    def params(self) -> tuple[str, ...]:
        if self._code is not None:
            return self._code.co_varnames[:self._code.co_argcount]
        return tuple(a.arg for a in self.definition.args.args)

    @functools.cached_property
    def _names(self) -> set[str]:
        """Every global and captured name the body reads (kernels it calls included)."""
        if self._code is not None:
            return _code_names(self._code)
        return {n.id for n in ast.walk(self.definition) if isinstance(n, ast.Name)}

    @functools.cached_property
    def _globals(self) -> dict:
        """The values of the globals and captured variables the body reads, by name, as
        they are when first needed: at the kernel's first launch (access analysis, then
        compiling). Compiled code freezes them (Numba's rule), so every executable of the
        kernel in this process is compiled with these values, and keyed by them."""
        found = {n: self._module_globals[n] for n in self._names if n in self._module_globals}
        if self.pyfunc is not None and self.pyfunc.__closure__:
            found.update(zip(self.pyfunc.__code__.co_freevars,
                             (c.cell_contents for c in self.pyfunc.__closure__)))
        return found

    @functools.cached_property
    def subkernels(self) -> dict[str, "Kernel"]:
        """Kernels this kernel calls, by the name it calls them by."""
        return {n: v for n, v in self._globals.items() if isinstance(v, Kernel)}

    @functools.cached_property
    def source_hash(self) -> str:
        """Digest of this kernel's bytecode (what is compiled), its defaults and the
        values of the globals it reads when it is first launched (``_globals``; kernels
        and functions it calls by their own digest): compiled code freezes global
        values, so two kernels with the same code but other constants must not share
        an executable."""
        self._refuse_recursion()
        self._check_globals(None)
        h = hashlib.sha256(_code_digest(self._code).encode())
        h.update(repr(tuple(map(stable_value, self.pyfunc.__defaults__ or ()))).encode())
        for name in sorted(self._globals):
            h.update(f"{name}={stable_value(self._globals[name])};".encode())
        return h.hexdigest()

    def _refuse_recursion(self) -> None:
        """KernelCompileError where this kernel, or one it calls, calls itself: a kernel
        is compiled into its callers (and its access analysed into theirs), which never
        ends for a recursive one."""
        cycle = _call_cycle(self, (), set())
        if cycle is None:
            return
        caller = "" if cycle[0] is self else f" (called by kernel {self.name!r})"
        raise KernelCompileError(
            f"kernel {cycle[0].name!r}{caller} calls itself ({' -> '.join(k.name for k in cycle)}): "
            f"recursive kernels are not supported; write the recursion as a loop")

    def access(self, ndim: int) -> Access:
        """Read/write modes of the data parameters for a rank-``ndim`` launch."""
        known = self._access.get(ndim)
        if known is None:
            self._refuse_recursion()
            known = self._analyze(ndim)
            self._check_globals(known)
            self._access[ndim] = known
        return known

    def _check_globals(self, found: Access | None) -> None:
        """KernelCompileError where the kernel calls a plain Python function or writes a
        global array (:func:`.support.check_globals`), found from its access ``found``
        (None: analysed here, for any rank), once."""
        if self._globals_checked:
            return
        if found is None and self.has_source:
            found = analyze(self.definition, 0, self._resolve)
        support.check_globals(self, found.frozen_writes if found is not None else {})
        self._globals_checked = True

    def set_access(self, ndim: int, access: Access) -> None:
        """Access known by construction (a fused kernel's, from its kernels')."""
        self._access[ndim] = access

    def _analyze(self, ndim: int) -> Access:
        found = analyze(self.definition, ndim, self._resolve) if self.has_source else None
        if self.writes is None and self.reads is None:
            # no syntax tree to read: every parameter may be read and written
            return found or Access({p: "rw" for p in self.params[ndim:]}, {})
        named = (self.writes or frozenset()) | (self.reads or frozenset())
        index = sorted(map(repr, named & set(self.params[:ndim])))
        if index:
            raise ArgumentError(f"kernel {self.name!r}: writes=/reads= name {', '.join(index)}, a launch "
                                f"index of a rank-{ndim} launch, not data")
        return declared(found, self.params[ndim:], self.writes, self.reads)

    def _resolve(self, node):
        """The object a name or attribute chain in the body names (None: unknown)."""
        if isinstance(node, ast.Attribute):
            return getattr(self._resolve(node.value), node.attr, None)
        if isinstance(node, ast.Name):
            return self._globals.get(node.id, getattr(builtins, node.id, None))
        return None

    def function_with(self, convert, module: str | None = None):
        """The kernel's function with every global and captured value ``v`` it reads,
        as ``_globals`` froze it, replaced by ``convert(v)`` (kernels it calls become
        device functions), as a function of the module named ``module`` (default: its own).
        Its globals are those values alone: compiled code lives as long as the process,
        and must not keep the rest of the user's module (queues, large arrays) alive."""
        f, free = self.pyfunc, self._code.co_freevars
        namespace = self._module_header()
        if module is not None:
            namespace["__name__"] = module
        namespace.update((n, convert(v)) for n, v in self._globals.items() if n not in free)
        closure = tuple(types.CellType(convert(self._globals[n])) for n in free)
        return types.FunctionType(self._code, namespace, f.__name__, f.__defaults__, closure or None)

    def namespace(self) -> dict:
        """Globals the body is compiled with (text made from it too): the values it
        reads (and its closure's) as ``_globals`` froze them, its module's name and
        builtins; not the rest of its module, which kernels made from it would keep."""
        return {**self._module_header(), **self._globals}

    def _module_header(self) -> dict:
        """The module's ``__name__`` (Numba names compiled functions' modules by it) and
        ``__builtins__`` (what Python resolves unbound names in)."""
        header = {"__builtins__": self._module_globals.get("__builtins__", builtins)}
        if "__name__" in self._module_globals:
            header["__name__"] = self._module_globals["__name__"]
        return header

    @property
    def def_line(self) -> int | None:
        """The line of the kernel's ``def`` in its file (the function's first line where
        the source cannot be read); None for a kernel without either."""
        if self.has_source:
            return self.definition.lineno + self._source.firstlineno - 1
        return self.pyfunc.__code__.co_firstlineno if self.pyfunc is not None else None

    def __call__(self, *args):
        """Calling a kernel runs its Python function (host code, debugging, sub-kernels)."""
        return self.pyfunc(*args)

    def __repr__(self):
        return f"<hetflow kernel {self.name} from {self.filename or '(no source)'}>"

    def __hash__(self):
        return id(self)


def _call_cycle(kernel: Kernel, path: tuple, done: set):
    """The first chain of calls from ``kernel`` back to a kernel on ``path`` (or to
    itself), ending with the kernel called again; None when there is none. ``done``:
    kernels whose calls were followed already, without a cycle."""
    path += (kernel,)
    for sub in kernel.subkernels.values():
        if sub in path:
            return path[path.index(sub):] + (sub,)
        if sub not in done:
            found = _call_cycle(sub, path, done)
            if found is not None:
                return found
    done.add(kernel)
    return None


def stable_value(value) -> str:
    """A description of a global's value that is the same in every process."""
    import numpy as np

    if isinstance(value, Kernel):  # its options change the caller's compiled code too
        options = f":{sorted(value.options.items())}" if value.options else ""
        return f"kernel:{value.source_hash}{options}"
    if isinstance(getattr(getattr(value, "py_func", value), "__code__", None), types.CodeType):
        return _function_value(value)
    if isinstance(value, (int, float, complex, str, bool, type(None), np.generic, tuple)):
        return f"{type(value).__name__}:{value!r}"
    if isinstance(value, np.ndarray):
        return f"ndarray:{value.dtype}:{value.shape}:{hashlib.sha1(value.tobytes()).hexdigest()}"
    name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
    module = getattr(value, "__module__", None) or ""
    return f"{type(value).__name__}:{module}.{name}" if name else type(value).__qualname__


def function_digest(fn) -> str:
    """Digest of a function's code and of the global and closure values it reads."""
    fn = getattr(fn, "py_func", fn)  # a Numba dispatcher: its Python function
    ns = dict(fn.__globals__)
    ns.update(inspect.getclosurevars(fn).nonlocals)
    h = hashlib.sha256(_code_digest(fn.__code__).encode())
    for name in sorted(_code_names(fn.__code__) & ns.keys()):
        h.update(f"{name}={stable_value(ns[name])};".encode())
    return h.hexdigest()


_digesting = threading.local()


def _function_value(fn) -> str:
    """A function a kernel calls, by its type and digest: its code is compiled into the
    kernel's. A function met again while digesting (recursion) counts by its name."""
    seen = _digesting.__dict__.setdefault("seen", set())
    name = f"{type(fn).__name__}:{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', '')}"
    if id(fn) in seen:
        return name
    seen.add(id(fn))
    try:
        return f"{name}:{function_digest(fn)}"
    finally:
        seen.discard(id(fn))


# Numba's fast-math flags (LLVM's), besides True for all of them.
FASTMATH_FLAGS = frozenset(("fast", "nnan", "ninf", "nsz", "arcp", "contract", "afn", "reassoc"))


def kernel(fn=None, *, boundscheck: bool | None = None, fastmath=False, inline: str | None = None,
           writes=None, reads=None):
    """Decorator marking a kernel: ``@hetflow.kernel`` over ``def k(i, x, out): ...``.

    Options (``@hetflow.kernel(fastmath=True)``), each part of the kernel's executables'
    description data, so that another option is another executable:

    - ``boundscheck=True`` checks every index into the kernel's arrays at run time
      (default: the ``HETFLOW_BOUNDSCHECK`` environment variable);
    - ``fastmath=True``, or a set of Numba's flags (``{"nsz", "arcp", "contract"}``):
      Numba's (and numba-cuda's) fast-math for the kernel and its entry;
    - ``inline="always"`` or ``"never"``: whether a call of this kernel (from its entry
      or another kernel) is inlined at Numba's IR level; by default it is on the CPU
      and is not on a GPU;
    - ``writes=``/``reads=``: the data parameters the kernel writes / reads, in place of
      what access analysis finds (see :func:`hetflow.kernels.access.declared`).
    """
    options = dict(boundscheck=boundscheck, fastmath=fastmath, inline=inline, writes=writes, reads=reads)
    if fn is None:
        return functools.partial(kernel, **options)
    if not isinstance(fn, types.FunctionType):
        raise ArgumentTypeError(_not_a_function(fn))
    return Kernel(fn, **options)


def _not_a_function(fn) -> str:
    """Why ``hetflow.kernel(fn)`` cannot make a kernel of ``fn``."""
    if isinstance(fn, Kernel):
        return (f"hetflow.kernel takes a Python function, not {fn!r}, a kernel already: decorate "
                f"its function once (with other options: hetflow.kernel(k.pyfunc, ...))")
    return f"hetflow.kernel takes a Python function (a def or a lambda), not {type(fn).__name__} {fn!r}"


def _boundscheck(name: str, value) -> bool:
    if isinstance(value, bool):
        return value
    raise ArgumentTypeError(f"kernel {name!r}: boundscheck= takes True, False or None (the default: "
                            f"HETFLOW_BOUNDSCHECK), not {value!r}")


def _fastmath(name: str, value):
    """``fastmath=``: False, True, or a frozenset of Numba's flags."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (set, frozenset, list, tuple)) and all(isinstance(f, str) for f in value):
        unknown = sorted(set(value) - FASTMATH_FLAGS)
        if not unknown:
            return frozenset(value) or False
        raise ArgumentError(f"kernel {name!r}: fastmath= flags {unknown} are not Numba's "
                            f"(those are {sorted(FASTMATH_FLAGS)})")
    raise ArgumentError(f"kernel {name!r}: fastmath= takes True, False or a set of Numba's flags "
                        f"({sorted(FASTMATH_FLAGS)}), not {value!r}")


def _inline(name: str, value):
    if value is None or (isinstance(value, str) and value in ("always", "never")):
        return value
    raise ArgumentError(f"kernel {name!r}: inline= takes 'always', 'never' or None (the default), "
                        f"not {value!r}")


def _readable_source(fn) -> KernelSource | None:
    """``fn``'s source, or None where Python cannot read it but ``fn`` is a function (a
    lambda's "source" is the line around it: it is read from its bytecode too)."""
    if getattr(fn, "__name__", None) == "<lambda>" and isinstance(getattr(fn, "__code__", None), types.CodeType):
        return None
    try:
        return KernelSource.from_function(fn)
    except KernelError:
        if not isinstance(getattr(fn, "__code__", None), types.CodeType):
            raise
        return None


def _code_names(code) -> set[str]:
    """Global and free names a code object and the functions nested in it read."""
    return set(global_names(code)) | set(code.co_freevars)


def _code_digest(code) -> str:
    """Digest of a code object and those nested in it, the same in every process."""
    h, stack = hashlib.sha256(), [code]
    while stack:
        c = stack.pop()
        h.update(c.co_code)
        h.update(repr((c.co_name, c.co_argcount, c.co_varnames, c.co_names, c.co_freevars)).encode())
        for k in c.co_consts:
            if isinstance(k, types.CodeType):
                stack.append(k)
            else:  # frozensets (``x in {1, 2}``) print in a per-process order
                h.update(repr(sorted(map(repr, k)) if isinstance(k, frozenset) else k).encode())
    return h.hexdigest()
