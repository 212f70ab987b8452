"""Symbolic integer index expressions: what views lower to when a kernel is compiled.

A view's ``lower`` turns the symbolic indices of the view into symbolic indices of its
parent. Expressions ``render()`` to Python source that is valid in Numba CPU and CUDA
kernels, and ``bounds(env)`` gives their range by interval arithmetic, which lets a
circular shift drop its modulo where it provably cannot wrap (a guard, as PyTorch
Dynamo would record it: the decision goes into the lowering's key).
"""
from dataclasses import dataclass


class Expr:
    """A symbolic integer expression."""

    def __add__(self, other):
        return _add(self, as_expr(other))

    __radd__ = __add__

    def __mul__(self, other):
        return _mul(self, as_expr(other))

    __rmul__ = __mul__

    def render(self, names=None):
        """Python source of the expression; ``names`` renames variables (name -> source)."""
        raise NotImplementedError

    def bounds(self, env):
        """Inclusive ``(lo, hi)`` given ``env`` (Var name -> (lo, hi), Param name -> value),
        or None when unknown."""
        raise NotImplementedError


def as_expr(value):
    """An expression for ``value`` (an Expr or an integer constant)."""
    return value if isinstance(value, Expr) else Const(int(value))


@dataclass(frozen=True)
class Const(Expr):
    """An integer literal."""

    value: int

    def render(self, names=None):
        return str(self.value) if self.value >= 0 else f"({self.value})"

    def bounds(self, env):
        return self.value, self.value


@dataclass(frozen=True)
class Var(Expr):
    """An index variable of the kernel (one dimension of a view index)."""

    name: str

    def render(self, names=None):
        return (names or {}).get(self.name, self.name)

    def bounds(self, env):
        return env.get(self.name)


@dataclass(frozen=True)
class Param(Expr):
    """A number passed to the kernel at launch (an offset, a shift, an extent)."""

    name: str

    def render(self, names=None):
        return self.name

    def bounds(self, env):
        value = env.get(self.name)
        return None if value is None else (value, value)


@dataclass(frozen=True)
class Add(Expr):
    a: Expr
    b: Expr

    def render(self, names=None):
        return f"({self.a.render(names)} + {self.b.render(names)})"

    def bounds(self, env):
        x, y = self.a.bounds(env), self.b.bounds(env)
        return None if x is None or y is None else (x[0] + y[0], x[1] + y[1])


@dataclass(frozen=True)
class Mul(Expr):
    a: Expr
    b: Expr

    def render(self, names=None):
        return f"({self.a.render(names)} * {self.b.render(names)})"

    def bounds(self, env):
        x, y = self.a.bounds(env), self.b.bounds(env)
        if x is None or y is None:
            return None
        corners = [p * q for p in x for q in y]
        return min(corners), max(corners)


def _add(a, b):
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(a.value + b.value)
    if b == Const(0):
        return a
    return b if a == Const(0) else Add(a, b)


def _mul(a, b):
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(a.value * b.value)
    if Const(0) in (a, b):
        return Const(0)
    if b == Const(1):
        return a
    return b if a == Const(1) else Mul(a, b)


_WRAP_FORMS = {
    "high": "({t} - {n} if {t} >= {n} else {t})",
    "low": "({t} + {n} if {t} < 0 else {t})",
    "mod": "({t} % {n})",
}


@dataclass(frozen=True)
class Wrap(Expr):
    """``t`` brought into ``[0, n)``: ``high`` assumes t in [0, 2n), ``low`` t in [-n, n)
    (one compare and one add: the two affine pieces), ``mod`` any t (a remainder)."""

    t: Expr
    n: Expr
    mode: str

    def render(self, names=None):
        return _WRAP_FORMS[self.mode].format(t=self.t.render(names), n=self.n.render(names))

    def bounds(self, env):
        nb, tb = self.n.bounds(env), self.t.bounds(env)
        if nb is None:
            return None
        if tb is not None and 0 <= tb[0] and tb[1] < nb[0]:
            return tb
        return 0, nb[1] - 1


@dataclass(frozen=True)
class Call(Expr):
    """Component ``component`` of the index tuple a co-map function returns."""

    name: str
    args: tuple
    component: int

    def render(self, names=None):
        args = ", ".join(a.render(names) for a in self.args)
        comma = "," if len(self.args) == 1 else ""
        return f"{self.name}(({args}{comma}))[{self.component}]"

    def bounds(self, env):
        return None


def cyclic(i, shift, n, ctx):
    """``(i + shift) mod n`` as cheaply as the bounds of ``i`` allow.

    Returns ``(expr, mode)`` with mode ``"exact"`` (no wrap can happen: plain ``i + s``
    for a representative s of the shift), ``"high"``/``"low"`` (one wrap at most) or
    ``"mod"`` (bounds unknown or too wide). ``n`` is a concrete extent.
    """
    if n == 0:  # an empty dimension: the expression is never evaluated
        return i, "exact"
    s = shift % n
    b = ctx.bounds(i)
    if b is not None:
        lo, hi = b
        for rep in (s, s - n):
            if 0 <= lo + rep and hi + rep < n:
                return i + ctx.number(rep), "exact"
        if 0 <= lo + s and hi + s < 2 * n:
            # One wrap at most: write the shift as the representative nearer zero.
            mode, rep = ("low", s - n) if n - s < s else ("high", s)
            return Wrap(i + ctx.number(rep), ctx.number(n), mode), mode
    return Wrap(i + ctx.number(s), ctx.number(n), "mod"), "mod"


class LowerContext:
    """What lowering a chain of views collects: parameters, functions and the key.

    Numbers become ``Param``s named ``{prefix}p{k}`` (or ``Const``s when ``literal``),
    co-map functions are named ``{prefix}f{k}`` in ``globals``, ``var_ranges`` maps
    index variable names to their inclusive ranges for the wrap guards, and ``key``
    collects one structural entry per operator.
    """

    def __init__(self, prefix="", var_ranges=None, literal=False):
        self.prefix = prefix
        self.literal = literal
        self.env = dict(var_ranges or {})
        self.param_names, self.params = [], []
        self.globals = {}
        self.key = []

    def number(self, value):
        """An expression standing for the integer ``value``."""
        if self.literal:
            return Const(int(value))
        name = f"{self.prefix}p{len(self.params)}"
        self.param_names.append(name)
        self.params.append(int(value))
        self.env[name] = int(value)
        return Param(name)

    def function(self, f):
        """The name under which expressions call the co-map function ``f``."""
        name = f"{self.prefix}f{len(self.globals)}"
        self.globals[name] = f
        return name

    def bounds(self, e):
        """Range of ``e`` over the index variables' ranges, or None when unknown."""
        return e.bounds(self.env)

    def note(self, entry):
        """Record one operator's structural entry for the key."""
        self.key.append(entry)
