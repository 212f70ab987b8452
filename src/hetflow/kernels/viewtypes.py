"""Views as Numba types: Numba, not text rewriting, lowers view indexing (SPEC §1).

A kernel receives each view as one value of a :class:`ViewType`: its root array and
the integers of its lowering (:mod:`hetflow.index.lowering`), its extent last, packed by
the entry (:func:`packing`). A *layout* is the code of a root index on one target, shared by
every view computing it alike; its ``getitem``/``setitem`` implementations are the
lowering's own root index expressions, rendered once into a small function that Numba
compiles on the CPU or GPU (Numba's overloads), and that runs as plain Python on the
CUDA simulator (:class:`PyView`). Views cost what hand-written indexing costs: root
indices are cast unsigned (they are never negative in a valid view), which spares
Numba its wraparound test.

Checked mode (:mod:`.checks`) wraps every array parameter in such a value as well (the
identity layout of an array): each integer index is checked against the root's extent
before the access; a failure is recorded, and the CPU raises ``OutOfBounds`` where the
GPU skips the access. ``slot`` is a one-element stand-in for a fused kernel's intermediate array
(:mod:`hetflow.ir.codegen`): a stack variable, whatever index the kernel uses.
"""
from __future__ import annotations

import itertools
import operator
import re
import threading

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.core.datamodel import models
from numba.core.typing.templates import AbstractTemplate, AttributeTemplate, infer_getattr, infer_global, signature
from numba.extending import (intrinsic, lower_builtin, lower_getattr_generic, make_attribute_wrapper, overload,
                             register_model)

from ..index.lowering import function_key
from ..cuda_compat import cuda_module, simulated
from . import checks

CPU, GPU, PY = "cpu", "gpu", "python"  # where an implementation runs (PY: the CUDA simulator)


class ViewType(types.Type):
    """A view (or checked array) of one layout over a root array of type ``root``.

    Its identity is its structure only, not the kernel parameter passing it: a function
    a kernel calls without inlining it (every kernel on a GPU) is compiled once for the
    views of one structure, whichever parameters pass them. So its errors cannot name
    the parameter (Numba makes one object of equal types, and the first one made would
    name another parameter's): they name the kernel's line and this type."""


    def __init__(self, layout: "Layout", root, err):
        self.layout, self.root, self.err = layout, root, err
        super().__init__(name=f"hetflow.{layout.name}({root}{', err' if err is not None else ''})")

    def members(self):
        out = [("root", self.root)] + [(f"p{k}", types.int64) for k in range(self.layout.nparams)]
        if self.layout.checked:
            out.append(("pid", types.int64))
        if self.err is not None:
            out.append(("err", self.err))
        return out


@register_model(ViewType)
class _ViewModel(models.StructModel):
    """The value's members, borrowed: a view lives within its entry's call, which holds
    its root (and error record). Not counting references keeps reference-count calls out
    of the kernel's loop, which would stop it vectorising."""

    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, fe_type.members())

    def traverse(self, builder):
        return []


class Layout:
    """One view structure on one target: how a subscript becomes a root index.

    ``exprs``: the root index expressions over ``(i0)``, ``(i1)``, ... and the value's
    integers ``v.p0``, ... (None for a checked plain array of rank ``ndim``), the last
    ``ndim`` of which are a view's extent (:attr:`extent`);
    ``functions``: the co-map functions they call as ``F0``, ...; ``checked``: indices
    are checked against the root's extent.
    """

    _serial = itertools.count()

    def __init__(self, exprs, nparams: int, functions: tuple, ndim: int, checked: bool, target: str,
                 shift=None):
        self.exprs, self.functions, self.checked, self.target = exprs, functions, checked, target
        # A shifted root (one view index plus ``v.p<axis>`` per root dimension): on the CPU,
        # unchecked, lowered straight to the root's subscript (see _ShiftedGet).
        self.shift = shift if target == CPU and not checked else None
        self.is_view = exprs is not None
        self.rank = ndim
        self.nparams = nparams
        # the members holding a view's extent, one per dimension (a checked array's is its root's)
        self.extent = tuple(f"p{k}" for k in range(nparams - ndim, nparams)) if self.is_view else ()
        self.name = f"{'view' if self.is_view else 'array'}{next(self._serial)}_{target}"
        self._impls: dict = {}
        self._lock = threading.Lock()
        self._namespace = None
        if target != PY:
            _register(target)
            _expose(["root", "pid", "err", *(f"p{k}" for k in range(self.nparams))], target)

    # -- implementations ----------------------------------------------------------------
    def impl(self, op: str, ints: tuple, is_tuple: bool):
        """The function doing ``op`` ('get', 'set' or the name of a :mod:`hetflow.atomic`
        function: see :data:`OPERANDS`) for an index with the given integer components
        (``ints``: one bool per component)."""
        key = (op, ints, is_tuple)
        found = self._impls.get(key)
        if found is None:
            with self._lock:
                ns = self._globals()
                exec(compile(self._source(op, ints, is_tuple), f"<hetflow {self.name}>", "exec"), ns)
                found = self._impls[key] = ns[op]
        return found

    def _globals(self) -> dict:
        """Names the implementations call: NumPy, co-map functions and the checks, each
        compiled for the target."""
        if self._namespace is None:
            from . import atomic  # (atomic's functions take views: it imports this module)
            ns = {"np": np, **{f"__hf_{fn.__name__}": fn for fn in atomic.FUNCTIONS}}
            device = _device_wrapper(self.target)
            for k, fn in enumerate(self.functions):
                ns[f"F{k}"] = device(fn)
            if self.target == PY:  # the simulator's device functions see its cuda.atomic
                device = cuda_module().jit(device=True)
            if self.checked:
                helpers = checks.HELPERS[CPU if self.target == CPU else GPU]
                raw = {"__hf_OutOfBounds": checks.OutOfBounds, "__hf_cuda": cuda_module()}
                exec(helpers[0], raw)
                for name in helpers[1]:  # __hf_ok first: __hf_ix calls it
                    raw[name] = ns[name] = device(raw[name])
            self._namespace = ns
        return dict(self._namespace)

    def _source(self, op: str, ints: tuple, is_tuple: bool) -> str:
        """Text of ``op`` over the root: the lowering's index expressions (a view) or the
        index itself (a checked array), cast, checked or guarded as the layout says. An
        atomic calls ``__hf_<op>`` on the root element; its index never wraps (as an
        atomic's does not), and a checked GPU skips it where a store is skipped."""
        atomic = op not in ("get", "set")
        names = [f"i{k}" for k in range(len(ints))]
        # (an overload's implementation takes the parameter names of the function: atomic's ``ary``)
        head = f"def {op}({'ary' if atomic else 'v'}, idx{''.join(', ' + n for n in OPERANDS[op])}):"
        lines = [head] + ["    v = ary"] * atomic
        lines += [f"    {n} = idx[{k}]" for k, n in enumerate(names)] if is_tuple else ["    i0 = idx"]
        if self.is_view:  # every root index is an integer
            comps, checked, wrap = list(self.exprs), [True] * len(self.exprs), 0
        else:  # a checked array: Python's negative indices count from the end
            comps, checked, wrap = names, ints, int(not atomic)
        ok = []
        for axis, (comp, check) in enumerate(zip(comps, checked)):
            if not check:
                continue
            test = f"{comp}, v.root.shape[{axis}], {wrap}, v.pid, {axis}"
            if not self.checked:
                comps[axis] = f"np.uint64({comp})"
            elif self.target == CPU or op == "get":  # the CPU raises OutOfBounds, the GPU
                comps[axis] = f"__hf_ix({test}, v.err)"  # loads element 0 instead
            else:  # or skips the store
                lines.append(f"    k{axis} = {comp}")
                ok.append(f"__hf_ok(k{axis}, v.root.shape[{axis}], {wrap}, v.pid, {axis}, v.err)")
                comps[axis] = f"k{axis}"
        index = f"{', '.join(comps)}{',' if len(comps) == 1 and (is_tuple or atomic) else ''}"
        if ok:  # a skipped atomic returns element 0, as a failed load does
            skipped = f" v.root[{', '.join(['0'] * len(comps))}]" if atomic else ""
            lines.append(f"    if not ({' and '.join(ok)}):\n        return{skipped}")
        if atomic:
            lines.append(f"    return __hf_{op}(v.root, ({index}), {', '.join(OPERANDS[op])})")
        else:
            lines.append(f"    return v.root[{index}]" if op == "get" else f"    v.root[{index}] = val")
        return "\n".join(lines) + "\n"


# The operands of each operation of a layout after the value and its index: a subscript's
# and hetflow.atomic's (kernels.atomic).
OPERANDS = {"get": (), "set": ("val",), "add": ("val",), "min": ("val",), "max": ("val",),
            "cas": ("expected", "val")}


def _index_pattern(idx):
    """(integer components, whether a tuple) of a Numba index type."""
    parts = list(idx) if isinstance(idx, types.BaseTuple) else [idx]
    return tuple(isinstance(p, types.Integer) for p in parts), isinstance(idx, types.BaseTuple)


def _impl_for(v, idx, op):
    if not isinstance(v, ViewType) or _shifted(v, idx):
        return None
    ints, is_tuple = _index_pattern(idx)
    layout = v.layout
    if layout.is_view and (len(ints) != layout.rank or not all(ints)):
        raise numba.core.errors.TypingError(
            f"a view of rank {layout.rank} is subscripted with {len(ints)} indices ({idx}): a view "
            f"takes one integer per dimension")
    return layout.impl(op, ints, is_tuple)


def _shifted(v, idx) -> bool:
    """A subscript of a shifted root by one integer per dimension, lowered by
    :func:`_shifted_getitem`: no implementation to compile (compile time)."""
    ints, _ = _index_pattern(idx)
    return (isinstance(v, ViewType) and v.layout.shift is not None and len(ints) == v.layout.rank
            and all(ints) and isinstance(v.root.dtype, (types.Number, types.Boolean)))


@infer_global(operator.getitem)
class _ShiftedGet(AbstractTemplate):
    def generic(self, args, kws):
        if len(args) == 2 and not kws and _shifted(*args):
            return signature(args[0].root.dtype, *args)


@infer_global(operator.setitem)
class _ShiftedSet(AbstractTemplate):
    def generic(self, args, kws):
        if len(args) == 3 and not kws and _shifted(*args[:2]):
            return signature(types.none, args[0], args[1], args[0].root.dtype)


def _root_subscript(context, builder, sig, args):
    """(root type, root, root index type, root index) of a shifted root's subscript:
    root index ``k`` is view index ``shift[k]`` plus member ``p<k>``, unsigned."""
    vt, idx_ty = sig.args[:2]
    value = cgutils.create_struct_proxy(vt)(context, builder, value=args[0])
    parts = cgutils.unpack_tuple(builder, args[1]) if isinstance(idx_ty, types.BaseTuple) else [args[1]]
    kinds = list(idx_ty) if isinstance(idx_ty, types.BaseTuple) else [idx_ty]
    index = []
    for axis, var in enumerate(vt.layout.shift):
        i = context.cast(builder, parts[var], kinds[var], types.int64)
        index.append(builder.add(i, getattr(value, f"p{axis}")))
    index_ty = types.UniTuple(types.uint64, len(index))
    return vt.root, value.root, index_ty, context.make_tuple(builder, index_ty, index)


@lower_builtin(operator.getitem, ViewType, types.Integer)
@lower_builtin(operator.getitem, ViewType, types.BaseTuple)
def _shifted_getitem(context, builder, sig, args):
    root_ty, root, index_ty, index = _root_subscript(context, builder, sig, args)
    impl = context.get_function(operator.getitem, signature(sig.return_type, root_ty, index_ty))
    return impl(builder, (root, index))


@lower_builtin(operator.setitem, ViewType, types.Integer, types.Any)
@lower_builtin(operator.setitem, ViewType, types.BaseTuple, types.Any)
def _shifted_setitem(context, builder, sig, args):
    root_ty, root, index_ty, index = _root_subscript(context, builder, sig, args)
    impl = context.get_function(operator.setitem, signature(types.none, root_ty, index_ty, sig.args[2]))
    return impl(builder, (root, index, args[2]))


def _view_getitem(v, idx):
    return _impl_for(v, idx, "get")


def _view_setitem(v, idx, val):
    return _impl_for(v, idx, "set")


def _view_len(v):
    if not isinstance(v, ViewType):
        return None
    if v.layout.is_view and not v.layout.rank:
        raise numba.core.errors.TypingError(unsized(None, v))
    return (lambda v: v.shape[0]) if v.layout.is_view else (lambda v: len(v.root))


def unsized(param, kind=None) -> str:
    """Why ``len()`` of a rank-0 view fails in a kernel, as NumPy's of a 0-d array does
    (``kind``: the view's compiled type, where there is one)."""
    who = (f"view argument {param!r}" if param is not None else "a view argument") + (f" ({kind})" if kind else "")
    return f"{who}: len() of a rank-0 view, which has no first dimension; its size is 1"


# The attributes of an array a kernel may read of a view or checked array: a checked
# array's root answers them; a view, its rank, its root's element type and its extent,
# which the value's members hold (each launch fills them: one executable serves every
# view of its structure, whatever its extent).
ATTRIBUTES = ("shape", "size", "ndim", "dtype")


def _attribute_template(base):
    """The typing of :data:`ATTRIBUTES` on ``base``, a target's AttributeTemplate."""
    class ViewAttributes(base):
        key = ViewType

        def generic_resolve(self, v, attr):
            if attr not in ATTRIBUTES:
                return None
            if v.layout.is_view and attr == "shape":
                return types.UniTuple(types.intp, v.layout.rank)
            if v.layout.is_view and attr in ("size", "ndim"):
                return types.intp
            return self.context.resolve_getattr(v.root, attr)

    return ViewAttributes


def _attribute_lowering(cgutils_):
    """The lowering of :data:`ATTRIBUTES` (``cgutils_``: the target's cgutils): the root's,
    or a view's rank, and its extent from its members."""
    def lower(context, builder, v, value, attr):
        if v.layout.is_view and attr == "ndim":
            return context.get_constant(types.intp, v.layout.rank)
        value = cgutils_.create_struct_proxy(v)(context, builder, value=value)
        if not v.layout.is_view or attr == "dtype":
            return context.get_getattr(v.root, attr)(context, builder, v.root, value.root, attr)
        dims = [getattr(value, m) for m in v.layout.extent]
        if attr == "shape":
            return context.make_tuple(builder, types.UniTuple(types.intp, len(dims)), dims)
        size = context.get_constant(types.intp, 1)  # attr == "size": the product, 1 at rank 0
        for d in dims:
            size = builder.mul(size, d)
        return size

    return lower


def _slot_getitem(s, idx, target):
    if isinstance(s, SlotType):
        load = _slot_functions(target)[1]
        return lambda s, idx: load(s)


def _slot_setitem(s, idx, val, target):
    if isinstance(s, SlotType):
        store = _slot_functions(target)[2]
        return lambda s, idx, val: store(s, val)


_registered: set = set()
_exposed = {CPU: set(), GPU: set()}
_register_lock = threading.RLock()


def _register(target):
    """The subscript, ``len`` and attribute typing and lowering of views and slots on
    ``target`` (CPU: Numba's own registries; GPU: numba-cuda's), once."""
    with _register_lock:
        if target in _registered:
            return
        if target == GPU:
            from numba.cuda import cgutils as cuda_cgutils, extending as ext
            from numba.cuda.cudadecl import registry as typing
            from numba.cuda.cudaimpl import registry as lowering
            from numba.cuda.typing.templates import AttributeTemplate as attributes
            ov = lambda f: ext.overload(f, target="cuda")  # noqa: E731
            typing.register_attr(_attribute_template(attributes))
            lowering.lower_getattr_generic(ViewType)(_attribute_lowering(cuda_cgutils))
        else:
            ov = overload
            infer_getattr(_attribute_template(AttributeTemplate))
            lower_getattr_generic(ViewType)(_attribute_lowering(cgutils))
        ov(operator.getitem)(_view_getitem)
        ov(operator.setitem)(_view_setitem)
        ov(len)(_view_len)
        ov(operator.getitem)(lambda s, idx: _slot_getitem(s, idx, target))
        ov(operator.setitem)(lambda s, idx, val: _slot_setitem(s, idx, val, target))
        _registered.add(target)


def _expose(members, target):
    """Make the value's members readable attributes (``v.root``, ``v.p0``) on ``target``."""
    if target == GPU:
        from numba.cuda.extending import make_attribute_wrapper as wrapper
    else:
        wrapper = make_attribute_wrapper
    with _register_lock:
        for m in members:
            if m not in _exposed[target]:
                wrapper(ViewType, m, m)
                _exposed[target].add(m)


def _intrinsic(target):
    if target == GPU:
        from numba.cuda.extending import intrinsic as cuda_intrinsic
        return cuda_intrinsic
    return intrinsic


def constructor(low, checked: bool, target: str):
    """``make(root, params, pid, err)``: the value a kernel receives for a view lowered as
    ``low`` (None: a plain argument, made a checked array when ``checked`` and it is
    one), on ``target``; ``pid`` is the parameter's position, ``err`` the GPU's error
    record in checked mode (else 0)."""
    def layout_of(ndim):
        return layout(low, ndim, checked, target)

    if target == PY:
        param = parameter(low) if low is not None else None

        def make(root, params, pid, err):
            if low is None and not getattr(root, "ndim", 0):
                return root  # a scalar
            return PyView(layout_of(getattr(root, "ndim", 0)), root, params, pid, err, param)
        return make
    _register(target)

    def typer(typingctx, root, params, pid, err):
        if low is None and not isinstance(root, types.Array):  # a scalar stays itself
            return root(root, params, pid, err), lambda context, builder, sig, args: args[0]
        lay = layout_of(root.ndim)
        vt = ViewType(lay, root, err if checked else None)

        def codegen(context, builder, sig, args):
            root_v, params_v, pid_v, err_v = args
            value = cgutils.create_struct_proxy(vt)(context, builder)
            value.root = root_v
            for k in range(lay.nparams):
                p = builder.extract_value(params_v, k)
                setattr(value, f"p{k}", context.cast(builder, p, sig.args[1][k], types.int64))
            if checked:
                value.pid = context.cast(builder, pid_v, sig.args[2], types.int64)
            if vt.err is not None:
                value.err = err_v
            return value._getvalue()

        return vt(root, params, pid, err), codegen

    return _intrinsic(target)(typer)


def parameter(low) -> str | None:
    """The kernel parameter a view lowered as ``low`` is passed as: a launch lowers the
    view it passes as ``x`` with the prefix ``x__p`` (:mod:`hetflow.runtime.launch`), so
    its index variables are ``x__pi0``, ... and its numbers ``x__pp0``, ...; None
    for other prefixes."""
    names = low.var_names + low.param_names
    found = re.fullmatch(r"(.+)__p[ip]\d+", names[0]) if names else None
    return found.group(1) if found else None


class PyView:
    """A view value on the CUDA simulator (kernels run as Python there)."""

    def __init__(self, layout: Layout, root, params, pid, err, param=None):
        self.layout, self.root, self.pid, self.err, self.param = layout, root, pid, err, param
        for k, p in enumerate(params):
            setattr(self, f"p{k}", int(p))

    def _impl(self, op, idx):
        is_tuple = isinstance(idx, tuple)
        ints = tuple(isinstance(p, (int, np.integer)) for p in (idx if is_tuple else (idx,)))
        return self.layout.impl(op, ints, is_tuple)

    def __getitem__(self, idx):
        return self._impl("get", idx)(self, idx)

    def __setitem__(self, idx, val):
        self._impl("set", idx)(self, idx, val)

    def atomic(self, op: str, idx, *operands):
        """hetflow.atomic's ``op`` on the root element at view index ``idx``."""
        parts = idx if isinstance(idx, tuple) else (idx,)
        if self.layout.is_view and (len(parts) != self.layout.rank
                                    or not all(isinstance(p, (int, np.integer)) for p in parts)):
            who = f"view argument {self.param!r}" if self.param is not None else "a view"
            raise IndexError(f"hetflow.atomic.{op}: the index of {who}, a view of rank {self.layout.rank}, must "
                             f"be {self.layout.rank} integer(s); got {idx}")
        return self._impl(op, idx)(self, idx, *operands)

    @property
    def shape(self) -> tuple:
        """A view's extent (its members, as compiled code reads them), a checked array's root's."""
        if self.layout.is_view:
            return tuple(getattr(self, m) for m in self.layout.extent)
        return self.root.shape

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.layout.is_view else self.root.size

    def __len__(self):
        if self.layout.is_view and not self.layout.rank:
            raise TypeError(unsized(self.param))
        return self.shape[0] if self.layout.is_view else len(self.root)

    @property
    def ndim(self):
        return self.layout.rank if self.layout.is_view else self.root.ndim

    @property
    def dtype(self):
        return self.root.dtype


_layouts: dict = {}
_layouts_lock = threading.Lock()


def layout(low, ndim: int, checked: bool, target: str) -> Layout:
    """The layout of a view lowered as ``low`` (None: a checked array of rank ``ndim``),
    shared by every view whose root index is computed by the same code (whatever its
    parameter's name, its numbers or the operators that led to it: the four shifts of
    a stencil's interior share one)."""
    exprs, functions = _canonical(low) if low is not None else (None, ())
    rank = low.rank if low is not None else ndim
    nparams = len(packing(low)) if low is not None else 0
    shifts = low.shifts if low is not None else None
    shift = tuple(var for var, _, _ in shifts) if shifts is not None else None
    args = (exprs, nparams, functions, rank, checked, target, shift)
    key = (exprs, nparams, tuple(map(function_key, functions)), rank, checked, target)
    try:
        found = _layouts.get(key)
    except TypeError:  # a co-map function capturing unhashable values: a layout of its own
        return Layout(*args)
    if found is None:
        with _layouts_lock:
            found = _layouts.get(key)
            if found is None:
                found = _layouts[key] = Layout(*args)
    return found


def packing(low) -> tuple:
    """How an entry packs a view's lowering integers into its value: per integer of
    the value, (a constant, positions of the lowering integers added to it). A shifted
    root (:attr:`~hetflow.index.lowering.Lowering.shifts`) packs into one offset per
    root dimension, so that all its views share one layout; the extent comes last
    (:attr:`Layout.extent`)."""
    shifts = low.shifts
    if shifts is not None:
        return tuple((const, params) for _, const, params in shifts) + tuple((0, (k,)) for k in low.extent)
    return tuple((0, (k,)) for k in range(len(low.params)))


def _canonical(low) -> tuple:
    """(root index expressions, functions they call) of the layout of ``low``'s views."""
    shifts = low.shifts
    if shifts is not None:
        return tuple(f"((i{var}) + v.p{axis})" for axis, (var, _, _) in enumerate(shifts)), ()
    return _normalised(low)


def _normalised(low) -> tuple:
    """(root index expressions over ``(i<k>)``, ``v.p<k>`` and ``F<k>``, the functions
    ``F<k>``) of a lowering: its own names (which carry the parameter's) replaced."""
    rename = {p: f"v.p{k}" for k, p in enumerate(low.param_names)}
    names = list(low.globals)
    rename.update((f, f"F{k}") for k, f in enumerate(names))
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, rename)) + r")\b") if rename else None
    texts = low.index_source(tuple(f"(i{k})" for k in range(low.rank)))
    if pattern is not None:
        texts = tuple(pattern.sub(lambda m: rename[m.group(1)], t) for t in texts)
    return texts, tuple(low.globals[f] for f in names)


def _device_wrapper(target):
    """A function compiled for ``target``, to be called from a compiled function."""
    if target == CPU:
        return lambda f: f if isinstance(f, numba.core.dispatcher.Dispatcher) else numba.njit(f)
    if target == GPU:
        cuda = cuda_module()
        return lambda f: cuda.jit(device=True)(getattr(f, "py_func", f))
    return lambda f: getattr(f, "py_func", f)


def target_of(device) -> str:
    if device.kind == "cpu":
        return CPU
    return PY if simulated() else GPU


# -- launch indices ------------------------------------------------------------------------
def _nonneg_typer(typingctx, i):
    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(1)])
        assume = cgutils.get_or_insert_function(builder.module, fnty, "llvm.assume")
        builder.call(assume, [builder.icmp_signed(">=", args[0], args[0].type(0))])
        return args[0]

    return i(i), codegen


def nonneg(target: str):
    """``nonneg(i)``: ``i``, with the promise that it is not negative. Launch indices
    never are; told so, LLVM drops the negative-index wraparound test of ``x[i]`` in the
    kernel, which otherwise stops vectorisation on the CPU (3-4x on axpy). Elsewhere
    (no vector units to feed) the identity."""
    if target != CPU:
        return int
    global _nonneg
    if _nonneg is None:
        _nonneg = intrinsic(_nonneg_typer)
    return _nonneg


_nonneg = None


# -- fused intermediates ------------------------------------------------------------------
class SlotType(types.Type):
    """A fused kernel's intermediate: a pointer to one stack variable of ``dtype``."""

    def __init__(self, dtype):
        self.dtype = dtype
        super().__init__(name=f"hetflow.slot({dtype})")


@register_model(SlotType)
class _SlotModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, dmm.lookup(fe_type.dtype).get_value_type().as_pointer())


def _slot_typer(typingctx, init):
    def codegen(context, builder, sig, args):
        ptr = cgutils.alloca_once(builder, context.get_value_type(init))
        builder.store(args[0], ptr)
        return ptr

    return SlotType(init)(init), codegen


def _load_typer(typingctx, s):
    return s.dtype(s), lambda context, builder, sig, args: builder.load(args[0])


def _store_typer(typingctx, s, val):
    def codegen(context, builder, sig, args):
        builder.store(context.cast(builder, args[1], sig.args[1], s.dtype), args[0])
        return context.get_dummy_value()

    return types.none(s, val), codegen


_slot_ops: dict = {}


def _slot_functions(target):
    """(make, load, store) intrinsics for ``target``."""
    found = _slot_ops.get(target)
    if found is None:
        make = _intrinsic(target)
        found = _slot_ops[target] = (make(_slot_typer), make(_load_typer), make(_store_typer))
    return found


class _SlotMarker:
    """Stands for ``slot`` in a generated kernel's globals; the code repository puts the
    target's ``slot`` in its place when compiling."""

    __qualname__ = "hetflow.slot"


SLOT = _SlotMarker()


class PySlot:
    """A fused intermediate on the CUDA simulator."""

    def __init__(self, init):
        self.value = init

    def __getitem__(self, idx):
        return self.value

    def __setitem__(self, idx, val):
        self.value = type(self.value)(val)


def slot(target: str):
    """``slot(init)``: a new intermediate holding ``init`` (a NumPy scalar of its dtype)."""
    if target == PY:
        return PySlot
    _register(target)
    return _slot_functions(target)[0]
