"""Executables and their description data (SPEC §2 "Kernel objects, executables").

An executable is a kernel compiled for one device kind and architecture, one launch
rank and one *variant* (the structure of the views it was lowered for, whether it is
checked: ``options["boundscheck"]``, and the kernel's other options where not the
default: ``fastmath``, ``inline``, ``writes``, ``reads``, see ``Kernel.options``). Its
*description data* say what it was built for; the code repository compares them with
a device's to decide whether the executable may be used there.

Arithmetic has NumPy's meaning on every device (``options["error_model"]``): a float
division by zero gives inf or nan, an integer ``//`` or ``%`` by zero gives 0, nothing
raises. Numba's CPU default would raise ZeroDivisionError (after part of the output was
written); numba-cuda compiles with this model unless debugging. Entries built under
another model are stale.
"""
from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path

import numba
from numba.core.errors import NumbaError

from ..errors import KernelCompileError
from ..kernels import atomic, checks, codegen, viewtypes


ERROR_MODEL = "numpy"

# Every GPU launch runs blocks of BLOCK_THREADS threads (runtime.gpu.launch_config), and
# GPU entries are compiled for BLOCKS_PER_SM such blocks at once on a multiprocessor
# (2048 threads, all that an H100's or A100's holds): at most 32 registers a thread. A
# 4096^2 heat stencil took 39 without the bound and ran at 75% occupancy, 7.7% slower
# (100 steps in 10.82 against 10.04 ms on an H100). A kernel that needs more registers
# spills under the bound; runtime.gpu compiles it again without.
BLOCK_THREADS, BLOCKS_PER_SM = 256, 8


@functools.lru_cache(maxsize=2)
def compiler_versions(kind: str) -> dict:
    """Versions of the compilers that build executables for ``kind``."""
    import hashlib
    import inspect

    import llvmlite

    # hetflow's own code generator (with the view types, checks and atomics it compiles
    # in: Numba extensions that no generated module's text shows) counts as a compiler:
    # entries it wrote differently are stale.
    text = "".join(inspect.getsource(m) for m in (codegen, checks, viewtypes, atomic))
    generator = hashlib.sha1(text.encode()).hexdigest()[:12]
    versions = {"numba": numba.__version__, "llvmlite": llvmlite.__version__, "hetflow-codegen": generator}
    if kind == "gpu":
        from importlib.metadata import PackageNotFoundError, version

        try:
            versions["numba-cuda"] = version("numba-cuda")
        except PackageNotFoundError:
            versions["numba-cuda"] = "builtin"
        versions["launch-bounds"] = f"{BLOCK_THREADS}x{BLOCKS_PER_SM}"  # entries compiled without are stale
    return versions


@dataclasses.dataclass(frozen=True)
class Description:
    """Description data of one executable."""

    kernel: str
    kind: str
    arch: str
    vendor: str
    options: dict
    compiler: dict
    source_hash: str
    ndim: int
    variant: str

    @classmethod
    def for_device(cls, kernel, device, ndim, variant, options) -> "Description":
        return cls(kernel.name, device.kind, device.arch, device.vendor, dict(options),
                   compiler_versions(device.kind), kernel.source_hash, ndim, variant)

    def compatible(self, device) -> bool:
        """Runs on ``device``: same kind and vendor, built by today's compilers with
        today's arithmetic (``ERROR_MODEL``)."""
        return (self.kind == device.kind and self.vendor == device.vendor
                and self.options.get("error_model") == ERROR_MODEL
                and self.compiler == compiler_versions(device.kind))

    def optimal(self, device) -> bool:
        """Compatible and built for exactly this device's architecture."""
        return self.compatible(device) and self.arch == device.arch

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Executable:
    """A compiled entry point (chunk runner) plus its description data."""

    description: Description
    entry: object              # Numba CPU dispatcher or numba-cuda kernel
    entry_params: tuple
    path: str                  # the repository entry's folder
    module_file: str
    user_file: str
    parallel: object = None    # CPU: the whole launch over all cores (Numba parallel)

    @property
    def cache_hits(self) -> int:
        stats = getattr(self.entry, "stats", None)
        return sum(stats.cache_hits.values()) if stats is not None else 0

    def compile_error(self, exc: Exception, device, kernel=None) -> KernelCompileError:
        """Turn a compiler exception (Numba's, or another raised while compiling) into
        KernelCompileError naming file and line: the kernel's, not the generated entry's
        (which Numba reports as where it called it); the kernel's ``def`` where Numba
        names none."""
        entry = re.escape(Path(self.module_file).parent.name)
        text = re.sub(rf'File "[^"]*{entry}[/\\]module\.py", line \d+:\n(.+\n)*?\n', "", _described(exc))
        text = re.sub(rf'\S*{entry}[/\\]module\.py \(\d+\)', "the kernel's entry", text)
        text = text.replace(_UNKNOWN_PLACE, "")
        line = _line(text, self.user_file, kernel)
        where = self.user_file if line is None else f"{self.user_file}:{line}"
        return KernelCompileError(
            f"kernel {self.description.kernel!r} ({where}) failed to compile for {device.id} "
            f"({device.kind}, {device.arch}): {_compiler_message(_constants_said(text, kernel))}")


# Numba's banner for a place it lost ("location: unknown location (0:0)" stays).
_UNKNOWN_PLACE = 'File "unknown location", line 0:\n<source missing, REPL/exec in use?>\n'


def _described(exc: Exception) -> str:
    """The text of what compiling raised; one not Numba's own says what it was."""
    if isinstance(exc, NumbaError):
        return str(exc)
    if isinstance(exc, ImportError):  # np.linalg on the CPU, which needs SciPy's LAPACK
        return f"Numba needs a module that is not installed ({type(exc).__name__}: {exc})"
    return f"{type(exc).__name__}: {exc}"


def _line(text: str, user_file: str, kernel) -> int | None:
    """The user's line that ``text`` (a compiler message) names last; else the line of
    an undefined name it reports, else the kernel's ``def`` (None without a kernel).
    Line 0 is Numba's for a place it lost: no line."""
    places = (r'File "[^"]*", line (\d+)',
              # an inlining error names the place only in its variables: "Var($x, file.py:7)"
              rf'{re.escape(Path(user_file).name)}:(\d+)\)',
              # bytecode Numba does not take: "... Raised from file.py (7)"
              rf'{re.escape(user_file)} \((\d+)(?::\d+)?\)')
    for place in places:
        lines = [n for n in map(int, re.findall(place, text)) if n > 0]
        if lines:
            return lines[-1]
    lines = _name_error_lines(text, kernel)
    if lines:
        return lines[0]
    return kernel.def_line if kernel is not None else None


def _name_error_lines(text: str, kernel) -> list[int]:
    """Numba reports undefined names without a location: find them in the source."""
    names = re.findall(r"name '(\w+)' is not defined", text)
    if not names or kernel is None or not kernel.has_source:
        return []
    import ast

    offset = kernel.source.firstlineno - 1
    return [n.lineno + offset for n in ast.walk(kernel.definition)
            if isinstance(n, ast.Name) and n.id == names[0]][:1]


# Numba's words where a global or captured value has no constant form: it lowers the
# value's type and names the table it found nothing in; inlined into the entry (the CPU's
# default), it checks the entry's globals for the name, and calls a value it cannot type
# undefined.
_NO_CONSTANT = re.compile(r"<numba\.core\.base\.OverloadSelector object at 0x[0-9a-f]+>, \((.+),\)")
_LOWERED_NAME = re.compile(r"During: lowering \".* = (?:freevar|global)\((\w+): ")
_UNDEFINED = re.compile(r"NameError: name '(\w+)' is not defined")
_CONSTANTS = ("compiled code holds a global or captured value as a constant, and has constants of numbers, "
              "tuples, NumPy arrays, kernels and Numba's functions only: pass it as an argument, or make it "
              "a tuple or an array")


def _constants_said(text: str, kernel) -> str:
    """``text`` with Numba's words for a global or captured value it has no constant of
    (``_NO_CONSTANT``, ``_UNDEFINED`` where ``kernel`` or a kernel it calls reads the
    name) replaced by what they mean."""
    found = _NO_CONSTANT.search(text)
    if found:
        name = _LOWERED_NAME.search(text)
        what = f"{name[1]!r}" if name else "a global or captured value"
        said = f"{what} (of Numba type {found[1]}) cannot be a constant: {_CONSTANTS}"
        return _NO_CONSTANT.sub(lambda _: said, text, count=1)
    found = _UNDEFINED.search(text)
    reader = _reader(kernel, found[1]) if found and kernel is not None else None
    if reader is None:
        return text
    by = "" if reader is kernel else f", read by kernel {reader.name!r}"
    what = type(reader.namespace()[found[1]]).__name__
    said = f"{found[1]!r} (a Python {what}{by}) has no Numba type: {_CONSTANTS}"
    return _UNDEFINED.sub(lambda _: said, text, count=1)


def _reader(kernel, name: str):
    """``kernel``, or the first kernel it calls, that reads the global or captured
    ``name``; None where none does."""
    stack, seen = [kernel], set()
    while stack:
        k = stack.pop()
        if name in k.namespace():
            return k
        seen.add(id(k))
        stack.extend(sub for sub in k.subkernels.values() if id(sub) not in seen)
    return None


# The lines of a compiler message kept: the first of them, and the reason an overload
# (hetflow's refusals among them) gave, which Numba nests under its candidates, further down.
_KEPT_LINES = 8
_REASON = "Rejected as the implementation raised a specific error:"


def _compiler_message(text: str) -> str:
    # Numba prefixes messages with ANSI colours and a generic banner; keep the substance.
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    keep = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("During:")]
    shown = keep[:_KEPT_LINES]
    at = next((k for k, ln in enumerate(keep) if ln == _REASON), len(keep))
    if _KEPT_LINES <= at + 1 < len(keep):
        shown += ([] if at < _KEPT_LINES else ["...", _REASON]) + [keep[at + 1]]
    return " | ".join(shown)
