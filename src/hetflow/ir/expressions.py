"""Rule expressions: Python expressions, parsed with :mod:`ast`, checked, compiled once.

Rules are written by other people and loaded from files, so their expressions are
never handed to Python's ``eval``. :func:`parse` reads the text with ``ast.parse``,
accepts only

- constants: finite numbers (``1e400`` overflows to inf: refused; integers of at most
  :data:`MAX_INT_BITS` bits), strings, ``True``, ``False``;
- variables by name, dotted names meaning one variable (``gpu.utilization``,
  ``throughput.cpu0``, ``node.pieces``);
- ``+ - * / // %`` (``+`` also joins strings), unary ``-``, ``+``;
- comparisons ``< <= > >= == !=``, chained as in Python;
- ``and``, ``or``, ``not`` on booleans (a number is not a truth value here);
- calls of a fixed set of functions by name with positional arguments:
  ``min max abs round floor ceil`` and the context's ``count(kind)``,
  ``defined(name)``, ``happened(event)``, ``compiled(device)``;

and compiles the tree into nested closures, so evaluating it is a few Python calls.
Anything else (``**``, subscripts, lambdas, comprehensions, attributes of calls, keyword
arguments) is a RuleSyntaxError naming where the expression came from and its column.
Nesting is bounded (:data:`MAX_DEPTH` levels), so no expression reaches Python's
recursion limit; so are the values evaluation builds (:data:`MAX_INT_BITS`,
:data:`MAX_STRING`, :data:`ROUND_DIGITS`), so that no rule exhausts time or memory.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import math
import numbers
import operator
from collections.abc import Callable, Mapping

from ..errors import RuleError, RuleSyntaxError

MAX_DEPTH = 200  # syntax-tree levels; 100 nested parenthesised operations fit

BUILTINS: dict[str, Callable] = {
    "min": min,
    "max": max,
    "abs": abs,
    "round": round,
    "floor": math.floor,
    "ceil": math.ceil,
}
CONTEXT_FUNCTIONS = ("count", "defined", "happened", "compiled")
FUNCTIONS = frozenset(BUILTINS) | frozenset(CONTEXT_FUNCTIONS)
# How many arguments each function takes (fewest, most; None: no limit), checked when
# an expression is parsed so that a rule file with min() fails when it loads.
ARITY = {"min": (2, None), "max": (2, None), "abs": (1, 1), "round": (1, 2), "floor": (1, 1),
         "ceil": (1, 1), "count": (1, 1), "defined": (1, 1), "happened": (1, 1), "compiled": (1, 1)}
# The fields of the matched node an expression reads as node.<field> (the interpreter's
# Scope gives their values): any other node.<name> is refused when parsed.
NODE_FIELDS = ("id", "op", "kernel", "size", "ndim", "dtype", "place", "pieces", "devices", "nodes")
# Bounds on what evaluating may build, so that a rule setting a variable from itself
# (``x * x``, ``s + s``) at every round fails instead of exhausting time or memory:
# integers of at most MAX_INT_BITS bits (floats reach 1e308, about as far), strings
# of at most MAX_STRING characters, round() to at most ROUND_DIGITS digits either side
# of the point (rounding an integer to -n digits computes 10**n).
MAX_INT_BITS = 1024
MAX_STRING = 65536
ROUND_DIGITS = 400
SHOWN_TEXT = 200  # characters of an expression quoted in a message; longer ones are cut


@dataclasses.dataclass(frozen=True)
class Where:
    """Where an expression was written: its file, its rule and the key holding it."""

    filename: str | None      # None: written in Python (a Rule's arguments)
    rule: str
    key: str

    def __str__(self):
        place = f"rule {self.rule!r}, key {self.key!r}"
        return f"{self.filename}: {place}" if self.filename else place


class UnknownName(RuleError, NameError):
    """An expression read a variable that nobody has set."""

    def __init__(self, name: str, text: str):
        super().__init__(f"unknown variable {name!r} in expression {shown(text)}")
        self.name = name


@dataclasses.dataclass
class Environment:
    """What an expression can see: variables by dotted name and the context's functions."""

    lookup: Callable[[str], object]                  # raises KeyError when unknown
    functions: Mapping[str, Callable] = dataclasses.field(default_factory=dict)

    def call(self, name: str, args: list):
        fn = self.functions.get(name)
        if fn is None:
            raise RuleError(f"{name}() is not available here (no rule context)")
        return fn(*args)


class Expr:
    """A checked, compiled expression: its text, the variables it reads, ``evaluate(env)``.

    ``env`` has ``lookup(name)`` (KeyError when unknown) and ``call(name, args)`` for the
    context's functions (:data:`CONTEXT_FUNCTIONS`). Expressions of the same text share
    their compiled form.
    """

    __slots__ = ("_names", "_run", "text", "where")

    def __init__(self, text: str, where: Where | None = None):
        self.text, self.where = text, where
        try:
            self._run, self._names = _compiled(text)
        except _Invalid as exc:
            raise _syntax(exc.args[0], text, exc.args[1], where) from None

    def names(self) -> set[str]:
        """The variable names the expression reads."""
        return set(self._names)

    def evaluate(self, env):
        try:
            return self._run(env)
        except _Failure as exc:
            msg, column = exc.args
            raise RuleError(f"{self._origin()}{msg} at column {column} of {shown(self.text)}") from exc.__cause__
        except RecursionError:  # evaluated from a stack already near Python's limit
            raise RuleError(f"{self._origin()}nested too deeply for the stack it is evaluated on: "
                            f"{shown(self.text)}") from None

    def _origin(self) -> str:
        return f"{self.where}: " if self.where is not None else "expression: "

    def __eq__(self, other):
        return isinstance(other, Expr) and other.text == self.text

    def __hash__(self):
        return hash(self.text)

    def __str__(self):
        return self.text

    def __repr__(self):
        return f"Expr({self.text!r})"


def parse(text, where: Where | None = None) -> Expr:
    """Check and compile ``text``; RuleSyntaxError naming ``where`` and the column."""
    if not isinstance(text, str):
        raise _syntax(f"an expression must be a string, not {type(text).__name__}", str(text), None, where)
    return Expr(text, where)


def shown(text: str) -> str:
    """``text`` quoted for a message, cut to :data:`SHOWN_TEXT` characters: a rule file
    may hold an expression of a megabyte, which no message should repeat."""
    if len(text) <= SHOWN_TEXT:
        return repr(text)
    return f"{text[:SHOWN_TEXT]!r}... ({len(text)} characters)"


def finite(value) -> bool:
    """Whether the number ``value`` is finite as a float: an integer too large for one
    (up to :data:`MAX_INT_BITS` bits) is not, where ``math.isfinite`` would raise."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _syntax(msg: str, text: str, column: int | None, where: Where | None) -> RuleSyntaxError:
    origin = f"{where}: " if where is not None else ""
    at = f" at column {column}" if column is not None else ""
    err = RuleSyntaxError(f"{origin}{msg}{at} of expression {shown(text)}",
                          (where.filename if where else "<expression>", None, column, text))
    err.rule, err.key = (where.rule, where.key) if where else (None, None)
    return err


class _Invalid(Exception):
    """(message, column or None): the text is not an allowed expression."""


class _Failure(Exception):
    """(message, column): evaluation failed; :meth:`Expr.evaluate` says where."""


@functools.lru_cache(maxsize=4096)
def _compiled(text: str) -> tuple[Callable, frozenset]:
    """(closure, names read) for ``text``; _Invalid when it is not an allowed expression."""
    body = text.lstrip(" \t")  # eval mode takes no leading indent; columns shift back below
    shift = len(text) - len(body)
    if not body.strip():
        raise _Invalid("empty expression", 1)
    try:
        tree = ast.parse(body, mode="eval")
    except SyntaxError as exc:
        msg, column = exc.msg, (exc.offset or 0) + shift
        if "integer string conversion" in msg:  # Python's own bound on decimal literals
            msg = f"an integer literal of more than {MAX_INT_BITS} bits is not allowed (integers are bounded)"
        if not exc.offset:  # Python reports an expression that stops too early at offset 0
            msg = "incomplete expression" if msg == "invalid syntax" else msg
            column = len(text.rstrip()) + 1
        if exc.lineno and exc.lineno > 1:
            column = None
        if "\n" in body:
            msg += " (an expression spanning lines needs parentheses, as in Python)"
        raise _Invalid(msg, column) from None
    except (MemoryError, RecursionError, ValueError) as exc:  # too deep for Python's parser; NUL bytes
        raise _Invalid(f"cannot parse: {exc or 'nested too deeply'}", None) from None
    names: set[str] = set()
    try:
        run = _Compiler(text, shift, names).compile(tree.body, 0)
    except RecursionError:  # MAX_DEPTH levels, called from a stack already near Python's limit
        raise _Invalid("nested too deeply for the stack it is compiled on", None) from None
    return run, frozenset(names)


# -- compilation to closures -----------------------------------------------------------
_ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
               ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
_SYMBOL = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
           ast.Pow: "**", ast.MatMult: "@", ast.LShift: "<<", ast.RShift: ">>", ast.BitAnd: "&",
           ast.BitOr: "|", ast.BitXor: "^", ast.Invert: "~", ast.In: "in", ast.NotIn: "not in",
           ast.Is: "is", ast.IsNot: "is not"}
_ORDER = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge}
_EQUAL = {ast.Eq: operator.eq, ast.NotEq: operator.ne}
_KINDS = {ast.Subscript: "subscripts", ast.Lambda: "lambdas", ast.IfExp: "conditional expressions",
          ast.ListComp: "comprehensions", ast.SetComp: "comprehensions", ast.DictComp: "comprehensions",
          ast.GeneratorExp: "comprehensions", ast.List: "lists", ast.Tuple: "tuples", ast.Dict: "dicts",
          ast.Set: "sets", ast.NamedExpr: "assignments", ast.JoinedStr: "f-strings", ast.Starred: "unpacking",
          ast.Await: "await", ast.Yield: "yield", ast.YieldFrom: "yield", ast.Slice: "slices"}


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _bits(value) -> int:
    """Bits of a Python integer (NumPy's are bounded by their type), else 0."""
    return value.bit_length() if isinstance(value, int) else 0


def _bounded(value, what: str, column: int):
    """``value`` when within :data:`MAX_INT_BITS`, else a failure naming ``what`` made it."""
    if _bits(value) > MAX_INT_BITS:
        raise _Failure(f"{what!r} made an integer of more than {MAX_INT_BITS} bits", column)
    return value


def _builtin_arguments(name: str, values: list, column: int) -> None:
    """Numbers for the built-in functions (min and max also take strings, all of them),
    never booleans; round's digits within :data:`ROUND_DIGITS`."""
    if name in ("min", "max") and all(isinstance(v, str) for v in values):
        return
    for value in values:
        if not _is_number(value):
            raise _Failure(f"{name}() failed: it takes numbers, not {_kind(value)} {value!r}", column)
    if name == "round" and len(values) == 2 and abs(values[1]) > ROUND_DIGITS:
        raise _Failure(f"round() failed: its digits must be from {-ROUND_DIGITS} to {ROUND_DIGITS}, not {values[1]!r}", column)


def _kind(value) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return "a string"
    return "a number" if isinstance(value, numbers.Real) else type(value).__name__


class _Compiler:
    """Turns a syntax tree into functions ``fn(env) -> value``, checking every node.

    The functions hold columns, not tree nodes, and raise :class:`_Failure` without
    naming where the text came from, so that one compiled form serves every rule using
    it. What each function needs is bound as default arguments, not closed over: one
    tuple per function instead of a cell per value, which keeps a file of many rules
    light for the garbage collector.
    """

    def __init__(self, text: str, shift: int, names: set):
        self.text, self.shift, self.names = text, shift, names

    def column(self, node: ast.AST) -> int:
        """1-based column in the text of what ``node`` is about: an operator's symbol, else its start."""
        shift = self.shift if node.lineno == 1 else 0
        left = getattr(node, "left", None)
        if isinstance(node, (ast.BinOp, ast.Compare)) and left.end_lineno == left.lineno == 1:
            k = left.end_col_offset + shift
            while k < len(self.text) and self.text[k] in " \t)":
                k += 1
            return k + 1
        return node.col_offset + shift + 1

    def error(self, msg: str, node: ast.AST) -> _Invalid:
        return _Invalid(msg, self.column(node))

    def compile(self, node: ast.AST, depth: int):
        # Bounded here, before recursing further, so that neither this compiler nor the
        # closures it makes come near Python's recursion limit.
        if depth > MAX_DEPTH:
            raise self.error(f"nested more than {MAX_DEPTH} levels deep", node)
        method = getattr(self, "_" + type(node).__name__, None)
        if method is None:
            what = _KINDS.get(type(node), type(node).__name__)
            raise self.error(f"{what} are not allowed in rule expressions", node)
        return method(node, depth + 1)

    def _Constant(self, node, depth):
        value = node.value
        if not isinstance(value, (bool, int, float, str)):
            raise self.error(f"the constant {value!r} is not allowed (numbers, strings, True, False)", node)
        if isinstance(value, float) and not math.isfinite(value):  # a literal beyond the float range
            written = ast.get_source_segment(self.text[self.shift:], node)
            raise self.error(f"the number {written} overflows to {value!r} (numbers must be finite)", node)
        if _bits(value) > MAX_INT_BITS:  # as large as evaluation may make: refused before it runs
            raise self.error(f"the integer literal of {value.bit_length()} bits is beyond the bound of "
                             f"{MAX_INT_BITS} bits on integers", node)
        return lambda env, value=value: value

    def _Name(self, node, depth):
        if node.id in ("true", "false"):
            raise self.error(f"unknown name {node.id!r}: write {node.id.capitalize()}, as in Python", node)
        return self._variable(node.id, node)

    def _Attribute(self, node, depth):
        parts, base = [node.attr], node.value
        while isinstance(base, ast.Attribute):
            parts.append(base.attr)
            base = base.value
        if not isinstance(base, ast.Name):
            raise self.error("attributes are read from variable names only (as in gpu.utilization)", node)
        parts.append(base.id)
        return self._variable(".".join(reversed(parts)), node)

    def _variable(self, name: str, node: ast.AST):
        field = name[5:] if name.startswith("node.") else None
        if field is not None and field not in NODE_FIELDS:
            raise self.error(f"unknown node field {field!r} (node fields: {', '.join(NODE_FIELDS)})", node)
        self.names.add(name)

        def variable(env, name=name, text=self.text):
            try:
                return env.lookup(name)
            except KeyError:
                raise UnknownName(name, text) from None
        return variable

    def _UnaryOp(self, node, depth):
        operand, column = self.compile(node.operand, depth), self.column(node)
        if isinstance(node.op, ast.Not):
            def negation(env, operand=operand, column=column):
                value = operand(env)
                if value is True or value is False:
                    return not value
                raise _Failure(f"'not' needs a boolean, got {_kind(value)} {value!r}", column)
            return negation
        if not isinstance(node.op, (ast.USub, ast.UAdd)):
            raise self.error(f"operator {_SYMBOL[type(node.op)]!r} is not allowed in rule expressions", node)
        fn, symbol = (operator.neg, "-") if isinstance(node.op, ast.USub) else (operator.pos, "+")

        def sign(env, operand=operand, fn=fn, symbol=symbol, column=column):
            value = operand(env)
            if not _is_number(value):
                raise _Failure(f"operator {symbol!r} needs a number, got {_kind(value)} {value!r}", column)
            return fn(value)
        return sign

    def _BinOp(self, node, depth):
        fn = _ARITHMETIC.get(type(node.op))
        symbol = _SYMBOL[type(node.op)]
        if fn is None:
            raise self.error(f"operator {symbol!r} is not allowed in rule expressions", node)
        left, right = self.compile(node.left, depth), self.compile(node.right, depth)
        joins, column = isinstance(node.op, ast.Add), self.column(node)

        def arithmetic(env, left=left, right=right, fn=fn, joins=joins, symbol=symbol, column=column):
            a, b = left(env), right(env)
            if not (_is_number(a) and _is_number(b)):
                if joins and isinstance(a, str) and isinstance(b, str):
                    if len(a) + len(b) > MAX_STRING:
                        raise _Failure(f"'+' would make a string of more than {MAX_STRING} characters", column)
                    return a + b
                raise _Failure(f"operator {symbol!r} needs numbers, got {_kind(a)} {a!r} and "
                               f"{_kind(b)} {b!r}", column)
            if fn is operator.mul and _bits(a) + _bits(b) > MAX_INT_BITS + 1:
                raise _Failure(f"{symbol!r} would make an integer of more than {MAX_INT_BITS} bits", column)
            try:
                return _bounded(fn(a, b), symbol, column)
            except ZeroDivisionError:
                raise _Failure(f"division by zero in {symbol!r}", column) from None
            except ArithmeticError as exc:
                raise _Failure(f"{symbol!r} failed: {exc}", column) from None
        return arithmetic

    def _BoolOp(self, node, depth):
        items = tuple((self.compile(v, depth), self.column(v)) for v in node.values)
        stop = isinstance(node.op, ast.Or)  # the value that decides: True for 'or', False for 'and'
        word = "or" if stop else "and"

        def logic(env, items=items, stop=stop, word=word):
            for item, column in items:
                value = item(env)
                if value is not True and value is not False:
                    raise _Failure(f"'{word}' needs booleans, got {_kind(value)} {value!r}", column)
                if value is stop:
                    return stop
            return not stop
        return logic

    def _Compare(self, node, depth):
        steps = []
        for op, right in zip(node.ops, node.comparators):
            if type(op) in _ORDER:
                steps.append((_ORDER[type(op)], True, self.compile(right, depth)))
            elif type(op) in _EQUAL:
                steps.append((_EQUAL[type(op)], False, self.compile(right, depth)))
            else:
                raise self.error(f"comparison {_SYMBOL[type(op)]!r} is not allowed in rule expressions", node)
        first, column, steps = self.compile(node.left, depth), self.column(node), tuple(steps)

        def compare(env, first=first, steps=steps, column=column):
            left = first(env)
            for fn, ordered, right_fn in steps:
                right = right_fn(env)
                if ordered and not ((_is_number(left) and _is_number(right))
                                    or (isinstance(left, str) and isinstance(right, str))):
                    raise _Failure(f"cannot order {_kind(left)} and {_kind(right)}", column)
                if not fn(left, right):
                    return False
                left = right
            return True
        return compare

    def _Call(self, node, depth):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            called = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
            raise self.error(f"unknown function {called!r} (functions: {', '.join(sorted(FUNCTIONS))})", node)
        if node.keywords:
            raise self.error(f"{node.func.id}() takes positional arguments only", node)
        name = node.func.id
        fewest, most = ARITY[name]
        if len(node.args) < fewest or (most is not None and len(node.args) > most):
            takes = f"{fewest}" if fewest == most else f"{fewest} or more" if most is None else f"{fewest} to {most}"
            raise self.error(f"{name}() takes {takes} argument(s), {len(node.args)} given", node)
        if name == "defined":  # reads the variable it names
            self.names.update(a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str))
        args, builtin, column = tuple(self.compile(a, depth) for a in node.args), BUILTINS.get(name), self.column(node)

        def call(env, args=args, name=name, builtin=builtin, column=column):
            values = [a(env) for a in args]
            try:
                if builtin is None:
                    return env.call(name, values)
                _builtin_arguments(name, values, column)
                return _bounded(builtin(*values), f"{name}()", column)
            except RuleError:
                raise
            except (TypeError, ValueError, KeyError, ArithmeticError) as exc:
                raise _Failure(f"{name}() failed: {exc}", column) from exc
        return call
