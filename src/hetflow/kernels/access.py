"""Which kernel parameters are read and which written, found from the kernel's code.

The runtime infers dependencies from these (read-after-write, write-after-read,
write-after-write), the launcher copies back from a GPU only what was written,
parameters subscripted by exactly the launch index are checked against the extent
(unless every such access is guarded by a bound on that index), and those touched only
in the row of the launch's first index (``x[i, ...]``) can be split by rows over devices.

A write at an index that is no function of the launch index (``hist[b] += 1`` with
``b`` read from data) races when indices run in parallel: such parameters are
``scattered``, unless updated through :mod:`hetflow.atomic <.atomic>`.
"""
from __future__ import annotations

import ast
import builtins
import dataclasses

import numpy as np

from . import atomic


@dataclasses.dataclass(frozen=True)
class Access:
    """Per data parameter: 'r', 'w' or 'rw' ('' if unused), and the identity-indexed ones."""

    modes: dict
    identity: dict  # parameter -> k: subscripted by the first k launch indices (i, j, ...)
    rows: frozenset = frozenset()  # parameters only ever subscripted as x[i, ...] (i: the row index)
    # parameter -> axes (< its identity rank) on which every identity subscript is guarded
    # by a bound on that launch index (``if i < n: x[i] = ...``): no extent check there
    guarded: dict = dataclasses.field(default_factory=dict)
    scattered: frozenset = frozenset()  # written, not atomically, at indices no function of the launch index
    atomic: frozenset = frozenset()     # updated through hetflow.atomic
    # Parameters only ever subscripted as x[i, j, ..., more] (all the launch indices first):
    # the kernel at launch index I touches only their elements x[I, ...].
    aligned: frozenset = frozenset()
    # Parameters that a statement every launch index runs (top level, in a kernel without
    # ``return``) assigns at exactly the launch index (``out[i, j] = ...``): the launch
    # overwrites each of their elements it covers, so a device need not copy them in.
    covered: frozenset = frozenset()

    def reads(self, name) -> bool:
        return "r" in self.modes.get(name, "")

    def writes(self, name) -> bool:
        return "w" in self.modes.get(name, "")


# Callables that never write the arrays handed to them.
_PURE_BUILTINS = frozenset(getattr(builtins, n) for n in (
    "abs", "all", "any", "bool", "complex", "divmod", "enumerate", "float", "int", "len", "max",
    "min", "pow", "print", "range", "reversed", "round", "sum", "tuple", "zip"))
_PURE_MODULES = ("math", "cmath")
_NUMPY_WRITERS = frozenset((np.copyto, np.put, np.place, np.putmask, np.fill_diagonal))
# Array methods that write the array they are called on.
_WRITING_METHODS = frozenset(("fill", "sort", "put", "itemset", "partition", "resize", "setfield"))


def pure(obj) -> bool:
    """``obj`` is a function known not to write its arguments (builtins, math, NumPy's
    functions but the few that write, ufuncs called without an output argument)."""
    if obj is None:
        return False
    try:
        if obj in _PURE_BUILTINS:
            return True
    except TypeError:  # unhashable
        return False
    if isinstance(obj, np.ufunc):
        return True  # callers check the output argument (see _pure_call)
    module = getattr(obj, "__module__", None) or ""
    return module in _PURE_MODULES or (module.split(".")[0] == "numpy" and obj not in _NUMPY_WRITERS)


def analyze(fdef: ast.FunctionDef, ndim: int, resolve) -> Access:
    """Access modes of ``fdef``'s data parameters for a launch of rank ``ndim``.

    ``resolve(node)`` returns the object a call's function expression names (a global,
    a module attribute), or None when it is not known.
    """
    return _Analysis(fdef, ndim, resolve).run()


def declared(found: Access | None, data, writes, reads) -> Access:
    """The access of a kernel declaring what it writes and reads (``@hetflow.kernel(
    writes=..., reads=...)``), trusted as stated: ``found`` (the analysis; None where
    the kernel's source cannot be read) with its modes replaced.

    ``writes`` (when not None) is exactly the set of written data parameters, ``reads``
    of read ones; the one not given comes from ``found`` (without source: every data
    parameter). Where nothing was analysed, each declared-written parameter counts as
    written at the launch index only: the index ``(i, ...)`` touches row ``i`` of it and
    no other (``out[i] = ...``, ``out[i, j] = ...``), so a launch may be split by rows over
    devices and the array must have as many rows as the extent's first axis. Where the
    analysis ran, its findings on how parameters are indexed stand.
    """
    if found is None:
        found = Access({p: "rw" for p in data}, {})
        if writes is not None:
            found = Access(found.modes, {p: 1 for p in writes}, frozenset(writes))
    written = writes if writes is not None else {p for p in data if found.writes(p)}
    read = reads if reads is not None else {p for p in data if found.reads(p)}
    modes = {p: ("r" if p in read else "") + ("w" if p in written else "") for p in data}
    return dataclasses.replace(found, modes=modes, scattered=found.scattered & frozenset(written))


class _Analysis:
    def __init__(self, fdef, ndim, resolve):
        self.fdef, self.resolve = fdef, resolve
        params = [a.arg for a in fdef.args.args]
        self.data = set(params[ndim:])
        stored = _stored_names(fdef)
        self.index = [p if p not in stored else None for p in params[:ndim]]  # reassigned: no index
        self.derived, self.invariant = _index_functions(fdef, self.index, stored)
        self.modes = {p: set() for p in params[ndim:]}
        self.identity, self.guarded_axes = {}, {}
        self.other, self.scattered, self.atomic = set(), set(), set()
        self.unaligned = set()  # parameters subscripted other than x[i, j, ..., more]
        self.row = self.index[0] if self.index else None
        self.claimed = self._claimed_names(fdef)

    def run(self) -> Access:
        guards = _guards(self.fdef, self.derived)
        # Indices inside a nested function come through its parameters, which the analysis
        # does not follow: its stores are never judged scattered.
        nested = {id(n) for d in ast.walk(self.fdef) if d is not self.fdef and isinstance(d, _FUNCTIONS)
                  for n in ast.walk(d)}
        for name in _escaping(self.fdef, self.data, self.resolve):  # an alias (o = out) may write anything
            self.modes[name].update("rw")
            self.other.add(name)
        for node in ast.walk(self.fdef):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for sub in (s for t in targets for s in _stores(t)):
                    base = _base_subscript(sub)
                    if base is not None and base.value.id in self.data:
                        self._write(base, "rw" if isinstance(node, ast.AugAssign) else "w", id(node) in nested)
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in self.data:
                self._subscript(node, guards.get(id(node), frozenset()))
            elif isinstance(node, ast.Call):
                self._call(node)
        ordered = {p: "".join(m for m in "rw" if m in self.modes[p]) for p in self.modes}
        touched = {p for p, m in self.modes.items() if m}
        guarded = {p: frozenset(a) for p, a in self.guarded_axes.items() if a and p in self.identity}
        # a reassigned index variable (None here) says nothing about which elements are touched
        aligned = frozenset() if None in self.index or not self.index else \
            frozenset(touched - self.other - self.unaligned)
        returns = any(isinstance(n, ast.Return) and id(n) not in nested for n in ast.walk(self.fdef))
        covered = frozenset() if returns or None in self.index or not self.index else \
            frozenset(_assigned_at_index(self.fdef, self.index) & self.data)
        return Access(ordered, self.identity, frozenset(touched - self.other), guarded,
                      frozenset(self.scattered), frozenset(self.atomic), aligned, covered)

    def _claimed_names(self, fdef) -> set:
        """Locals bound once, to what an atomic returned (``t = atomic.add(n, 0, 1)``):
        indices the atomic handed to one launch index alone (tickets, claims)."""
        stores, values = {}, {}
        for node in ast.walk(fdef):
            if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                stores[node.id] = stores.get(node.id, 0) + 1
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                values[node.targets[0].id] = node.value
        return {n for n, v in values.items() if stores[n] == 1 and self._atomic_call(v)}

    def _atomic_call(self, node) -> bool:
        return isinstance(node, ast.Call) and _is_atomic(self.resolve(node.func))

    def _write(self, base, mode, unjudged=False):
        name = base.value.id
        self.modes[name].update(mode)
        parts = _components(base.slice)
        if not unjudged and not any(self._is_derived(p) or self._atomic_call(p) or (isinstance(p, ast.Name) and p.id in self.claimed)
                   for p in parts):
            self.scattered.add(name)

    def _is_derived(self, node) -> bool:
        return _kind(node, self.derived, self.invariant, self.resolve) == "derived"

    def _subscript(self, node, guarded_names):
        name = node.value.id
        if not isinstance(node.ctx, ast.Store):
            self.modes[name].add("r")
        k = _identity_rank(node.slice, self.index)
        if k:
            self._identity(name, k, {a for a in range(k) if self.index[a] in guarded_names})
        first = _components(node.slice)[0] if _components(node.slice) else None
        if self.row is None or not (isinstance(first, ast.Name) and first.id == self.row):
            self.other.add(name)
        if not _leads_with(node.slice, self.index):
            self.unaligned.add(name)

    def _call(self, node):
        obj = self.resolve(node.func)
        if _is_atomic(obj):
            target = node.args[0] if node.args else None
            if isinstance(target, ast.Name) and target.id in self.data:
                self.modes[target.id].update("rw")
                self.atomic.add(target.id)
                self.other.add(target.id)
            return
        if getattr(type(obj), "hetflow_kernel", False):  # a kernel calls kernels
            self._kernel_call(node, obj)
        elif isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) \
                and node.func.value.id in self.data:
            name = node.func.value.id  # x.fill(0), x.sum(), ...
            self.modes[name].update("rw" if node.func.attr in _WRITING_METHODS else "r")
            self.other.add(name)
            if node.func.attr in _WRITING_METHODS:
                self.scattered.add(name)
        elif not _pure_call(node, obj):
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                if isinstance(arg, ast.Name) and arg.id in self.data:
                    # An unknown callee may do anything with an array it is handed.
                    self.modes[arg.id].update("rw")
                    self.other.add(arg.id)

    def _kernel_call(self, node, sub):
        """A kernel called as a function: its parameters taking expressions of this
        launch's indices are its launch indices, and its access maps onto our arguments."""
        passed = dict(zip(sub.params, node.args))
        passed.update((k.arg, k.value) for k in node.keywords if k.arg in sub.params)
        m = 0
        while m < len(sub.params) and sub.params[m] in passed and self._is_derived(passed[sub.params[m]]):
            m += 1
        exact = 0  # leading arguments that are exactly our launch indices, in order
        while exact < min(m, len(self.index)) and _is_name(passed[sub.params[exact]], self.index[exact]):
            exact += 1
        acc = sub.access(m)
        for p in sub.params[m:]:
            arg = passed.get(p)
            if not (isinstance(arg, ast.Name) and arg.id in self.data):
                continue
            name = arg.id
            self.modes[name].update(acc.modes.get(p, ""))
            if p in acc.scattered:
                self.scattered.add(name)
            if p in acc.atomic:
                self.atomic.add(name)
            if exact == 0 or p not in acc.rows:
                self.other.add(name)
            if exact < len(self.index) or p not in acc.aligned:  # not x[i, j, ..., more] here
                self.unaligned.add(name)
            k = min(acc.identity.get(p, 0), exact)
            if k:
                self._identity(name, k, {a for a in acc.guarded.get(p, ()) if a < k})

    def _identity(self, name, k, guarded_axes):
        """``name`` subscripted by the first ``k`` launch indices, guarded on ``guarded_axes``
        (an axis stays guarded only while every such access is guarded there)."""
        self.identity[name] = max(k, self.identity.get(name, 0))
        known = self.guarded_axes.get(name)
        self.guarded_axes[name] = guarded_axes if known is None else known & guarded_axes


def _escaping(fdef, data, resolve) -> set:
    """Data parameters the body reaches through another name (``o = out; o[i] = v``,
    ``a, b = x, y``, ``o = x if c else y``, chains of them) that it then uses as an
    array, or through a name bound to a part of one (``row = a[i]``, ``r = recs[i]``:
    a row or a record, which Numba hands out by reference) that it then writes through
    (``row[0] = v``, ``r.y = v``, ``row.fill(0)``, a call that may write it). Accesses
    through that name are not followed: the parameter counts as read and written anywhere."""
    holds = {name: {name} for name in data}  # a name -> the data parameters it may hold
    parts = {}  # a name -> the data parameters a part of which it may hold
    bindings = [(node.targets if isinstance(node, ast.Assign) else [node.target], node.value)
                for node in ast.walk(fdef)
                if isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)) and node.value is not None]
    changed = True
    while changed:  # to a fixed point: aliases of aliases
        changed = False
        for targets, value in bindings:
            whole = [n.id for n in _value_names(value)]
            held = set().union(*(holds.get(n, set()) for n in whole))
            for name in (n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)):
                if not held <= holds.setdefault(name, set()):
                    holds[name] |= held
                    changed = True
            part = set().union(*(parts.get(n, set()) for n in whole),
                               *(holds.get(n.id, set()) | parts.get(n.id, set()) for n in _part_names(value)))
            for name in (n for t in targets for n in _bound_names(t)):  # row = a[i], not out[i] = a[i]
                if not part <= parts.setdefault(name, set()):
                    parts[name] |= part
                    changed = True
    used = {n.value.id for n in ast.walk(fdef)
            if isinstance(n, (ast.Subscript, ast.Attribute)) and isinstance(n.value, ast.Name)}
    used |= {a.id for n in ast.walk(fdef) if isinstance(n, ast.Call)
             for a in [*n.args, *(k.value for k in n.keywords)] if isinstance(a, ast.Name)}
    escaping = set().union(*(held - {name} for name, held in holds.items() if name in used))
    written = _written_through(fdef, resolve)
    return escaping.union(*(part for name, part in parts.items() if name in written))


def _part_names(expr):
    """The names a part of whose object ``expr`` may evaluate to (``a`` of ``a[i]``)."""
    for e in _value_names_or_parts(expr):
        if isinstance(e, ast.Subscript):
            yield from _value_names(e.value)
            yield from _part_names(e.value)


def _bound_names(target):
    """The names an assignment to ``target`` binds (not those it stores into: ``x[i] = v``)."""
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for e in target.elts:
            yield from _bound_names(e)
    elif isinstance(target, ast.Starred):
        yield from _bound_names(target.value)


def _value_names_or_parts(expr):
    """``expr``'s alternatives (of a conditional, a tuple, ...) that are names or subscripts."""
    if isinstance(expr, (ast.Name, ast.Subscript)):
        yield expr
    elif isinstance(expr, (ast.Tuple, ast.List)):
        for e in expr.elts:
            yield from _value_names_or_parts(e)
    elif isinstance(expr, ast.IfExp):
        yield from _value_names_or_parts(expr.body)
        yield from _value_names_or_parts(expr.orelse)
    elif isinstance(expr, (ast.Starred, ast.NamedExpr)):
        yield from _value_names_or_parts(expr.value)
    elif isinstance(expr, ast.BoolOp):
        for e in expr.values:
            yield from _value_names_or_parts(e)


def _written_through(fdef, resolve) -> set:
    """Names the body writes through: stores into their elements or attributes, writing
    methods, calls that may write what they are handed."""
    names = {n.value.id for n in ast.walk(fdef) if isinstance(n, (ast.Subscript, ast.Attribute))
             and isinstance(n.ctx, (ast.Store, ast.Del)) and isinstance(n.value, ast.Name)}
    for node in (n for n in ast.walk(fdef) if isinstance(n, ast.Call)):
        f = node.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.attr in _WRITING_METHODS:
            names.add(f.value.id)
        if not _pure_call(node, resolve(f)):
            names |= {a.id for a in [*node.args, *(k.value for k in node.keywords)] if isinstance(a, ast.Name)}
    return names


def _value_names(expr):
    """The names whose object ``expr`` may evaluate to (not what it computes from them)."""
    if isinstance(expr, ast.Name):
        yield expr
    elif isinstance(expr, (ast.Tuple, ast.List)):
        for e in expr.elts:
            yield from _value_names(e)
    elif isinstance(expr, ast.IfExp):
        yield from _value_names(expr.body)
        yield from _value_names(expr.orelse)
    elif isinstance(expr, (ast.Starred, ast.NamedExpr)):
        yield from _value_names(expr.value)
    elif isinstance(expr, ast.BoolOp):
        for e in expr.values:
            yield from _value_names(e)


def _is_atomic(obj) -> bool:
    return any(obj is f for f in atomic.FUNCTIONS)


def _pure_call(node, obj) -> bool:
    if not pure(obj):
        return False
    if isinstance(obj, np.ufunc):  # np.add(x, y, out) writes out
        return len(node.args) <= obj.nin and not any(k.arg == "out" for k in node.keywords)
    return True


def _is_name(node, name) -> bool:
    return name is not None and isinstance(node, ast.Name) and node.id == name


_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _stored_names(fdef) -> set:
    """Names the body rebinds (assignments, loop targets, ``with ... as``, deletions)."""
    return {n.id for n in ast.walk(fdef) if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}


def _nested_parameters(fdef) -> set:
    """Parameters of the functions nested in ``fdef`` (bound anew at each call)."""
    return {a.arg for d in ast.walk(fdef) if d is not fdef and isinstance(d, _FUNCTIONS)
            for a in ast.walk(d.args) if isinstance(a, ast.arg)}


def _index_functions(fdef, index, stored) -> tuple[set, set]:
    """(derived, invariant) names: ``invariant`` ones hold functions of no launch index
    and no data (``m = n - 1``, parameters and globals never rebound); ``derived`` ones
    move with the launch indices, every binding of them a function of those, invariants
    and other such names (``j = i + 1``, a loop over ``range(i * b, i * b + b)``, ``k =
    lo`` then ``k += step``). A loop counter over a fixed range (``for t in range(n)``)
    is neither: ``x[i + t]`` may be another index's element."""
    bindings = _bindings(fdef)
    index = {p for p in index if p is not None}
    invariant = {n.id for n in ast.walk(fdef) if isinstance(n, ast.Name) and n.id not in stored} - index \
        - _nested_parameters(fdef)
    changed = True
    while changed:  # invariants: every binding an assignment of an invariant expression
        changed = False
        for name, values in bindings.items():
            if name not in invariant and None not in values and all(
                    tag == "=" and _kind(e, set(), invariant) == "invariant" for tag, e in values):
                invariant.add(name)
                changed = True
    candidates = {n for n, vs in bindings.items() if None not in vs and n not in invariant}
    while True:
        changed = True
        while changed:  # the largest set whose bindings are functions of indices, invariants and itself
            changed = False
            for name in list(candidates):
                if any(_kind(e, index | candidates, invariant) is None for _, e in bindings[name]):
                    candidates.discard(name)
                    changed = True
        moving, changed = set(index), True
        while changed:  # those of them some binding of which reaches a launch index
            changed = False
            for name in candidates - moving:
                if any(_mentions(e, moving - {name}) for _, e in bindings[name]):
                    moving.add(name)
                    changed = True
        if candidates <= moving:
            return moving, invariant
        candidates &= moving  # counters over fixed ranges: drop them and what uses them


def _bindings(fdef) -> dict:
    """name -> [(kind, expression)]: ``('=', value)`` for ``n = value``, ``('+=', n op
    value)`` for augmented assignments, ``('for', range(...))`` for loops over a range;
    None where the value cannot be followed (unpacking, ``with``, other iterables)."""
    out, seen = {}, set()
    for node in ast.walk(fdef):
        pairs = []
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            pairs = [(t, ("=", node.value)) for t in (node.targets if isinstance(node, ast.Assign) else [node.target])]
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            grown = ast.BinOp(ast.Name(node.target.id, ast.Load()), node.op, node.value)
            pairs = [(node.target, ("+=", grown))]
        elif isinstance(node, (ast.For, ast.comprehension)):
            it = node.iter
            ranged = isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range"
            pairs = [(node.target, ("for", it) if ranged else None)]
        for target, value in pairs:
            for n in ast.walk(target):
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):  # unpacking: not followed
                    out.setdefault(n.id, []).append(value if n is target else None)
                    seen.add(id(n))
    for n in ast.walk(fdef):  # with/except targets, deletions, walrus...
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)) and id(n) not in seen:
            out.setdefault(n.id, []).append(None)
    return out


def _mentions(node, names) -> bool:
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node))


_ARITH = (ast.BinOp, ast.UnaryOp, ast.IfExp, ast.Compare, ast.BoolOp, ast.Tuple, ast.Constant)
_INDEX_BUILTINS = ("min", "max", "abs", "int", "range", "len")


def _kind(node, derived, invariant, resolve=None) -> str | None:
    """'derived' (a function of the launch indices and invariants only), 'invariant'
    (of invariants only), or None (it reads data, or something unknown)."""
    if isinstance(node, ast.Name):
        return "derived" if node.id in derived else "invariant" if node.id in invariant else None
    if isinstance(node, ast.Attribute):  # x.shape, x.size
        return "invariant" if node.attr in ("shape", "ndim", "size") else None
    if isinstance(node, ast.Subscript):  # x.shape[0]
        ok = isinstance(node.value, ast.Attribute) and node.value.attr == "shape"
        return _kind(node.slice, derived, invariant, resolve) if ok else None
    if isinstance(node, ast.Call):
        fn = node.func
        known = (isinstance(fn, ast.Name) and fn.id in _INDEX_BUILTINS and fn.id not in derived) \
            or (resolve is not None and pure(resolve(fn)))
        parts = [*node.args, *(k.value for k in node.keywords)]
    elif isinstance(node, _ARITH):
        known, parts = True, [c for c in ast.iter_child_nodes(node) if isinstance(c, ast.expr)]
    else:
        known, parts = False, []
    kinds = [_kind(p, derived, invariant, resolve) for p in parts]
    if not known or None in kinds:
        return None
    return "derived" if "derived" in kinds else "invariant"


def _guards(fdef, derived) -> dict:
    """id(subscript) -> the launch-index names bounded above where it is evaluated: in the
    body of ``if i < n:`` (``and`` of such tests, chains like ``0 <= i < n``), or after
    ``if i >= n: return`` (or ``continue``, in a loop)."""
    out = {}

    def record(expr, bounded):
        for n in ast.walk(expr):
            if isinstance(n, ast.Subscript):
                out[id(n)] = frozenset(bounded)

    def visit(stmts, bounded):
        bounded = set(bounded)
        for s in stmts:
            if isinstance(s, ast.If):
                record(s.test, bounded)
                visit(s.body, bounded | _upper_bounded(s.test, derived))
                visit(s.orelse, bounded | _upper_bounded(_negated(s.test), derived))
                if s.body and isinstance(s.body[-1], (ast.Return, ast.Continue)) and not s.orelse:
                    bounded |= _upper_bounded(_negated(s.test), derived)
                continue
            for _, value in ast.iter_fields(s):
                items = value if isinstance(value, list) else [value]
                if items and isinstance(items[0], ast.stmt):
                    visit(items, bounded)
                elif items and isinstance(items[0], ast.ExceptHandler):
                    for handler in items:
                        visit(handler.body, bounded)
                else:
                    for item in items:
                        if isinstance(item, ast.AST):
                            record(item, bounded)
    visit(fdef.body, set())
    return out


def _negated(test):
    """``not test`` as a test _upper_bounded reads (``i >= n`` -> ``i < n``)."""
    flip = {ast.GtE: ast.Lt, ast.Gt: ast.LtE, ast.Lt: ast.GtE, ast.LtE: ast.Gt}
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]) in flip:
        return ast.Compare(test.left, [flip[type(test.ops[0])]()], test.comparators)
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or):  # not (a or b) = not a and not b
        return ast.BoolOp(ast.And(), [_negated(v) for v in test.values])
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return test.operand
    return ast.Constant(False)


def _upper_bounded(test, derived) -> set:
    """Launch-index names that ``test`` being true bounds above (``i < n``, ``n > i``)."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return set().union(*(_upper_bounded(v, derived) for v in test.values))
    found = set()
    if isinstance(test, ast.Compare):
        terms = [test.left, *test.comparators]
        for left, op, right in zip(terms, test.ops, terms[1:]):
            if isinstance(op, (ast.Lt, ast.LtE)) and isinstance(left, ast.Name) and left.id in derived:
                found.add(left.id)
            if isinstance(op, (ast.Gt, ast.GtE)) and isinstance(right, ast.Name) and right.id in derived:
                found.add(right.id)
    return found


def _stores(target) -> list:
    """The subscript and attribute targets an assignment target stores through
    (``x[i] = ...``, ``p[i].f = ...``, ``x[i], y[i] = ...``)."""
    if isinstance(target, (ast.Tuple, ast.List)):
        return [s for e in target.elts for s in _stores(e)]
    if isinstance(target, ast.Starred):
        return _stores(target.value)
    return [target] if isinstance(target, (ast.Subscript, ast.Attribute)) else []


def _base_subscript(target):
    """The subscript of a parameter name a store target writes through, or None."""
    while isinstance(target, (ast.Subscript, ast.Attribute)):
        if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
            return target
        target = target.value
    return None


def _components(slice_node) -> list:
    return list(slice_node.elts) if isinstance(slice_node, ast.Tuple) else [slice_node]


def _assigned_at_index(fdef, index) -> set:
    """Names assigned at exactly the launch index by a top-level statement of ``fdef``."""
    found = set()
    for stmt in fdef.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            t = stmt.targets[0]
            if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) \
                    and _identity_rank(t.slice, index) == len(index):
                found.add(t.value.id)
    return found


def _leads_with(slice_node, index) -> bool:
    """The subscript starts with all the launch indices, in order."""
    elts = slice_node.elts if isinstance(slice_node, ast.Tuple) else [slice_node]
    return len(elts) >= len(index) and all(isinstance(e, ast.Name) and e.id == name
                                           for e, name in zip(elts, index))


def _identity_rank(slice_node, index) -> int:
    """k when the subscript is exactly the first k launch indices, else 0."""
    elts = _components(slice_node)
    if not elts or len(elts) > len(index):
        return 0
    ok = all(_is_name(e, index[k]) for k, e in enumerate(elts))
    return len(elts) if ok else 0

