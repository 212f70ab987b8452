"""Kernel source: the text of a kernel function, parsed with its original line numbers.

Kernels are compiled from their function objects; the text, where Python can read
it, serves access analysis (:mod:`.access`) and fusion's legality checks, and finds
the line of an undefined name in a compiler error. Generated text made from a user's
kernel (a wavefront's tile kernel) carries the user's line of each of its lines, so
that what fails in it names the user's file and line.
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap

from ..errors import KernelError


@dataclasses.dataclass(frozen=True)
class KernelSource:
    """A kernel's dedented source, where it came from, and its parsed definition."""

    text: str           # the function's source, decorators blanked, dedented
    filename: str       # the user's file (or a pseudo-name for generated kernels)
    firstlineno: int    # line of ``text``'s first line in ``filename``
    lines: tuple = ()   # where given: the line in ``filename`` of each line of ``text``

    @classmethod
    def from_function(cls, fn) -> "KernelSource":
        try:
            lines, first = inspect.getsourcelines(fn)
        except (OSError, TypeError) as exc:
            raise KernelError(f"cannot read the source of kernel {fn.__name__!r}: {exc}") from exc
        text = textwrap.dedent("".join(lines))
        return cls(_blank_decorators(text), inspect.getsourcefile(fn) or "<unknown>", first)

    @classmethod
    def from_text(cls, text: str, filename: str, lines: tuple = ()) -> "KernelSource":
        """Generated ``text``; ``lines``: the line in ``filename`` of each of its lines."""
        return cls(_blank_decorators(textwrap.dedent(text)), filename, 1, tuple(lines))

    def module(self) -> ast.Module:
        """``text`` parsed, its line numbers those of ``filename`` where ``lines`` says."""
        tree = ast.parse(self.text)
        if self.lines:
            for node in ast.walk(tree):
                if getattr(node, "lineno", None):
                    end = node.end_lineno or node.lineno
                    node.lineno = self.lines[node.lineno - 1]
                    node.end_lineno = max(node.lineno, self.lines[end - 1])  # compile() wants a range
        return tree

    def function(self) -> ast.FunctionDef:
        """The parsed ``def`` (line numbers relative to ``text``, or those ``lines`` gives)."""
        defs = [n for n in self.module().body if isinstance(n, ast.FunctionDef)]
        if len(defs) != 1:
            raise KernelError(f"kernel source in {self.filename} must define exactly one function")
        return defs[0]


def _blank_decorators(text: str) -> str:
    """Replace decorator lines by blank ones: line numbers stay, the decorator goes."""
    tree = ast.parse(text)
    fdef = next((n for n in tree.body if isinstance(n, ast.FunctionDef)), None)
    if fdef is None or not fdef.decorator_list:
        return text
    lines = text.splitlines(keepends=True)
    first = fdef.decorator_list[0].lineno - 1
    for k in range(first, fdef.lineno - 1):
        lines[k] = "\n"
    return "".join(lines)
