"""Lowering views to index expressions for compiled kernels (SPEC §1, "Call sites").

``lowering(view, prefix)`` walks a chain of views down to its root and returns the
root index expressions as Python source in terms of the kernel's index variables and
launch parameters, so that a view costs what hand-written index arithmetic costs. The
source depends only on the ``key`` (the chain's structure, the cshift guards and the
rendered index expressions) and the prefix; the numbers travel as ``params``, so one
compiled kernel serves every view with the same key.

Lowerings are cached by the views' ``signature``, the structure and numbers of the chain
(not the view objects, nor the root array): views built afresh for every launch, as
programs write them, are lowered once.
"""
import dis
import functools
import threading
import types
from collections import OrderedDict
from dataclasses import dataclass, replace
from types import FunctionType

from hetflow.errors import ShapeError
from hetflow.index.expr import Add, Const, LowerContext, Param, Var
from hetflow.index.views import element_extent_of, extent_of, is_view, rank


@dataclass(frozen=True, eq=False)
class Lowering:
    """A view lowered to root index expressions.

    ``root``: the array the kernel indexes (None in the lowerings ``shared_lowering``
    keeps); ``key``: hashable structure of the chain;
    ``param_names``/``params``: launch parameters and their values for this view;
    ``globals``: co-map functions by the names the expressions call them;
    ``exprs``: the root index expressions over the variables ``var_names``, which run
    over ``shape`` (the view's extent, then its element extent); ``root_name``: the
    generated parameter holding the root when another view of the launch passes it;
    ``extent``: the positions in ``params`` of a view's ``shape``, its last ones (a
    kernel's ``v.shape`` reads them, so one compiled kernel serves views of every
    extent; none for an array, which carries its own).
    """

    root: object
    key: tuple
    param_names: tuple
    params: tuple
    globals: dict
    exprs: tuple
    var_names: tuple
    shape: tuple
    root_name: str | None = None
    extent: tuple = ()

    def bound(self, root):
        """This lowering with ``root`` as the array it indexes."""
        return replace(self, root=root)

    def sharing(self, name: str):
        """This lowering reading the root that view parameter ``name`` passes: views of one
        array then index one kernel argument, so the compiler computes its addresses once
        (a 5-view stencil on a GPU otherwise holds 5 copies of the array's fields in
        registers, and runs at 0.6x a hand-written kernel)."""
        return replace(self, key=self.key + (("root of", name),), root_name=f"{name}__root")

    @property
    def rank(self):
        """Number of index variables: the view's rank plus its element rank (tiles)."""
        return len(self.var_names)

    def index_source(self, idx_names, cast=None):
        """Python source of each root index, for view index variables ``idx_names``.

        ``cast`` names a callable wrapped around each root index, e.g. an unsigned type
        the kernel binds (``np.uint64``): root indices are never negative, and an
        unsigned index spares Numba the negative-index wraparound test that signed
        indices with runtime offsets cost on every access.
        """
        if len(idx_names) != self.rank:
            raise ShapeError(f"index_source: {len(idx_names)} index names {tuple(idx_names)} "
                             f"for a view lowered with {self.rank} index variables")
        names = dict(zip(self.var_names, idx_names))
        sources = (e.render(names) for e in self.exprs)
        return tuple(f"{cast}({s})" if cast else s for s in sources)

    @property
    def box(self):
        """The view as one box of its root, a slice per root dimension, when every root
        index is its own view index plus a constant (interior, section, a cshift that
        cannot wrap over the view); else None. Such a view is read and written by
        slicing, without index arrays."""
        shape = getattr(self.root, "shape", None)
        if shape is None or not len(self.var_names) == len(self.exprs) == len(shape) > 0:
            return None
        env = dict(zip(self.param_names, self.params))
        box = []
        for var, expr in zip(self.var_names, self.exprs):
            found = _translation(expr, env)
            if found is None or found[0] != var:
                return None
            start = found[1]
            box.append(slice(start, start + self.shape[len(box)]))
        return tuple(box)

    @property
    def shifts(self):
        """Per root dimension, (position of its view index variable, constant, positions
        of the parameters added) when every root index is one view index plus numbers
        (interior, section, a cshift that cannot wrap: the root shifted), else None."""
        position = {v: k for k, v in enumerate(self.var_names)}
        params = {p: k for k, p in enumerate(self.param_names)}
        out = []
        for expr in self.exprs:
            found = _terms(expr)
            if found is None:
                return None
            name, const, names = found
            out.append((position[name], const, tuple(params[p] for p in names)))
        return tuple(out)

    def __repr__(self):
        return (f"Lowering(key={self.key!r}, params={dict(zip(self.param_names, self.params))}, "
                f"index={self.index_source(self.var_names)})")


def _terms(expr):
    """(variable name, constant, parameter names) when ``expr`` is one variable plus
    numbers, else None."""
    terms, stack = [], [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, Add):
            stack += [e.a, e.b]
        else:
            terms.append(e)
    names = [t.name for t in terms if isinstance(t, Var)]
    numbers = [t for t in terms if not isinstance(t, Var)]
    if len(names) != 1 or not all(isinstance(t, (Const, Param)) for t in numbers):
        return None
    return (names[0], sum(t.value for t in numbers if isinstance(t, Const)),
            tuple(t.name for t in numbers if isinstance(t, Param)))


def _translation(expr, env):
    """(variable name, offset) when ``expr`` is one variable plus numbers, else None."""
    found = _terms(expr)
    if found is None:
        return None
    name, const, params = found
    return name, const + sum(env[p] for p in params)


def lowering(view, prefix):
    """Lower ``view`` (or a plain array: the identity) for a kernel; every generated name
    starts with ``prefix``, which must make identifiers (e.g. ``"v0_"``).

    Views are immutable, so a view keeps its lowerings (one per prefix), and equal views
    share theirs through ``shared_lowering``.
    """
    if not is_view(view):
        return _lower(view, prefix, root=view)
    own = view.__dict__.setdefault("_lowerings", {})
    found = own.get(prefix)
    if found is None:
        found = own[prefix] = shared_lowering(view, prefix).bound(view.root)
    return found


# (prefix, signature) -> Lowering without its root, least recently used first. Hits take
# no lock (each OrderedDict call is atomic); the lock keeps insertion and eviction whole.
_SHARED = OrderedDict()
_SHARED_SIZE = 4096
_shared_lock = threading.Lock()


def shared_lowering(view, prefix):
    """The lowering of ``view`` with ``root`` None, shared by every view of the same
    ``signature``: what a launch needs, beside the view's own root."""
    key = (prefix, view.signature)
    try:
        found = _SHARED.get(key)
    except TypeError:  # a co_map function that captures unhashable values
        return _lower(view, prefix)
    if found is not None:
        try:
            _SHARED.move_to_end(key)
        except KeyError:  # evicted by another thread meanwhile
            pass
        return found
    found = _lower(view, prefix)
    with _shared_lock:
        _SHARED[key] = found
        if len(_SHARED) > _SHARED_SIZE:
            _SHARED.popitem(last=False)
    return found


def function_key(f):
    """``f`` for a signature: a Python function by its code, defaults, and the values
    (with their types) it captures and of the globals it reads, so that a function
    made afresh with the same code and values matches, and one whose global changed
    does not (compiled code freezes globals; ``view.numpy()`` reads them as they are);
    any other callable by itself."""
    if type(f) is not FunctionType:  # a method's key must hold its object, for one
        return f
    try:
        captured = tuple((type(c.cell_contents), c.cell_contents) for c in f.__closure__ or ())
    except ValueError:  # a captured variable not assigned yet
        return f
    kwdefaults = tuple(sorted((f.__kwdefaults__ or {}).items()))
    return f.__code__, f.__defaults__, kwdefaults, captured, _global_values(f)


@functools.lru_cache(maxsize=4096)
def global_names(code) -> tuple[str, ...]:
    """The globals a code object and the functions nested in it read: the names its
    LOAD_GLOBAL instructions load (``co_names`` also holds attribute names)."""
    names, stack = set(), [code]
    while stack:
        c = stack.pop()
        names.update(i.argval for i in dis.get_instructions(c) if i.opname == "LOAD_GLOBAL")
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return tuple(sorted(names))


def _global_values(f) -> tuple:
    """(name, type, value) of each global ``f`` reads (a builtin's name absent)."""
    ns = f.__globals__
    return tuple([(n, type(ns[n]), ns[n]) for n in global_names(f.__code__) if n in ns])


def _lower(view, prefix, root=None):
    """``view`` (or an array: the identity) lowered, with ``root`` as its root."""
    if not (prefix + "p0").isidentifier():
        raise ShapeError(f"lowering: prefix {prefix!r} does not start valid identifiers")
    shape = tuple(extent_of(view)) + tuple(element_extent_of(view))
    var_names = tuple(f"{prefix}i{k}" for k in range(len(shape)))
    # An empty dimension never runs, so any range is safe for its guards.
    ranges = {v: (0, max(n - 1, 0)) for v, n in zip(var_names, shape)}
    ctx = LowerContext(prefix, ranges)
    exprs, node = tuple(Var(v) for v in var_names), view
    while is_view(node):
        exprs, node = node._lower_full(exprs, ctx), node.parent
    # The key must fix the generated code: the operators' entries alone do not (a cshift
    # over an empty dimension lowers to ``i``, over another one to ``i + p``), so the
    # rendered index expressions are part of it.
    names = dict(zip(var_names, var_names))
    key = (len(shape), rank(node), tuple(ctx.key), tuple(e.render(names) for e in exprs))
    extent = ()
    if is_view(view):  # its extent, last: numbers a kernel reads as ``v.shape``
        extent = tuple(range(len(ctx.params), len(ctx.params) + len(shape)))
        for n in shape:
            ctx.number(n)
    return Lowering(root, key, tuple(ctx.param_names), tuple(ctx.params),
                    dict(ctx.globals), exprs, var_names, shape, extent=extent)
