"""hetflow's small expression language for rule predicates and computed values.

Rules are written by other people and loaded from files, so their expressions are
parsed and evaluated here, never handed to Python's ``eval``. The language has numbers,
strings, booleans, dotted names (monitor variables such as ``gpu.utilization``),
``+ - * / %``, comparisons (chainable, as in Python), ``and``/``or``/``not``,
parentheses and calls to a fixed set of functions supplied by the evaluator.

    expr    := or
    or      := and ("or" and)*
    and     := not ("and" not)*
    not     := "not" not | compare
    compare := sum (("<"|"<="|">"|">="|"=="|"!=") sum)*
    sum     := product (("+"|"-") product)*
    product := unary (("*"|"/"|"%") unary)*
    unary   := "-" unary | "+" unary | atom
    atom    := NUMBER | STRING | "true" | "false" | NAME | NAME "(" args ")" | "(" expr ")"

Every node keeps the offset of its first character, so an error names its column.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import operator
import re
from typing import Callable, Mapping

from ..errors import RuleError, RuleSyntaxError

# -- tokens --------------------------------------------------------------------------

_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<number>(?:\d[\d_]*\.?[\d_]*|\.\d[\d_]*)(?:[eE][+-]?\d+)?)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)
  | (?P<op><=|>=|==|!=|[-+*/%<>(),])
""", re.VERBOSE)

_KEYWORDS = {"and", "or", "not", "true", "false", "True", "False"}
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'"}


@dataclasses.dataclass(frozen=True)
class Token:
    kind: str   # 'number', 'string', 'name', 'keyword', 'op', 'end'
    text: str
    pos: int


def tokenize(text: str, where: "Where | None" = None) -> list[Token]:
    """Split ``text`` into tokens; an unknown character raises RuleSyntaxError."""
    tokens, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise _syntax(f"unexpected character {text[pos]!r}", text, pos, where)
        kind = m.lastgroup
        if kind != "ws":
            word = m.group()
            if kind == "name" and word in _KEYWORDS:
                kind = "keyword"
            tokens.append(Token(kind, word, pos))
        pos = m.end()
    tokens.append(Token("end", "", len(text)))
    return tokens


# -- syntax tree ----------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Node:
    pos: int


@dataclasses.dataclass(frozen=True)
class Const(Node):
    value: object


@dataclasses.dataclass(frozen=True)
class Name(Node):
    name: str


@dataclasses.dataclass(frozen=True)
class Unary(Node):
    op: str
    operand: Node


@dataclasses.dataclass(frozen=True)
class Binary(Node):
    op: str
    left: Node
    right: Node


@dataclasses.dataclass(frozen=True)
class BoolOp(Node):
    op: str              # 'and' | 'or'
    operands: tuple


@dataclasses.dataclass(frozen=True)
class Compare(Node):
    first: Node
    rest: tuple          # ((op, node), ...)


@dataclasses.dataclass(frozen=True)
class Call(Node):
    func: str
    args: tuple


@dataclasses.dataclass(frozen=True)
class Where:
    """Where an expression sits in a file, to report errors at file positions."""

    filename: str
    line: int            # line of the expression's first character (1-based)
    column: int          # column of the expression's first character (1-based)
    source_line: str = ""


def _syntax(msg: str, text: str, pos: int, where: Where | None) -> RuleSyntaxError:
    if where is None:
        return RuleSyntaxError(f"{msg} at column {pos + 1} of expression {text!r}",
                               ("<expression>", 1, pos + 1, text))
    # The expression may span lines (TOML multi-line strings): walk to the error.
    before = text[:pos]
    line = where.line + before.count("\n")
    col = (pos - before.rfind("\n")) if "\n" in before else where.column + pos
    return RuleSyntaxError(f"{where.filename}:{line}:{col}: {msg} in expression {text!r}",
                           (where.filename, line, col, where.source_line))


# -- parser ----------------------------------------------------------------------------

_COMPARE = {"<", "<=", ">", ">=", "==", "!="}


class _Parser:
    def __init__(self, text: str, where: Where | None):
        self.text, self.where = text, where
        self.tokens = tokenize(text, where)
        self.k = 0

    @property
    def tok(self) -> Token:
        return self.tokens[self.k]

    def error(self, msg: str, tok: Token | None = None) -> RuleSyntaxError:
        return _syntax(msg, self.text, (tok or self.tok).pos, self.where)

    def take(self) -> Token:
        tok = self.tok
        self.k += 1
        return tok

    def accept(self, *texts) -> Token | None:
        if self.tok.kind in ("op", "keyword") and self.tok.text in texts:
            return self.take()
        return None

    def expect(self, text: str) -> Token:
        tok = self.accept(text)
        if tok is None:
            found = self.tok.text or "end of expression"
            raise self.error(f"expected {text!r}, found {found!r}")
        return tok

    def parse(self) -> Node:
        if self.tok.kind == "end":
            raise self.error("empty expression")
        node = self.or_()
        if self.tok.kind != "end":
            raise self.error(f"unexpected {self.tok.text!r}")
        return node

    def or_(self) -> Node:
        return self._bool("or", self.and_)

    def and_(self) -> Node:
        return self._bool("and", self.not_)

    def _bool(self, op, sub) -> Node:
        first = sub()
        items = [first]
        while self.accept(op):
            items.append(sub())
        return first if len(items) == 1 else BoolOp(first.pos, op, tuple(items))

    def not_(self) -> Node:
        tok = self.accept("not")
        if tok:
            return Unary(tok.pos, "not", self.not_())
        return self.compare()

    def compare(self) -> Node:
        first = self.sum()
        rest = []
        while self.tok.kind == "op" and self.tok.text in _COMPARE:
            op = self.take().text
            rest.append((op, self.sum()))
        return Compare(first.pos, first, tuple(rest)) if rest else first

    def sum(self) -> Node:
        node = self.product()
        while (tok := self.accept("+", "-")):
            node = Binary(node.pos, tok.text, node, self.product())
        return node

    def product(self) -> Node:
        node = self.unary()
        while (tok := self.accept("*", "/", "%")):
            node = Binary(node.pos, tok.text, node, self.unary())
        return node

    def unary(self) -> Node:
        tok = self.accept("-", "+")
        if tok:
            return Unary(tok.pos, tok.text, self.unary())
        return self.atom()

    def atom(self) -> Node:
        tok = self.tok
        if tok.kind == "number":
            self.take()
            return Const(tok.pos, _number(tok.text))
        if tok.kind == "string":
            self.take()
            return Const(tok.pos, _unquote(tok.text))
        if tok.kind == "keyword" and tok.text in ("true", "True", "false", "False"):
            self.take()
            return Const(tok.pos, tok.text in ("true", "True"))
        if tok.kind == "name":
            self.take()
            if self.accept("("):
                return Call(tok.pos, tok.text, self.arguments())
            return Name(tok.pos, tok.text)
        if self.accept("("):
            node = self.or_()
            self.expect(")")
            return node
        found = tok.text or "end of expression"
        raise self.error(f"expected a value, found {found!r}")

    def arguments(self) -> tuple:
        args = []
        if not self.accept(")"):
            args.append(self.or_())
            while self.accept(","):
                args.append(self.or_())
            self.expect(")")
        return tuple(args)


def _number(text: str):
    text = text.replace("_", "")
    if re.fullmatch(r"\d+", text):
        return int(text)
    return float(text)


def _unquote(text: str) -> str:
    body = text[1:-1]
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), "\\" + m.group(1)), body)


@dataclasses.dataclass(frozen=True)
class Expr:
    """A parsed expression: its text and syntax tree."""

    text: str
    tree: Node

    @functools.cached_property
    def _names(self) -> frozenset:
        found = set()

        def walk(node):
            if isinstance(node, Name):
                found.add(node.name)
            for field in dataclasses.fields(node):
                value = getattr(node, field.name)
                for item in _flatten(value):
                    if isinstance(item, Node):
                        walk(item)

        walk(self.tree)
        return frozenset(found)

    def names(self) -> set[str]:
        """The variable names the expression reads."""
        return set(self._names)

    def evaluate(self, env: "Environment"):
        return _Evaluator(env, self.text).eval(self.tree)

    def __str__(self):
        return self.text


def _flatten(value):
    if isinstance(value, tuple):
        for item in value:
            yield from _flatten(item)
    else:
        yield value


def parse(text: str, where: Where | None = None) -> Expr:
    """Parse ``text``; RuleSyntaxError (with file, line, column when ``where`` is given)."""
    if not isinstance(text, str):
        raise RuleSyntaxError(f"an expression must be a string, not {type(text).__name__}",
                              (where.filename if where else "<expression>",
                               where.line if where else 1, where.column if where else 1, ""))
    return Expr(text, _Parser(text, where).parse())


# -- evaluation -------------------------------------------------------------------------

class UnknownName(RuleError, NameError):
    """An expression read a variable that nobody has set."""

    def __init__(self, name: str, text: str):
        super().__init__(f"unknown variable {name!r} in expression {text!r}")
        self.name = name


@dataclasses.dataclass
class Environment:
    """What an expression can see: variables by dotted name and callable functions."""

    lookup: Callable[[str], object]                  # raises KeyError when unknown
    functions: Mapping[str, Callable] = dataclasses.field(default_factory=dict)


BUILTINS: dict[str, Callable] = {
    "min": min,
    "max": max,
    "abs": abs,
    "round": round,
    "floor": math.floor,
    "ceil": math.ceil,
}


class _Evaluator:
    def __init__(self, env: Environment, text: str):
        self.env, self.text = env, text

    def fail(self, msg: str, node: Node) -> RuleError:
        return RuleError(f"{msg} (column {node.pos + 1} of expression {self.text!r})")

    def eval(self, node: Node):
        method = getattr(self, "_" + type(node).__name__)
        return method(node)

    def _Const(self, node):
        return node.value

    def _Name(self, node):
        try:
            return self.env.lookup(node.name)
        except KeyError:
            raise UnknownName(node.name, self.text) from None

    def _Unary(self, node):
        value = self.eval(node.operand)
        if node.op == "not":
            return not _truth(value, self, node)
        _number_operand(value, node.op, self, node)
        return -value if node.op == "-" else +value

    def _Binary(self, node):
        a, b = self.eval(node.left), self.eval(node.right)
        if node.op == "+" and isinstance(a, str) and isinstance(b, str):
            return a + b
        _number_operand(a, node.op, self, node)
        _number_operand(b, node.op, self, node)
        if node.op in "/%" and b == 0:
            raise self.fail(f"division by zero in {node.op!r}", node)
        return _ARITHMETIC[node.op](a, b)

    def _BoolOp(self, node):
        # Short-circuit, returning booleans (the language has no truthy objects).
        for item in node.operands:
            value = _truth(self.eval(item), self, item)
            if node.op == "and" and not value:
                return False
            if node.op == "or" and value:
                return True
        return node.op == "and"

    def _Compare(self, node):
        left = self.eval(node.first)
        for op, right_node in node.rest:
            right = self.eval(right_node)
            if op in ("==", "!="):
                ok = (left == right) if op == "==" else (left != right)
            else:
                if not _orderable(left, right):
                    raise self.fail(f"cannot order {_kind(left)} and {_kind(right)} with {op!r}", node)
                ok = _ORDER[op](left, right)
            if not ok:
                return False
            left = right
        return True

    def _Call(self, node):
        fn = self.env.functions.get(node.func, BUILTINS.get(node.func))
        if fn is None:
            known = ", ".join(sorted({*BUILTINS, *self.env.functions}))
            raise self.fail(f"unknown function {node.func!r} (functions: {known})", node)
        args = [self.eval(a) for a in node.args]
        try:
            return fn(*args)
        except RuleError:
            raise
        except (TypeError, ValueError, KeyError) as exc:
            raise self.fail(f"{node.func}() failed: {exc}", node) from exc


_ARITHMETIC = {"+": operator.add, "-": operator.sub, "*": operator.mul,
               "/": operator.truediv, "%": operator.mod}
_ORDER = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


def _kind(value) -> str:
    return "a boolean" if isinstance(value, bool) else (
        "a string" if isinstance(value, str) else "a number" if isinstance(value, numbers.Real) else
        type(value).__name__)


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _orderable(a, b) -> bool:
    return (_is_number(a) and _is_number(b)) or (isinstance(a, str) and isinstance(b, str))


def _truth(value, ev: _Evaluator, node: Node) -> bool:
    if not isinstance(value, bool):
        raise ev.fail(f"expected a boolean, got {_kind(value)} {value!r}", node)
    return value


def _number_operand(value, op, ev: _Evaluator, node: Node) -> None:
    if not _is_number(value):
        raise ev.fail(f"operator {op!r} needs numbers, got {_kind(value)} {value!r}", node)
