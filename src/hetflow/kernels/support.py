"""What no device compiles, refused before any device compiles it.

The CUDA simulator runs a kernel as Python, so it would run what Numba refuses on the
CPU (and numba-cuda on a real GPU), and Numba's CPU compiler gets a few constructs
silently wrong. These checks give every device one verdict: a
:class:`~hetflow.errors.KernelCompileError` naming the kernel, its file and line.

- When the kernel is made (:func:`check_definition`): its signature (``*args``,
  ``**kwargs``, keyword-only parameters) and, where its source can be read, constructs
  of its body (generators, ``with``, classes, ``global``, ``del`` of a name, f-string
  format specs, decorated nested functions, and nested functions' keyword-only
  parameters or defaults that are not constants).
- At its first launch, when the values of its globals are known (:func:`check_globals`):
  calls of plain Python functions, and writes into a global or captured NumPy array,
  which compiled code holds as a constant.
"""
from __future__ import annotations

import ast
import types

import numba

from ..errors import KernelCompileError

# Body constructs no device compiles: (node types, what the message calls them, advice).
_REFUSED = (
    ((ast.Yield, ast.YieldFrom), "'yield' (a generator)", "write the values into an array argument"),
    ((ast.GeneratorExp,), "a generator expression", "use a loop or a list comprehension"),
    ((ast.With, ast.AsyncWith), "a 'with' statement", "write the body without it"),
    ((ast.ClassDef,), "a class definition", "define the class outside the kernel"),
    ((ast.Global, ast.Nonlocal), "a 'global' or 'nonlocal' statement",
     "write results into an array argument"),
)


def check_definition(kernel) -> None:
    """KernelCompileError where ``kernel``'s signature or (where readable) body holds
    what no device compiles."""
    code = kernel.pyfunc.__code__ if kernel.pyfunc is not None else None
    if code is not None and (code.co_flags & (_VARARGS | _VARKEYWORDS) or code.co_kwonlyargcount):
        raise _error(kernel, code.co_firstlineno, "its parameters include *args, **kwargs or keyword-only "
                     "parameters", "name each parameter before any '*' (a launch passes them by position)")
    if kernel.has_source:
        for node in ast.walk(kernel.definition):
            _check_node(kernel, node)


_VARARGS, _VARKEYWORDS = 0x04, 0x08  # inspect.CO_VARARGS, inspect.CO_VARKEYWORDS


def _check_node(kernel, node) -> None:
    for kinds, what, advice in _REFUSED:
        if isinstance(node, kinds):
            raise _error(kernel, _line(kernel, node.lineno), f"it holds {what}", advice)
    if isinstance(node, ast.Delete) and any(isinstance(t, ast.Name) for t in node.targets):
        raise _error(kernel, _line(kernel, node.lineno), "it deletes a name ('del')", "let the name go out of use instead")
    if isinstance(node, ast.FormattedValue) and node.format_spec is not None:
        raise _error(kernel, _line(kernel, node.lineno), "an f-string in it has a format spec ('{x:.2f}')",
                     "format without a spec ('{x}')")
    if node is not kernel.definition and isinstance(node, (ast.FunctionDef, ast.Lambda)):
        _check_nested(kernel, node)


def _check_nested(kernel, f) -> None:
    """A function the kernel defines: no decorators, no keyword-only parameters (Numba
    fails on them), defaults only constants (Numba's CPU compiler evaluates some other
    defaults wrongly, without an error)."""
    name = "a lambda" if isinstance(f, ast.Lambda) else f"nested function {f.name!r}"
    line = _line(kernel, f.lineno)
    if getattr(f, "decorator_list", None):
        raise _error(kernel, _line(kernel, f.decorator_list[0].lineno), f"{name} in it is decorated",
                     "define it without a decorator")
    if f.args.kwonlyargs:
        raise _error(kernel, line, f"{name} in it has keyword-only parameters",
                     "make them positional parameters")
    positional = [*f.args.posonlyargs, *f.args.args]
    for param, default in zip(positional[len(positional) - len(f.args.defaults):], f.args.defaults):
        if not _constant(default):
            raise _error(kernel, _line(kernel, default.lineno),
                         f"the default of parameter {param.arg!r} of {name} in it is not a constant "
                         f"({ast.unparse(default)}): Numba evaluates such defaults wrongly in some calls",
                         "pass the value at each call")


def _constant(e) -> bool:
    """A literal: a number, string, None, a negated number, a tuple of literals."""
    if isinstance(e, ast.UnaryOp) and isinstance(e.op, (ast.USub, ast.UAdd)):
        return _constant(e.operand)
    if isinstance(e, ast.Tuple):
        return all(map(_constant, e.elts))
    return isinstance(e, ast.Constant)


def check_globals(kernel, frozen_writes: dict) -> None:
    """KernelCompileError where ``kernel`` reads a plain Python function (compiled code
    cannot call one), or writes a global or captured array: ``frozen_writes``, {name:
    line of the first write in its definition} as access analysis found them."""
    for name, value in sorted(kernel._globals.items()):
        if isinstance(value, types.FunctionType) and not _compiled(value):
            raise _error(kernel, _first_use(kernel, name),
                         f"it calls {name!r}, a plain Python function, which compiled code cannot call",
                         f"decorate {name!r} with @numba.njit, or make it a kernel (@hetflow.kernel)")
    if frozen_writes:
        name, line = min(frozen_writes.items(), key=lambda item: item[1])
        held = "a function's default" if name.endswith("=...)") else "a global or captured variable"
        raise _error(kernel, _line(kernel, line),
                     f"it writes {name!r}, a NumPy array held by {held}: compiled code holds such an array "
                     f"as a constant, frozen at the first launch, and never copies it back from a GPU",
                     "pass the array to the kernel as an argument")


def _compiled(fn) -> bool:
    """Numba can call ``fn`` (an ``@overload``'s Python function, hetflow.atomic's)."""
    context = numba.core.registry.cpu_target.typing_context
    context.refresh()  # overloads registered since the last look
    try:
        context.resolve_value_type(fn)
    except (ValueError, numba.core.errors.TypingError):
        return False
    return True


def _first_use(kernel, name: str) -> int:
    """The line in the user's file where the body first names ``name`` (its ``def``'s
    where the source cannot be read)."""
    if not kernel.has_source:
        return kernel.def_line
    lines = [n.lineno for n in ast.walk(kernel.definition) if isinstance(n, ast.Name) and n.id == name]
    return _line(kernel, min(lines)) if lines else kernel.def_line


def _line(kernel, line: int) -> int:
    """The line in the kernel's file of ``line`` of its definition."""
    return line + kernel.source.firstlineno - 1


def _error(kernel, line: int, what: str, advice: str) -> KernelCompileError:
    """The error for ``kernel`` at ``line`` of its file."""
    return KernelCompileError(f"kernel {kernel.name!r} ({kernel.filename}:{line}) cannot be compiled for any "
                              f"device: {what}; {advice}")
