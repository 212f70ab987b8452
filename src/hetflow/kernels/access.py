"""Which kernel parameters are read and which written, found from the kernel's code.

The runtime infers dependencies from these (read-after-write, write-after-read,
write-after-write), the launcher copies back from a GPU only what was written,
parameters subscripted by exactly the launch index are checked against the extent
(unless every such access is guarded by a bound on that index), and those touched only
in the row of the launch's first index (``x[i, ...]``) can be split by rows over devices.

A write at an index that is no function of the launch index (``hist[b] += 1`` with
``b`` read from data) races when indices run in parallel: such parameters are
``scattered``, unless updated through :mod:`hetflow.atomic <.atomic>`.

An array is followed into whatever the kernel makes of it (other names, views, loop
variables, what calls return: :class:`_Flow`), and into the functions and kernels it
calls: a write through any of them counts where it lies (``row = a[i]; row[0] = v``
writes row ``i``; ``a.T[i, 0] = v`` anywhere in ``a``).
"""
from __future__ import annotations

import ast
import builtins
import contextlib
import dataclasses
import functools
import inspect
import threading
import types

import numpy as np

from ..errors import KernelError
from . import atomic
from .source import KernelSource


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
    # Arrays no argument hands the kernel that it writes (a global or captured one, a called
    # function's default), by name -> the line of its definition of the first write:
    # compiled code holds them as constants (kernels.support refuses them).
    frozen_writes: dict = dataclasses.field(default_factory=dict)

    def reads(self, name) -> bool:
        return "r" in self.modes.get(name, "")

    def writes(self, name) -> bool:
        return "w" in self.modes.get(name, "")


# Callables that never write the arrays handed to them.
_PURE_BUILTINS = frozenset(getattr(builtins, n) for n in (
    "abs", "all", "any", "bool", "complex", "divmod", "enumerate", "float", "int", "len", "max",
    "min", "pow", "print", "range", "reversed", "round", "sum", "tuple", "zip"))
_PURE_MODULES = ("math", "cmath")
_NUMPY_WRITERS = frozenset((np.copyto, np.put, np.place, np.putmask, np.fill_diagonal, np.put_along_axis,
                            np.random.shuffle))
# Array methods that write the array they are called on.
_WRITING_METHODS = frozenset(("fill", "sort", "put", "itemset", "partition", "resize", "setfield", "__setitem__"))
# What tells of an array's layout, not of its elements.
_METADATA = frozenset(("shape", "ndim", "size", "dtype", "itemsize", "nbytes", "strides"))
_METADATA_FUNCTIONS = (len, np.shape, np.ndim, np.size)
_NUMBERS = (abs, bool, complex, divmod, float, int, max, min, pow, round, range)
# Calls whose result shares no memory with what they are handed: numbers, new arrays.
# (enumerate, reversed, tuple and zip hand out the elements themselves: rows.)
_FRESH = (_PURE_BUILTINS - {enumerate, reversed, tuple, zip}) | frozenset((
    np.copy, np.empty_like, np.zeros_like, np.ones_like, np.full_like, np.sum, np.prod, np.mean,
    np.dot, np.vdot, np.max, np.min, np.amax, np.amin, np.any, np.all, np.argmax, np.argmin,
    np.std, np.var, np.linalg.norm, np.interp, np.where, np.sort, np.argsort, np.cumsum,
    np.cumprod, np.concatenate, np.stack))
_FRESH_METHODS = frozenset(("copy", "sum", "prod", "mean", "max", "min", "any", "all", "argmax", "argmin",
                            "std", "var", "item", "dot", "cumsum", "cumprod", "argsort", "tolist"))


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
        params = [a.arg for a in fdef.args.args]
        stored = _stored_names(fdef)
        # a name the kernel binds (a local def helper(r), a parameter) is not the global one
        local = stored | set(params) | {d.name for d in ast.walk(fdef) if isinstance(d, _DEFS)}
        self.fdef, self.resolve = fdef, lambda node: None if _root_name(node) in local else resolve(node)
        # Global and captured arrays are followed as data is, to find writes into them.
        self.frozen = {n.id for n in ast.walk(fdef) if isinstance(n, ast.Name)
                       and isinstance(self.resolve(n), np.ndarray)}
        self.frozen_writes = {}
        self.data = set(params[ndim:]) | self.frozen
        self.index = [p if p not in stored else None for p in params[:ndim]]  # reassigned: no index
        self.rebound = self.data & stored  # out = x: out[i] may be another array's element
        # names that a nested function's parameters bind there (lambda i: x[i]): not ours
        self.shadowed = _shadowed(fdef)
        self.derived, self.invariant = _index_functions(fdef, self.index, stored)
        self.modes = {p: set() for p in self.data}
        self.identity, self.guarded_axes = {}, {}
        self.other, self.scattered, self.atomic = set(), set(), set()
        self.unaligned = set()  # parameters subscripted other than x[i, j, ..., more]
        self.claimed = self._claimed_names(fdef)
        self.parents = {id(c): p for p in ast.walk(fdef) for c in ast.iter_child_nodes(p)}
        # Indices inside a nested function come through its parameters, which the analysis
        # does not follow: its stores are never judged scattered.
        self.nested = {id(n) for d in ast.walk(fdef) if d is not fdef and isinstance(d, _FUNCTIONS)
                       for n in ast.walk(d)}
        self.flow = _Flow(fdef, self.data, self.resolve, self.shadowed)
        self.functions = _local_functions(fdef)
        self.arrays = self._used_as_arrays()

    def run(self) -> Access:
        guards = _guards(self.fdef, self.derived)
        for node in ast.walk(self.fdef):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                self._assignment(node)
            if isinstance(node, ast.Subscript) and self._param(node.value):
                self._subscript(node, guards.get(id(node), frozenset()))
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and self._param(node):
                self._use(node)
            elif isinstance(node, ast.Call):
                self._call(node)
            self._frozen_written(node)
        ordered = {p: "".join(m for m in "rw" if m in self.modes[p]) for p in self.modes if p not in self.frozen}
        touched = {p for p, m in ordered.items() if m}
        identity = {p: k for p, k in self.identity.items() if p not in self.frozen}
        guarded = {p: frozenset(a) for p, a in self.guarded_axes.items() if a and p in identity}
        # a reassigned index variable (None here) says nothing about which elements are touched
        aligned = frozenset() if None in self.index or not self.index else \
            frozenset(touched - self.other - self.unaligned)
        returns = any(isinstance(n, ast.Return) and id(n) not in self.nested for n in ast.walk(self.fdef))
        covered = frozenset() if returns or None in self.index or not self.index else \
            frozenset(_assigned_at_index(self.fdef, self.index) & touched - self.rebound)
        return Access(ordered, identity, frozenset(touched - self.other), guarded,
                      frozenset(self.scattered - self.frozen), frozenset(self.atomic - self.frozen), aligned,
                      covered, self.frozen_writes)

    def _frozen_written(self, node):
        """Note the line of ``node`` for each global or captured array it wrote first."""
        for name in self.frozen:
            if "w" in self.modes[name] and name not in self.frozen_writes:
                self.frozen_writes[name] = node.lineno

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

    def _param(self, node) -> bool:
        """``node`` names one of our data parameters."""
        return isinstance(node, ast.Name) and node.id in self.data and id(node) not in self.shadowed

    def _is_index(self, node, k) -> bool:
        """``node`` is exactly launch index ``k``."""
        return _is_name(node, self._at_index(node)[k])

    def _at_index(self, node) -> list:
        """The launch indices as ``node`` sees them (None where a nested function's
        parameter of that name hides one)."""
        if any(id(n) in self.shadowed for n in ast.walk(node)):
            return [None] * len(self.index)
        return self.index

    def _assignment(self, node):
        """Stores into arrays (``x[i] = v``, ``row[0] = v``, ``a.T[i, 0] = v``) and updates
        in place (``row += v``)."""
        update = isinstance(node, ast.AugAssign)
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for store in (s for t in targets for s in _stores(t)):
            self._write_into(store, "rw" if update else "w", id(node) in self.nested)
        if update and isinstance(node.target, ast.Name):
            # Updates in place where the name holds an array (row = a[i]; row += v). An
            # accumulator (acc = x[i]; acc += v) cannot be told from that: it counts too,
            # never as a race.
            self._write_into(node.target, "rw", True)

    def _write_into(self, expr, mode, unjudged=False):
        """Write what ``expr`` may be, or be a part of (see _Flow)."""
        self._write_at(self.flow.origins(expr), mode, unjudged)

    def _write_at(self, origins, mode, unjudged=False):
        for origin in origins:
            if isinstance(origin, ast.Subscript):  # a[s]: written there
                # Through a part spanning an axis (col = a[:, 0]; col[i] = v) the element
                # written is chosen by an index not followed here: no race to judge.
                spans = isinstance(origin.ctx, ast.Load) and any(
                    isinstance(p, ast.Slice) or isinstance(p, ast.Constant) and p.value is Ellipsis
                    for p in _components(origin.slice))
                self._write(origin, mode, unjudged or spans or id(origin) in self.nested)
            else:  # anywhere in the parameter
                self.modes[origin].update(mode)
                self.other.add(origin)

    def _write(self, base, mode, unjudged=False):
        name = base.value.id
        self.modes[name].update(mode)
        if not unjudged and not any(map(self._moves, _components(base.slice))):
            self.scattered.add(name)

    def _moves(self, part) -> bool:
        """A subscript's component that is a function of the launch index (or of a
        claim an atomic handed out): ``i + 1``, ``i:i + 2`` (not ``i:``)."""
        if isinstance(part, ast.Slice):
            return None not in (part.lower, part.upper) and self._moves(part.lower) and self._moves(part.upper)
        return self._is_derived(part) or self._atomic_call(part) or (isinstance(part, ast.Name) and part.id in self.claimed)

    def _read(self, args, numeric=False):
        """Data parameters handed whole to a call are read anywhere (but where ``numeric``,
        those never used as arrays: numbers handed to a numeric function, ``min(n, m)``)."""
        for arg in args:
            arg = arg.value if isinstance(arg, ast.Starred) else arg
            if self._param(arg) and not (numeric and arg.id not in self.arrays):
                self.modes[arg.id].add("r")
                self.other.add(arg.id)

    def _is_derived(self, node) -> bool:
        return self._at_index(node) is self.index and \
            _kind(node, self.derived, self.invariant, self.resolve) == "derived"

    def _subscript(self, node, guarded_names):
        name = node.value.id
        if not isinstance(node.ctx, ast.Store):
            self.modes[name].add("r")
        if name in self.rebound:  # perhaps another array, at another offset: no index tells where
            self.other.add(name)
            self.unaligned.add(name)
            return
        index = self._at_index(node.slice)
        k = _identity_rank(node.slice, index)
        if k:
            self._identity(name, k, {a for a in range(k) if index[a] in guarded_names})
        first = _components(node.slice)[0] if _components(node.slice) else None
        if not index or not _is_name(first, index[0]):
            self.other.add(name)
        if not _leads_with(node.slice, index):
            self.unaligned.add(name)

    def _used_as_arrays(self) -> set:
        """Data parameters the kernel uses as arrays somewhere: subscripted, asked for an
        attribute (``x.shape``, ``x.T``), looped over, measured (``len(x)``), unpacked."""
        found = set()
        for node in ast.walk(self.fdef):
            if isinstance(node, (ast.Subscript, ast.Attribute, ast.Starred)):
                found.add(node.value)
            elif isinstance(node, (ast.For, ast.comprehension)):
                found.add(node.iter)
            elif isinstance(node, ast.Call) and node.args and _is_metadata(self.resolve(node.func)):
                found.add(node.args[0])
        return {e.id for e in found if self._param(e)}

    def _use(self, node):
        """A data parameter used other than subscripted (``out[i] = x``, ``for r in x``,
        ``x.T``, ``(x, y)``) is read anywhere, unless only its layout (``x.shape``) is
        asked, or it is taken for a number (see _numeric); calls are judged in _call."""
        parent = self.parents.get(id(node))
        if isinstance(parent, ast.Subscript) and parent.value is node:
            return  # _subscript
        if isinstance(parent, ast.Attribute):
            if parent.attr in _METADATA or isinstance(self.parents.get(id(parent)), ast.Call) \
                    and self.parents[id(parent)].func is parent:
                return
        elif isinstance(parent, (ast.Call, ast.keyword)) or self._numeric(node):
            return
        self.modes[node.id].add("r")
        self.other.add(node.id)

    def _numeric(self, node) -> bool:
        """``node`` is a parameter never used as an array, here where a number may be: an
        operand of arithmetic or a comparison, a truth value, an index. (An array used
        whole only that way, as in ``out[i, :] = b * 2.0``, is taken for a number.)"""
        if node.id in self.arrays:
            return False
        child, parent = node, self.parents.get(id(node))
        while isinstance(parent, (ast.BoolOp, ast.Tuple, ast.Slice)) or _negation(parent):
            child, parent = parent, self.parents.get(id(parent))
        if isinstance(parent, (ast.BinOp, ast.UnaryOp, ast.Compare)) \
                or isinstance(parent, ast.AugAssign) and parent.value is child:
            return True
        if isinstance(parent, (ast.If, ast.While, ast.IfExp, ast.Assert)) and parent.test is child:
            return True
        return isinstance(parent, ast.Subscript) and parent.slice is child

    def _call(self, node):
        obj = self.resolve(node.func)
        args = [*node.args, *(k.value for k in node.keywords)]
        if _is_atomic(obj):
            self._atomic(node)
        elif getattr(type(obj), "hetflow_kernel", False):  # a kernel calls kernels
            self._kernel_call(node, obj)
        elif isinstance(node.func, ast.Attribute) and self.flow.origins(node.func.value):
            self._method(node)
        elif _pure_call(node, obj):
            if not _is_metadata(obj):
                self._read(args, _numeric_function(obj, node))
        else:
            for arg in self._written(node, obj):
                self._write_into(arg, "rw")
            self._read(args)

    def _written(self, node, obj) -> list:
        """The arguments a call may write: those handed to the parameters a Python
        function writes, where its source can be read (one the kernel defines, a global
        one, a Numba function); otherwise see _outputs."""
        if obj is None and isinstance(node.func, ast.Name) and id(node.func) not in self.shadowed:
            callee = self.functions.get(node.func.id)
        else:
            callee = None if pure(obj) or _is_numpy(obj) else _definition(obj)
        if callee is None:
            return _outputs(node, obj)
        fdef, resolve = callee if isinstance(callee, tuple) else (callee, self.resolve)
        found = _function_access(fdef, resolve)
        passed = _passed(node, fdef)
        if found is None or passed is None:  # recursion, too deep, or *args
            return [*node.args, *(k.value for k in node.keywords)]
        self._frozen_through(node, found, getattr(obj, "py_func", obj), {p for p, _ in passed})
        return [arg for p, arg in passed if p not in found.modes or found.writes(p)]

    def _frozen_through(self, call, found: Access, fn, given: set):
        """Arrays a called function (or kernel) ``fn`` writes that no argument of ``call``
        hands it: its global and captured ones, and those its defaults hold, for the
        parameters ``given`` leaves out."""
        for name in found.frozen_writes:
            self.frozen_writes.setdefault(name, call.lineno)
        for p in _array_defaults(fn).keys() - given:
            if found.writes(p):
                self.frozen_writes.setdefault(f"{fn.__name__}({p}=...)", call.lineno)

    def _atomic(self, node):
        """``hetflow.atomic.<op>(ary, idx, ...)`` updates ``ary``, passed by position or
        by keyword (an array, or a view of one)."""
        given = [k.value for k in node.keywords if k.arg == "ary"]
        target = node.args[0] if node.args else (given[0] if given else None)
        if target is not None:
            self._write_into(target, "rw", True)  # an atomic update races with no other
            if self._param(target):
                self.atomic.add(target.id)
        self._read([*node.args[1:], *(k.value for k in node.keywords if k.arg != "ary")])

    def _method(self, node):
        """``x.m(...)`` on an array: a writing method writes ``x`` (``row.fill(0)``,
        ``a[i].sort()``); an array handed to it may be its output (``out=``, or a positional
        argument after the first: ``x.sum(0, None, out)``)."""
        receiver = node.func.value
        name = receiver.id if self._param(receiver) else None
        if node.func.attr in _WRITING_METHODS:
            self._write_into(receiver, "rw")
            if name:
                self.scattered.add(name)  # every launch index writes all of it
        if name:
            self.modes[name].add("r")
            self.other.add(name)
        for arg in [*node.args[1:], *(k.value for k in node.keywords if k.arg in ("out", None))]:
            self._write_into(arg, "rw")
        self._read([*node.args, *(k.value for k in node.keywords)])

    def _kernel_call(self, node, sub):
        """A kernel called as a function: its parameters taking expressions of this
        launch's indices are its launch indices, and its access maps onto our arguments."""
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            args = [*node.args, *(k.value for k in node.keywords)]  # not matched to parameters:
            for arg in args:                                        # any may be written
                self._write_into(arg, "rw")
            self._read(args)
            return
        passed = dict(zip(sub.params, node.args))
        passed.update((k.arg, k.value) for k in node.keywords if k.arg in sub.params)
        m = 0
        while m < len(sub.params) and sub.params[m] in passed and self._is_derived(passed[sub.params[m]]):
            m += 1
        exact = 0  # leading arguments that are exactly our launch indices, in order
        while exact < min(m, len(self.index)) and self._is_index(passed[sub.params[exact]], exact):
            exact += 1
        acc = sub.access(m)
        self._frozen_through(node, acc, sub.pyfunc, set(passed))
        for p in sub.params[m:]:
            arg = passed.get(p)
            if arg is not None:
                self._argument(arg, p, acc, exact)

    def _argument(self, arg, p, acc, exact):
        """The called kernel's access to its parameter ``p`` is ours to what ``arg`` holds:
        mapped exactly for a parameter of ours; a part (``a[i]``, ``row``) is written where
        it lies."""
        mode = acc.modes.get(p, "")
        if not self._param(arg):
            if "w" in mode:
                self._write_into(arg, mode)
            return
        name = arg.id
        if "w" in mode:  # out = x: out may be x
            self._write_at(self.flow.env.get(name, ()), mode)
        self.modes[name].update(mode)
        if p in acc.scattered:
            self.scattered.add(name)
        if p in acc.atomic:
            self.atomic.add(name)
        if exact == 0 or p not in acc.rows or name in self.rebound:
            self.other.add(name)
        if exact < len(self.index) or p not in acc.aligned:  # not x[i, j, ..., more] here
            self.unaligned.add(name)
        k = min(acc.identity.get(p, 0), exact)
        if k and name not in self.rebound:
            self._identity(name, k, {a for a in acc.guarded.get(p, ()) if a < k})

    def _identity(self, name, k, guarded_axes):
        """``name`` subscripted by the first ``k`` launch indices, guarded on ``guarded_axes``
        (an axis stays guarded only while every such access is guarded there)."""
        self.identity[name] = max(k, self.identity.get(name, 0))
        known = self.guarded_axes.get(name)
        self.guarded_axes[name] = guarded_axes if known is None else known & guarded_axes


class _Flow:
    """What an expression may evaluate to, or to a part of: its *origins*, each a
    subscript ``a[s]`` of a data parameter (every view of ``a[i]`` lies in row ``i``)
    or a parameter's name (anywhere in it). Locals are followed through what binds
    them (``row = a[i]``, ``t = a.T``, ``for r in a``, ``p = (a, b)``, ``o = x if c else
    y``, ``lst.append(r)``), to a fixed point."""

    def __init__(self, fdef, data, resolve, shadowed):
        self.data, self.resolve, self.shadowed = data, resolve, shadowed
        self.env: dict[str, set] = {}  # a local, or a rebound parameter -> its origins
        bindings = list(_flow_bindings(fdef, _containers(fdef, resolve)))
        changed = True
        while changed:
            changed = False
            for name, value in bindings:
                found, known = self.origins(value), self.env.setdefault(name, set())
                if not found <= known:
                    known |= found
                    changed = True

    def origins(self, e) -> set:
        if isinstance(e, ast.Name):
            return ({e.id} if self._param(e) else set()) | self.env.get(e.id, set())
        if isinstance(e, ast.Subscript):
            if self._param(e.value):
                return {e} | self.env.get(e.value.id, set())
            return self.origins(e.value)
        if isinstance(e, ast.Attribute):
            return set() if e.attr in _METADATA else self.origins(e.value)
        if isinstance(e, ast.Call):  # a view of what it is handed (a.T, a.reshape(n), np.ravel(a))?
            return set() if self._fresh(e) else set().union(*map(self.origins, _call_parts(e)))
        return set().union(*map(self.origins, _held(e)))

    def _param(self, e) -> bool:
        return isinstance(e, ast.Name) and e.id in self.data and id(e) not in self.shadowed

    def _fresh(self, call) -> bool:
        """The call's result shares no memory with what it is handed."""
        if isinstance(call.func, ast.Attribute) and call.func.attr in _FRESH_METHODS:
            return True
        obj = self.resolve(call.func)
        if isinstance(obj, np.ufunc):
            return _pure_call(call, obj)
        try:
            return obj in _FRESH or _is_atomic(obj) or getattr(obj, "__module__", None) in _PURE_MODULES
        except TypeError:  # unhashable
            return False


def _call_parts(call) -> list:
    """The expressions a call's result may be a view of: the function (a method's object,
    a local function: what it returns), the arguments."""
    return [call.func, *call.args, *(k.value for k in call.keywords)]


def _held(e) -> list:
    """The expressions whose objects ``e`` may evaluate to (a conditional's branches, a
    tuple's elements, a comprehension's element), not what it computes from them."""
    if isinstance(e, ast.IfExp):
        return [e.body, e.orelse]
    if isinstance(e, ast.BoolOp):
        return e.values
    if isinstance(e, (ast.Tuple, ast.List, ast.Set)):
        return e.elts
    if isinstance(e, (ast.Starred, ast.NamedExpr)):
        return [e.value]
    if isinstance(e, ast.Dict):
        return e.values
    if isinstance(e, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
        return [e.elt]
    if isinstance(e, ast.DictComp):
        return [e.value]
    if isinstance(e, ast.Lambda):  # as a value: what it returns, where it is called
        return [e.body]
    return []


def _flow_bindings(fdef, containers):
    """(name, expression): what each binding in ``fdef`` may give a name, or a part of
    (a loop variable: an element of what is looped over)."""
    for node in ast.walk(fdef):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                yield from _unpacked(target, node.value, containers)
        elif isinstance(node, ast.AugAssign) and _root_name(node.target) in containers:
            yield _root_name(node.target), node.value  # lst += [r]
        elif isinstance(node, ast.NamedExpr):
            yield node.target.id, node.value
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            yield from ((name, node.iter) for name in _bound_names(node.target))
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            yield from ((name, node.context_expr) for name in _bound_names(node.optional_vars))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and _root_name(node.func.value) in containers:  # lst.append(r)
            yield from ((_root_name(node.func.value), a) for a in _call_parts(node)[1:])
        elif isinstance(node, _FUNCTIONS) and node is not fdef:
            yield from _function_bindings(node)


def _function_bindings(f):
    """A local function's parameters take their defaults (``def g(r=a[i])``); its name,
    as a value, what it returns (``def g(k): return a[k:k + 1]``)."""
    args = f.args
    positional = [*args.posonlyargs, *args.args]
    yield from zip((a.arg for a in positional[len(positional) - len(args.defaults):]), args.defaults)
    yield from ((a.arg, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None)
    if not isinstance(f, ast.Lambda):
        yield from ((f.name, r.value) for r in ast.walk(f) if isinstance(r, ast.Return) and r.value)


def _unpacked(target, value, containers):
    """(name, expression) for each name an assignment of ``value`` to ``target`` binds:
    element by element where both are tuples of one length, and into a container
    (``lst[0] = r`` keeps ``r``, where ``row[0] = v`` copies ``v``)."""
    if isinstance(target, ast.Name):
        yield target.id, value
    elif isinstance(target, (ast.Tuple, ast.List)):
        starred = any(isinstance(e, ast.Starred) for e in target.elts)
        if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts) and not starred \
                and not any(isinstance(e, ast.Starred) for e in value.elts):
            pairs = zip(target.elts, value.elts)
        else:
            pairs = ((e, value) for e in target.elts)
        for t, v in pairs:
            yield from _unpacked(t, v, containers)
    elif isinstance(target, ast.Starred):
        yield from _unpacked(target.value, value, containers)
    elif _root_name(target) in containers:
        yield _root_name(target), value


def _containers(fdef, resolve) -> set:
    """Locals that may be mutable containers (lists, dicts), and their aliases."""
    values = [(t, v) for node in ast.walk(fdef) if isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr))
              and node.value is not None
              for t in (node.targets if isinstance(node, ast.Assign) else [node.target]) for v in [node.value]]
    found, changed = set(), True
    while changed:
        changed = False
        for target, value in values:
            if _container(value, found, resolve):
                names = set(_bound_names(target)) - found
                found |= names
                changed = changed or bool(names)
    return found


def _container(e, known, resolve) -> bool:
    if isinstance(e, (ast.List, ast.ListComp, ast.Dict, ast.DictComp, ast.Set, ast.SetComp)):
        return True
    if isinstance(e, ast.Name):
        return e.id in known
    if isinstance(e, ast.Call):
        obj = resolve(e.func)
        return any(obj is c for c in (list, dict, set)) or \
            (getattr(obj, "__module__", None) or "").startswith("numba.typed")
    return any(_container(v, known, resolve) for v in _held(e))


def _root_name(e):
    """The name an expression's subscripts and attributes start from (``lst`` of ``lst[0].x``)."""
    while isinstance(e, (ast.Subscript, ast.Attribute)):
        e = e.value
    return e.id if isinstance(e, ast.Name) else None


def _bound_names(target):
    """The names an assignment to ``target`` binds (not those it stores into: ``x[i] = v``)."""
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for e in target.elts:
            yield from _bound_names(e)
    elif isinstance(target, ast.Starred):
        yield from _bound_names(target.value)


def _negation(node) -> bool:
    return isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not)


def _is_metadata(obj) -> bool:
    return any(obj is f for f in _METADATA_FUNCTIONS)


def _numeric_function(obj, call) -> bool:
    """A function of numbers: math's, a ufunc, a builtin such as ``int`` or ``min(n, m)``
    (``min(x)`` alone loops over ``x``)."""
    if isinstance(obj, np.ufunc) or getattr(obj, "__module__", None) in _PURE_MODULES:
        return True
    return any(obj is f for f in _NUMBERS) and (len(call.args) > 1 or obj not in (min, max))


def _is_atomic(obj) -> bool:
    return any(obj is f for f in atomic.FUNCTIONS)


def _pure_call(node, obj) -> bool:
    """A call of a function known not to write what it is handed, given no output."""
    if not pure(obj):
        return False
    if isinstance(obj, np.ufunc):  # np.add(x, y, out) writes out
        return len(node.args) <= obj.nin and not any(k.arg == "out" for k in node.keywords)
    if not _is_numpy(obj):
        return True
    bound = _bound(node, obj)  # np.dot(a, b, out), np.nan_to_num(x, copy=False) write
    return bound is not None and not bound.keys() & {"out", "copy"}


def _outputs(node, obj) -> list:
    """What a call that is not pure may write: a ufunc's outputs; a NumPy function's
    output, or its input where it is told not to copy it; the first argument of NumPy's
    writers (``np.copyto(dst, src)``); any argument of another callee."""
    if isinstance(obj, np.ufunc):
        return [*node.args[obj.nin:], *(k.value for k in node.keywords if k.arg == "out")]
    bound = _bound(node, obj) if _is_numpy(obj) else None
    if bound is None:
        return [*node.args, *(k.value for k in node.keywords)]
    written = [bound.get("out")]
    if obj in _NUMPY_WRITERS or "copy" in bound:
        written.append(bound.get(next(iter(inspect.signature(obj).parameters))))
    return [a for a in written if a is not None]


def _is_numpy(obj) -> bool:
    return (getattr(obj, "__module__", None) or "").split(".")[0] == "numpy"


def _bound(node, obj) -> dict | None:
    """A NumPy function's parameters -> the argument expressions of a call of it, or None
    where they cannot be matched (no signature, ``*args``, ``**kwargs``)."""
    if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
        return None
    try:
        return dict(inspect.signature(obj).bind_partial(*node.args, **{k.arg: k.value for k in node.keywords})
                    .arguments)
    except (TypeError, ValueError):
        return None


def _shadowed(fdef) -> set:
    """ids of the names in nested functions (and lambdas) that are their parameters."""
    found = set()
    for f in ast.walk(fdef):
        if f is not fdef and isinstance(f, _FUNCTIONS):
            params = {a.arg for a in ast.walk(f.args) if isinstance(a, ast.arg)}
            found.update(id(n) for b in (f.body if isinstance(f.body, list) else [f.body])
                         for n in ast.walk(b) if isinstance(n, ast.Name) and n.id in params)
    return found


def _local_functions(fdef) -> dict:
    """The functions a kernel defines (``def f``, ``f = lambda ...``), by name, where
    nothing else binds that name."""
    found, binds = {}, {}
    for node in ast.walk(fdef):
        if isinstance(node, _DEFS) and node is not fdef:
            found[node.name] = node
            binds[node.name] = binds.get(node.name, 0) + 1
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            binds[node.id] = binds.get(node.id, 0) + 1
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Lambda) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            found[node.targets[0].id] = ast.FunctionDef(
                name="<lambda>", args=node.value.args, body=[ast.Return(node.value.body)], decorator_list=[])
    return {name: f for name, f in found.items() if binds[name] == 1}


def _definition(obj):
    """(definition, resolve) of a Python function (a Numba function's too) whose source
    can be read, or None."""
    fn = getattr(obj, "py_func", obj)
    if not isinstance(fn, types.FunctionType) or fn.__name__ == "<lambda>":
        return None
    fdef = _parsed(fn)
    if fdef is None:
        return None
    names = dict(fn.__globals__)
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        with contextlib.suppress(ValueError):  # a cell not yet filled
            names[name] = cell.cell_contents

    def resolve(node):
        if isinstance(node, ast.Attribute):
            return getattr(resolve(node.value), node.attr, None)
        if isinstance(node, ast.Name):
            return names.get(node.id, getattr(builtins, node.id, None))
        return None
    return fdef, resolve


@functools.lru_cache(maxsize=256)
def _parsed(fn):
    """The definition of ``fn``, or None where its source cannot be read."""
    try:
        return KernelSource.from_function(fn).function()
    except (KernelError, SyntaxError):
        return None


_analysing = threading.local()
_CALL_DEPTH = 8  # functions calling functions followed this deep; a deeper call may write anything


def _function_access(fdef, resolve) -> Access | None:
    """The access of a function a kernel calls to its parameters, or None where it is
    being analysed already (it calls itself) or calls go deeper than _CALL_DEPTH."""
    busy = _analysing.__dict__.setdefault("busy", set())
    if id(fdef) in busy or len(busy) >= _CALL_DEPTH:
        return None
    busy.add(id(fdef))
    try:
        return _Analysis(fdef, 0, resolve).run()
    finally:
        busy.discard(id(fdef))


def _array_defaults(fn) -> dict:
    """{parameter: default} of a function's parameters whose defaults are NumPy arrays."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return {}
    positional = code.co_varnames[:code.co_argcount]
    defaults = dict(zip(positional[len(positional) - len(fn.__defaults__ or ()):], fn.__defaults__ or ()))
    defaults.update(fn.__kwdefaults__ or {})
    return {p: v for p, v in defaults.items() if isinstance(v, np.ndarray)}


def _passed(node, fdef) -> list | None:
    """(parameter, argument) pairs of a call of ``fdef``, or None where some argument
    cannot be matched to a named parameter (``*args``, ``**kwargs``, too many)."""
    params = [a.arg for a in (*fdef.args.posonlyargs, *fdef.args.args)]
    named = params + [a.arg for a in fdef.args.kwonlyargs]
    if len(node.args) > len(params) or any(isinstance(a, ast.Starred) for a in node.args) \
            or any(k.arg not in named for k in node.keywords):
        return None
    return [*zip(params, node.args), *((k.arg, k.value) for k in node.keywords)]


def _is_name(node, name) -> bool:
    return name is not None and isinstance(node, ast.Name) and node.id == name


_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef)
_FUNCTIONS = (*_DEFS, ast.Lambda)


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

