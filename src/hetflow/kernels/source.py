"""Kernel source: the text of a kernel function, parsed with its original line numbers.

Code generation rewrites this text in place (spans replaced, lines kept), so that a
compiler error in generated code points at the user's own file and line.
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

    @classmethod
    def from_function(cls, fn) -> "KernelSource":
        try:
            lines, first = inspect.getsourcelines(fn)
        except (OSError, TypeError) as exc:
            raise KernelError(f"cannot read the source of kernel {fn.__name__!r}: {exc}") from exc
        text = textwrap.dedent("".join(lines))
        return cls(_blank_decorators(text), inspect.getsourcefile(fn) or "<unknown>", first)

    @classmethod
    def from_text(cls, text: str, filename: str) -> "KernelSource":
        return cls(_blank_decorators(textwrap.dedent(text)), filename, 1)

    def function(self) -> ast.FunctionDef:
        """The parsed ``def`` (line numbers relative to ``text``)."""
        tree = ast.parse(self.text)
        defs = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
        if len(defs) != 1:
            raise KernelError(f"kernel source in {self.filename} must define exactly one function")
        return defs[0]

    def padded(self, text: str | None = None) -> str:
        """``text`` (default: the source) preceded by blank lines so it sits at its original line."""
        return "\n" * (self.firstlineno - 1) + (self.text if text is None else text)


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


class SpanEditor:
    """Replace AST node spans in a source text, keeping every other character in place."""

    def __init__(self, text: str):
        self.text = text
        self._line_starts = [0]
        for line in text.splitlines(keepends=True):
            self._line_starts.append(self._line_starts[-1] + len(line))
        self._lines = text.splitlines(keepends=True)

    def offset(self, lineno: int, col_byte: int) -> int:
        # AST columns are UTF-8 byte offsets; convert to a character offset.
        line = self._lines[lineno - 1]
        return self._line_starts[lineno - 1] + len(line.encode()[:col_byte].decode())

    def span(self, node) -> tuple[int, int]:
        return (self.offset(node.lineno, node.col_offset),
                self.offset(node.end_lineno, node.end_col_offset))

    def segment(self, node) -> str:
        a, b = self.span(node)
        return self.text[a:b]

    def own_line(self, node) -> bool:
        """``node`` stands alone on its lines: blanks before it, blanks or a comment after."""
        a, b = self.span(node)
        before = self.text[self._line_starts[node.lineno - 1]:a]
        after = self.text[b:self._line_starts[node.end_lineno]].strip()
        return not before.strip() and (not after or after.startswith("#"))

    def rewrite(self, node, replace) -> str:
        """Text of ``node`` where every descendant ``d`` with ``replace(d)`` not None is substituted.

        ``replace(d)`` returns the new text for ``d`` (it may call ``rewrite`` on d's
        children itself) or None to keep ``d`` and look inside it.
        """
        new = replace(node)
        if new is not None:
            return new
        start, end = self.span(node)
        pieces, cursor = [], start
        for child in _children_in_order(node):
            a, b = self.span(child)
            if a < cursor:  # children without own text (e.g. shared ctx objects)
                continue
            text = self.rewrite(child, replace)
            pieces.append(self.text[cursor:a])
            pieces.append(text)
            cursor = b
        pieces.append(self.text[cursor:end])
        return "".join(pieces)


def _children_in_order(node):
    """Positioned descendants one level down; nodes without a position (``arguments``,
    contexts, operators) are looked through."""
    kids = []
    for child in ast.iter_child_nodes(node):
        if getattr(child, "end_lineno", None) is not None:
            kids.append(child)
        else:
            kids.extend(_children_in_order(child))
    return sorted(kids, key=lambda c: (c.lineno, c.col_offset))
