"""Binding a kernel launch: check the arguments, lower views, pick the executable.

A :class:`Launch` is everything needed to run chunks ``[lo, hi)`` of one kernel launch
on one device: the executable and the argument tuple its entry point takes. Every
check happens here, before anything runs.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import numbers

import numba
import numpy as np
from numba.core.errors import NumbaError

from ..errors import ArgumentError, ArgumentTypeError, ScatteredWriteWarning, ShapeError, warn_user
from ..index import views as _views
from ..index import arrays as _arrays
from ..index.lowering import shared_lowering
from ..kernels.kernel import Kernel
from ..platform.devices import gpus
from ..platform.repository import repository
from . import aliasing as _aliasing

SCALARS = (numbers.Number, np.generic)


def is_device_array(x) -> bool:
    """An array a launch runs on a GPU: one with the CUDA array interface
    (:func:`hetflow.index.arrays.is_device_array`), or the CUDA simulator's."""
    return _arrays.is_device_array(x) or hasattr(x, "__cuda_ndarray__") and not isinstance(x, np.ndarray)


def coherent(x) -> bool:
    """A coherent array (:class:`hetflow.Buffer`), whose copy a launch acquires per device."""
    return getattr(type(x), "hetflow_coherent", False)


def host_arrays(args) -> bool:
    """Whether some argument, or a view's root, is a NumPy array: what a GPU launch copies
    in and out each time (unchecked arguments too: anything else answers False)."""
    return any(isinstance(a.root if type(a) in _views._VIEW_TYPES else a, np.ndarray) for a in args)


def normalize_extent(extent) -> tuple[int, ...]:
    """An int, a tuple of ints, an array or a view, as a launch extent. Anything but
    integers (a float, a string, a bool) is an ArgumentTypeError (a TypeError): ``int()`` would truncate
    ``9.7`` to 9 and iterate ``"10"`` into (1, 0)."""
    if type(extent) is int and extent >= 0:  # the common cases, kept cheap
        return (extent,)
    if type(extent) is tuple and extent:
        for e in extent:
            if type(e) is not int or e < 0:
                break
        else:
            return extent
    if isinstance(extent, (numbers.Integral, str, bytes)):
        extent = (extent,)  # np.int64 has a shape (), but is a rank-1 extent
    elif _views.is_view(extent) or hasattr(extent, "shape"):
        extent = tuple(extent.shape)
    try:
        ext = tuple(map(_dimension, extent))
    except ArgumentTypeError:
        raise
    except TypeError:
        raise ArgumentTypeError(f"launch extent must be an int, a tuple of ints, an array or a view; "
                                f"got {type(extent).__name__}") from None
    if not ext:
        raise ShapeError("launch extent has rank 0; give at least one dimension")
    if any(e < 0 for e in ext):
        raise ShapeError(f"launch extent {ext} has a negative dimension")
    return ext


def _dimension(e) -> int:
    """One extent dimension: an integer (Python's or NumPy's), never a bool, float or string."""
    if type(e) is int:
        return e
    if isinstance(e, (bool, np.bool_)) or not isinstance(e, numbers.Integral):
        raise ArgumentTypeError(f"launch extent dimension {e!r} ({type(e).__name__}) is not an integer")
    return int(e)


@dataclasses.dataclass
class Plan:
    """What does not change between launches with the same kernel, device and argument
    types: the checked parameter names, access modes and the executable."""

    data: list
    access: object
    checks: tuple          # see _extent_checks
    executable: object
    written: tuple
    compiled: bool = False   # the chunk entry is compiled for these argument types
    cpu_entry: object = None  # CPU: that compiled code, where the key fixes its types (cpu.compile_launch)
    parallel_compiled: bool = False  # the CPU parallel entry too
    fast_entry: object = False  # GPU: runtime.gpu.FastEntry (False: not built yet; None: none)
    buffers: bool = False       # some argument (or view root) is a coherent Buffer
    lowerings: tuple = ()       # per data argument: its view's Lowering, or None
    views_only: bool = False    # every extent check is of a view (fixed by the key)
    fits: set = dataclasses.field(default_factory=set)  # launch extents those views fit
    host_arrays: bool = False   # some argument (or view root) is a NumPy array
    device_arrays: bool = False  # some argument (or view root) is a GPU array (see check_residence)
    fresh: bool = False         # some view's lowering is made each launch (see _key)
    scattered: tuple = ()       # arrays written, not atomically, at indices no function of the launch index
    warned: bool = False        # the ScatteredWriteWarning for them was given
    row_cost: float | None = None  # CPU: seconds a row takes on one core, the smaller of the last two measured (runtime.cpu._learn)
    last_row_cost: float | None = None  # CPU: the newest measure; row_cost is the smaller of it and the one before
    # CPU, queued runs (runtime.queue._tiny): launches of fewer indices than ``tiny_below`` are
    # predicted tiny, by the faster of the last two timed runs; ``last_below``: the newest's bound
    tiny_below: float = 0.0
    last_below: float = 0.0
    aliasing: dict = dataclasses.field(default_factory=dict)  # verdicts of runtime.aliasing
    rows_only: tuple = ()       # when every extent check is of an array's rows: their positions
    entry_template: tuple = ((), ())  # see _entry_template
    alias_free: bool = False    # no argument can alias a written one (see _alias_free)
    owned: tuple | None = None  # when every argument is a scalar or a NumPy array that owns its
                                # memory (the key says so): the arrays' positions (see bind)
    column_shift: int | None = None  # GPU, rank 2: see runtime.gpu.column_shift (None: not yet known)
    guard: object = None        # its key's check, generated (see _guard); None: looked up by key
    guard_checks: bool = False  # the guard also makes _check_launch's checks


@dataclasses.dataclass(slots=True)  # one object per launch, no __dict__: made per enqueue
class Launch:
    """One kernel launch bound to one device."""

    kernel: Kernel
    extent: tuple
    device: object
    plan: Plan
    args: tuple            # the kernel's data arguments as given (arrays, views, scalars)
    entry_args: tuple      # what the entry point takes after lo, hi and the inner extents
    lowerings: tuple = ()  # per data argument: its view's Lowering, or None

    def view_arguments(self, k: int, root) -> list:
        """The entry arguments of view argument ``k`` over ``root`` (its root, or that
        root's copy on a device): the root, unless another view passes it, then the
        view's numbers."""
        low = self.lowerings[k]
        return [root, *low.params] if low.root_name is None else list(low.params)

    @property
    def executable(self):
        return self.plan.executable

    @property
    def written(self) -> tuple:
        """Indices into ``args`` of arrays/views the kernel writes."""
        return self.plan.written

    @property
    def inner(self) -> tuple:
        return self.extent[1:]

    def on(self, entry_args: tuple) -> "Launch":
        """The same launch over other entry arguments (a device's copies of its arrays)."""
        return Launch(self.kernel, self.extent, self.device, self.plan, self.args, entry_args, self.lowerings)


_BY_TYPE = frozenset((float, int, bool, complex))  # Python scalars: keyed by their type
# The Python ints a launch takes: plans key them by type, and compiled code takes int64.
_INT_MIN, _INT_MAX = -2**63, 2**63 - 1


# The flags that change a NumPy array's compiled type: C and F contiguity, aligned,
# writeable; and whether it owns its memory (0x4), which no other array then overlaps
# unless it is a view of it (``Plan.owned``).
_LAYOUT = 0x1 | 0x2 | 0x4 | 0x100 | 0x400


# Array types that keep their contiguity as attributes, as CuPy's does: their key is read
# from those, as ``a.flags`` builds a new object per call (0.5 us of a launch's 20).
_FLAGGED = set()


def _arg_key(a):
    """What an argument contributes to the compiled signature (cheap to compute)."""
    t = type(a)
    if t is np.ndarray:
        return (a.dtype, a.ndim, a.flags.num & _LAYOUT)
    if t in _FLAGGED:
        return (t, a.dtype, a.ndim, a._c_contiguous, a._f_contiguous)
    if t in _BY_TYPE or t in _views._VIEW_TYPES:  # a view's root and lowering: in bind
        if t is int and not _INT_MIN <= a <= _INT_MAX:
            return None  # no plan has it: the look-up misses and _check_arguments says why
        return t
    if coherent(a):  # a Buffer: every copy is C-contiguous
        return (t, a.dtype, a.ndim)
    flags = getattr(a, "flags", None)
    if flags is not None and hasattr(a, "dtype"):  # CuPy and other device arrays
        if type(flags) is dict:  # numba-cuda's device arrays keep theirs in a dict
            return (t, a.dtype, a.ndim, flags["C_CONTIGUOUS"], flags["F_CONTIGUOUS"])
        if hasattr(a, "_c_contiguous") and hasattr(a, "_f_contiguous"):
            _FLAGGED.add(t)
        return (t, a.dtype, a.ndim, flags.c_contiguous, flags.f_contiguous)
    return t


_PLAIN = (np.ndarray, float, int, bool, complex)


def _check_arguments(kernel: Kernel, ndim: int, args: tuple) -> list[str]:
    data = list(kernel.params[ndim:])
    if len(data) != len(args):
        raise ArgumentTypeError(
            f"kernel {kernel.name!r} takes {len(data)} data argument(s) ({', '.join(data)}) after its "
            f"{ndim} index parameter(s) ({', '.join(kernel.params[:ndim])}), but {len(args)} were given")
    for name, arg in zip(data, args):
        if not (isinstance(arg, (np.ndarray, *SCALARS)) or coherent(arg) or is_device_array(arg) or _views.is_view(arg)):
            raise ArgumentTypeError(
                f"kernel {kernel.name!r} argument {name!r}: {type(arg).__name__} is not an array, "
                f"a view or a scalar")
        refuse_masked(arg, f"kernel {kernel.name!r} argument {name!r}:")
        if type(arg) is int and not _INT_MIN <= arg <= _INT_MAX:
            raise ArgumentError(
                f"kernel {kernel.name!r} argument {name!r}: the integer {arg} does not fit int64, "
                f"which compiled code takes; pass a float or a NumPy uint64")
    return data


def _check_scalars(kernel: Kernel, data: list[str], args: tuple, access) -> None:
    """ArgumentTypeError for a scalar given where the kernel subscripts the argument by its
    launch indices (``x[i]``): found here, not as a compile error (or, under the CUDA
    simulator, an error raised while the kernel runs)."""
    for name, arg in zip(data, args):
        if isinstance(arg, SCALARS) and name in access.identity:
            raise ArgumentTypeError(f"kernel {kernel.name!r} argument {name!r}: {type(arg).__name__} {arg} is "
                                    f"a scalar, but the kernel subscripts it by its launch index; pass an array "
                                    f"or a view")


def _check_writable(kernel: Kernel, data: list[str], args: tuple, written: tuple) -> None:
    """Every array the kernel writes (a view's root) accepts writes: checked before the
    launch, not found by the compiler or after a GPU ran."""
    for k in written:
        flags = getattr(_views.root_of(args[k]), "flags", None)
        if flags is not None and not getattr(flags, "writeable", True):
            raise ArgumentError(
                f"kernel {kernel.name!r} writes argument {data[k]!r}, but that array is read-only "
                f"(flags.writeable is False)")


def refuse_masked(x, where: str) -> None:
    """ArgumentTypeError, its message starting with ``where``, for a masked array ``x``
    (or a view of one): kernels and NumPy's reductions would read its masked values.
    Every call site refuses them here."""
    if not isinstance(x.root if _views.is_view(x) else x, np.ma.MaskedArray):
        return
    what = "a view of a masked array" if _views.is_view(x) else "a masked array"
    raise ArgumentTypeError(f"{where} {what} (numpy.ma), whose mask hetflow does not apply: the values under it "
                            f"would be read as valid; pass its data with the masked elements set, "
                            f"x.filled(value), or dropped, x.compressed()")


# Element types the compiler cannot generate code for, per device kind (Numba has no
# half precision on the CPU; no device runs Python objects). Types Numba has no type
# for (long double, unstructured void) are refused on every device: the CUDA simulator,
# which runs kernels as Python, would take them where a real GPU cannot.
_UNSUPPORTED = {"cpu": frozenset(map(np.dtype, (np.float16, object))), "gpu": frozenset((np.dtype(object),))}


@functools.lru_cache(maxsize=None)
def element_problem(dtype: np.dtype, kind: str, device_id: str) -> str | None:
    """Why compiled code on a device of ``kind`` (``device_id``) cannot take elements of
    ``dtype``, as the end of an error message; None where it can."""
    if not dtype.isnative:  # typed by no Numba target; a kernel would write it in the wrong order
        return (f"element type {dtype} is in non-native byte order, which compiled code cannot "
                f"read or write; pass the array a as a native copy, a.astype(a.dtype.newbyteorder('=')), or "
                f"swapped in place, a.byteswap(inplace=True).view(a.dtype.newbyteorder('='))")
    if dtype in _UNSUPPORTED.get(kind, ()):
        return f"element type {dtype} is not supported on {device_id}; convert it (e.g. to float32) first"
    try:
        numba.from_dtype(dtype)
    except NumbaError:
        return (f"element type {dtype} has no type in compiled code (Numba) on any device; convert it "
                f"(e.g. to float64) first")
    return None


def _check_dtypes(kernel: Kernel, data: list[str], args: tuple, device) -> None:
    """ArgumentTypeError for an argument whose element type ``device`` cannot run (before
    anything is compiled or looked up in the code repository)."""
    for name, arg in zip(data, args):
        dtype = getattr(_views.root_of(arg) if _views.is_view(arg) else arg, "dtype", None)
        problem = element_problem(np.dtype(dtype), device.kind, device.id) if dtype is not None else None
        if problem is not None:
            raise ArgumentTypeError(f"kernel {kernel.name!r} argument {name!r}: {problem}")


def _extent_checks(data: list[str], args: tuple, access) -> tuple:
    """(position, name, axes, is_view) for every array or view indexed by the first k
    launch indices: on ``axes`` (those of the k whose accesses are not all guarded by a
    bound on that index, ``if i < n:``) it must cover the launch extent (views: match it
    exactly)."""
    checks = []
    for pos, (name, arg) in enumerate(zip(data, args)):
        k = access.identity.get(name)
        if k and not isinstance(arg, SCALARS):
            axes = tuple(a for a in range(k) if a not in access.guarded.get(name, ()))
            if axes:
                checks.append((pos, name, axes, _views.is_view(arg)))
    return tuple(checks)


def _check_extent(kernel: Kernel, extent: tuple, args: tuple, checks: tuple) -> None:
    for pos, name, axes, view in checks:
        shape = tuple(args[pos].shape)
        if axes == (0,) and not view and shape and shape[0] >= extent[0]:
            continue  # the common case (a 1-D launch over an array), kept cheap
        if len(shape) > axes[-1] and all((shape[a] == extent[a]) if view else (shape[a] >= extent[a])
                                         for a in axes):
            continue
        what = "view" if view else "array"
        raise ShapeError(
            f"kernel {kernel.name!r} argument {name!r}: {what} of extent {shape} does not fit the "
            f"launch extent {extent}" + (" (a view must match it exactly)" if view else "") +
            "; guard its accesses (if i < n: ...) where it is meant to be smaller")


def check_extent(kernel: Kernel, extent: tuple, args: tuple) -> None:
    """Check ``kernel``'s data arguments and that the arrays and views it indexes by the
    launch index cover ``extent``, as :func:`bind` does: for a kernel that generated code
    calls at each index of ``extent`` (map-reduce), whose own launch is over blocks."""
    ndim = len(extent)
    data = _check_arguments(kernel, ndim, args)
    _check_extent(kernel, extent, args, _extent_checks(data, args, kernel.access(ndim)))


def with_defaults(kernel: Kernel, ndim: int, args: tuple) -> tuple:
    """``args`` completed by the kernel's default values of the parameters not given."""
    defaults = getattr(kernel.pyfunc, "__defaults__", None) or ()
    first = len(kernel.params) - len(defaults)  # the first parameter with a default
    given = ndim + len(args)
    if given < first or given >= len(kernel.params):
        return args
    return args + tuple(defaults[given - first:])


def warn_scattered(launch: "Launch") -> None:
    """Warn, once per plan, that a parallel launch writes arrays at indices that are no
    function of its launch index without atomics (their updates race)."""
    plan = launch.plan
    if not plan.scattered or plan.warned:
        return
    plan.warned = True
    names = ", ".join(map(repr, plan.scattered))
    warn_user(f"kernel {launch.kernel.name!r} writes {names} at indices that are no function of its "
              f"launch index, from parallel workers on {launch.device.id}: updates of one element race "
              f"and can be lost; update them with hetflow.atomic.add/min/max/cas", ScatteredWriteWarning)


def _key(params: tuple, ndim: int, args: tuple) -> tuple:
    """What the arguments contribute to a plan's key: a view its interned structure (which
    fixes its extent and lowering), its root's type and which view first passes its root."""
    key = []
    for a in args:  # plain arrays and floats: the common case, in one pass
        t = type(a)
        if t is np.ndarray:
            key.append((a.dtype, a.ndim, a.flags.num & _LAYOUT))
        elif t is float:
            key.append(t)
        else:
            break
    else:
        return tuple(key)
    view_types = _views._VIEW_TYPES
    if type(a) not in view_types and all(type(a) in _PLAIN for a in args):
        return tuple(map(_arg_key, args))
    roots, key = {}, []
    for k, a in enumerate(args):
        if type(a) not in view_types:
            key.append(_arg_key(a))
            continue
        root = a.root  # keyed once per root: which view first passes it, and its type
        found = roots.get(id(root))
        if found is None:
            found = roots[id(root)] = (k, _arg_key(root))
        structure = a.signature
        if structure.key is None:  # a co_map capturing unhashable values: keyed by its lowering,
            structure = FRESH, shared_lowering(a, f"{params[ndim + k]}__p").key  # made each launch
        key.append((structure, found))
    return tuple(key)


FRESH = "lowered afresh"


def _guard(args: tuple, key: tuple, checks: tuple = ()):
    """``guard(args, rows) -> bool``: whether :func:`_key` gives ``args`` the key ``key``
    (which it gave the arguments here), generated for them as one expression: a warm launch
    with views built afresh spends more host time computing and hashing its key than
    anything else, and its plan is most often the one the kernel last ran on that device.
    It says False where in doubt (an element type equal but not identical, say): the
    launch then looks its plan up by key. None where it cannot be written (a view lowered
    afresh, an argument type only :func:`_arg_key` knows). ``checks``: more terms, over
    ``a0``, ``a1``, ... and the launch's ``rows`` (:func:`_check_terms`)."""
    env, terms, roots = {"ndarray": np.ndarray}, [], []
    for k, (a, part) in enumerate(zip(args, key)):
        if type(a) not in _views._VIEW_TYPES:
            terms.append(_value_guard(f"a{k}", a, part, env))
            continue
        structure, (first, root_part) = part
        if type(structure) is tuple:  # (FRESH, ...): its lowering is made each launch
            return None
        env[f"s{k}"], env[f"t{k}"] = structure, type(a)  # a view of another structure holds another
        terms.append(f"type(a{k}) is t{k} and a{k}.signature is s{k}")
        if first != k:  # its root is the one an earlier view passes
            terms.append(f"a{k}.root is r{first}")
            continue
        terms += [f"(r{k} := a{k}.root) is not None", _value_guard(f"r{k}", a.root, root_part, env)]
        terms += [f"r{k} is not r{j}" for j in roots]  # views of other roots hold other roots
        roots.append(k)
    if None in terms:
        return None
    terms += checks
    names = "".join(f"a{k}, " for k in range(len(args)))
    source = (f"def guard(a, rows):\n    if len(a) != {len(args)}:\n        return False\n"
              f"    {names or '_'} = a\n    return {' and '.join(terms) or 'True'}\n")
    exec(compile(source, "<hetflow.runtime.launch plan guard>", "exec"), env)
    return env["guard"]


def _check_terms(args: tuple, plan: Plan) -> tuple | None:
    """Terms for ``plan``'s guard that make :func:`_check_launch`'s checks, where those are
    only of arrays' rows and of arrays passed twice (``plan.owned``); else None. (``len()``
    is safe in them: the key's terms before them fix each array's type and rank.)"""
    if plan.checks and not plan.rows_only:
        return None
    for p in plan.rows_only:  # arrays of a type and rank that len() works on
        if not (type(args[p]) is np.ndarray or type(args[p]) in _FLAGGED) or args[p].ndim < 1:
            return None
    terms = [f"len(a{p}) >= rows" for p in plan.rows_only]
    if plan.written and len(args) > 1 and not plan.alias_free:
        if plan.owned is None:
            return None
        terms += [f"a{w} is not a{k}" for w in plan.written for k in plan.owned if k != w]
    return tuple(terms)


def _value_guard(name: str, a, part, env: dict) -> str | None:
    """The guard's term for array or scalar ``a`` (``name`` in the guard) to have the key
    part ``part`` again (:func:`_arg_key`'s cases); None for types only that knows."""
    t, tag = type(a), f"p{len(env)}"
    env[tag] = part
    if t is np.ndarray:  # part: (dtype, ndim, layout flags)
        return (f"type({name}) is ndarray and {name}.dtype is {tag}[0] and {name}.ndim == {part[1]} "
                f"and {name}.flags.num & {_LAYOUT} == {part[2]}")
    if t in _FLAGGED:  # part: (type, dtype, ndim, C-contiguous, F-contiguous)
        return (f"type({name}) is {tag}[0] and {name}.dtype is {tag}[1] and {name}.ndim == {part[2]} "
                f"and {name}._c_contiguous == {part[3]} and {name}._f_contiguous == {part[4]}")
    if t is int:  # part: the type, where one int64 holds it
        return f"type({name}) is int and {_INT_MIN} <= {name} <= {_INT_MAX}"
    if t in _BY_TYPE:  # part: the type
        return f"type({name}) is {tag}"
    if coherent(a):  # part: (type, dtype, ndim)
        return f"type({name}) is {tag}[0] and {name}.dtype is {tag}[1] and {name}.ndim == {part[2]}"
    return None


def bind(kernel: Kernel, extent, args: tuple, device) -> Launch:
    """Check and bind one launch of ``kernel`` over ``extent`` on ``device``."""
    if not isinstance(kernel, Kernel):
        raise ArgumentTypeError(f"{kernel!r} is not a hetflow kernel; decorate it with @hetflow.kernel")
    extent = (extent,) if type(extent) is int and extent >= 0 else normalize_extent(extent)
    ndim = len(extent)
    if len(args) < len(kernel.params) - ndim:
        args = with_defaults(kernel, ndim, args)
    repo = repository()
    recent = kernel.recent.get(device.id)  # (repo, ndim, guard, plan): see _guard
    if recent is not None and recent[0] is repo and recent[1] == ndim and recent[2](args, extent[0]):
        plan = recent[3]
        if not plan.guard_checks:  # (else the guard checked the extent and the aliasing too)
            _check_launch(kernel, extent, args, plan)
    else:
        args = _plain_arrays(args)
        key = _key(kernel.params, ndim, args)
        plan = kernel.plans.get((repo, device.id, ndim, key))
        if plan is None:
            plan = kernel.plans[(repo, device.id, ndim, key)] = _plan(kernel, ndim, args, device, repo)
            checks = _check_terms(args, plan)  # where the guard can make them, it does
            plan.guard, plan.guard_checks = _guard(args, key, checks or ()), checks is not None
        if plan.guard is not None:
            kernel.recent[device.id] = (repo, ndim, plan.guard, plan)
        _check_launch(kernel, extent, args, plan)
    if device.kind == "gpu":
        check_residence(kernel, device, plan, args)
    lowerings = plan.lowerings
    if not lowerings:
        return Launch(kernel, extent, device, plan, args, args)
    if plan.fresh:
        lowerings = _lowerings(kernel.params[ndim:], args)
        template, fill = _entry_template(lowerings)
    else:
        template, fill = plan.entry_template
    entry_args = list(template)
    for pos, k, root in fill:
        entry_args[pos] = args[k].root if root else args[k]
    return Launch(kernel, extent, device, plan, args, tuple(entry_args), lowerings)


def _plain_arrays(args: tuple) -> tuple:
    """``args`` with NumPy array subclasses (``np.matrix``, ``np.memmap``) as plain arrays
    over the same memory: compiled code indexes them as plain arrays anyway, and a copy to
    a GPU refuses a one-row matrix. (No guard takes a subclass: only launches that look
    their plan up come here.)"""
    if any(map(_subclass, args)):
        return tuple(np.asarray(a) if _subclass(a) else a for a in args)
    return args


def _subclass(a) -> bool:
    """A NumPy array subclass but a masked array (which :func:`_check_arguments` refuses)."""
    return type(a) is not np.ndarray and isinstance(a, np.ndarray) and not isinstance(a, np.ma.MaskedArray)


def check_residence(kernel: Kernel, device, plan: Plan, args: tuple) -> None:
    """ArgumentError unless every GPU array in ``args`` lives on ``device``, the GPU the
    launch runs on: a kernel on one GPU that reads another's memory faults (an illegal
    address, after which the process's CUDA context is lost). Only a machine with several
    GPUs checks (the simulator's one GPU, whose arrays tell no ordinal, too), and only
    launches with GPU arrays (coherent arrays give the launch's GPU its own copy)."""
    if not plan.device_arrays or len(gpus()) < 2:
        return
    for name, a in zip(plan.data, args):
        root = _views.root_of(a) if not isinstance(a, SCALARS) else None
        ordinal = _arrays.gpu_ordinal(root) if is_device_array(root) else None
        if ordinal is not None and ordinal != device.ordinal:
            raise ArgumentError(
                f"kernel {kernel.name!r} argument {name!r} is an array in the memory of gpu{ordinal}, "
                f"but the launch runs on {device.id}; run it on gpu{ordinal} (device='gpu{ordinal}', "
                f"or device=None: the GPU holding the data) or copy the array to {device.id}")


def _check_launch(kernel: Kernel, extent: tuple, args: tuple, plan: Plan) -> None:
    """Raise unless the arrays cover ``extent`` and no written one aliases another."""
    if plan.rows_only:  # the common check, kept cheap: each array has enough rows
        rows = extent[0]
        try:
            for pos in plan.rows_only:
                if len(args[pos]) < rows:  # len(): no shape tuple made
                    _check_extent(kernel, extent, args, plan.checks)
        except TypeError:  # a 0-d array has no len(): the full check says what is wrong
            _check_extent(kernel, extent, args, plan.checks)
    elif plan.checks and extent not in plan.fits:
        _check_extent(kernel, extent, args, plan.checks)
        if plan.views_only:  # views' extents are fixed by the key: this extent fits them always
            plan.fits.add(extent)
    if plan.written and len(args) > 1 and not plan.alias_free:
        owned = plan.owned
        if owned is None:
            _aliasing.check(kernel, extent, args, plan)
        else:  # arrays that own their memory overlap only when one is passed twice
            for w in plan.written:
                r = args[w]
                for k in owned:
                    if args[k] is r and k != w:
                        _aliasing.check(kernel, extent, args, plan)  # raises if that conflicts
                        break


def _entry_template(lowerings: tuple) -> tuple:
    """(template, fill): the entry arguments with each view's numbers (fixed by its
    lowering) in place, and ``(position, k, root)`` for each slot a launch fills from
    argument ``k`` (its root where ``root``): a view passes its root unless an earlier
    view passes it, then its numbers."""
    template, fill = [], []
    for k, low in enumerate(lowerings):
        if low is None or low.root_name is None:
            fill.append((len(template), k, low is not None))
            template.append(None)
        if low is not None:
            template.extend(low.params)
    return tuple(template), tuple(fill)


def _lowerings(names, args: tuple) -> tuple:
    """Per argument: its view's lowering (shared with every view of its structure), or None;
    views over the array an earlier view passes read that view's root (Lowering.sharing)."""
    found, first = [], {}
    for n, a in zip(names, args):
        if not _views.is_view(a):
            found.append(None)
            continue
        low = shared_lowering(a, f"{n}__p")
        passes = first.setdefault(id(a.root), n)
        found.append(low if passes == n else low.sharing(passes))
    return tuple(found)


def _owned(args: tuple) -> tuple | None:
    """Positions of the arrays when every argument is a scalar or a NumPy array owning its
    memory (flag 0x4 of the key); else None."""
    if all(isinstance(a, SCALARS) or type(a) is np.ndarray and a.flags.owndata for a in args):
        return tuple(k for k, a in enumerate(args) if type(a) is np.ndarray)
    return None


def _alias_free(args: tuple, written: tuple) -> bool:
    """Can no argument alias a written one in any launch of this plan? So when every array
    argument is a view whose root is no NumPy array (slices of one NumPy array share its
    memory under roots of their own) and no other argument passes a written view's
    root: the plan's key fixes which views share a root (see _key)."""
    if not all(_views.is_view(a) or isinstance(a, SCALARS) for a in args):
        return False
    if any(type(a.root) is np.ndarray for a in args if _views.is_view(a)):
        return False
    roots = [id(a.root) for a in args if _views.is_view(a)]
    return all(roots.count(id(args[k].root)) == 1 for k in written)


def _returns_value(kernel: Kernel) -> bool:
    """Does ``kernel``'s own body (not a function it defines) return a value? (False
    where its source cannot be read.)"""
    if not kernel.has_source:
        return False
    todo = list(kernel.definition.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Return) and node.value is not None:
            return True
        if not isinstance(node, (ast.FunctionDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))
    return False


def _plan(kernel: Kernel, ndim: int, args: tuple, device, repo) -> Plan:
    """Check the arguments, lower the views and find the executable: once per key."""
    data = _check_arguments(kernel, ndim, args)
    _check_dtypes(kernel, data, args, device)
    access = kernel.access(ndim)
    _check_scalars(kernel, data, args, access)
    # A scalar is passed by value: the kernel never writes the caller's (``range(n)``).
    written = tuple(k for k, name in enumerate(data) if access.writes(name) and not isinstance(args[k], SCALARS))
    if not written and _returns_value(kernel):
        raise ArgumentError(f"kernel {kernel.name!r} returns a value and writes no argument: a launch discards "
                            f"what its kernel returns, so it would do nothing; to combine the values, call "
                            f"hetflow.reduce(extent, {kernel.name}, *args, op=...), else write them into an "
                            f"output array")
    _check_writable(kernel, data, args, written)
    # Views share their lowerings with every view of the same structure; each view's own
    # root goes beside its lowering's params.
    lowerings = _lowerings(data, args)
    exe = repo.executable(kernel, device, ndim, {n: low for n, low in zip(data, lowerings) if low is not None})
    checks = _extent_checks(data, args, access)
    return Plan(data, access, checks, exe, written, entry_template=_entry_template(lowerings),
                buffers=any(coherent(_views.root_of(a)) for a in args if not isinstance(a, SCALARS)),
                host_arrays=host_arrays(args),
                device_arrays=any(is_device_array(_views.root_of(a)) for a in args if not isinstance(a, SCALARS)),
                lowerings=lowerings if any(low is not None for low in lowerings) else (),
                views_only=all(view for *_, view in checks),
                rows_only=(tuple(pos for pos, *_ in checks)
                           if all(axes == (0,) and not view for _, _, axes, view in checks) else ()),
                fresh=any(_views.is_view(a) and a.signature.key is None for a in args),
                alias_free=_alias_free(args, written), owned=_owned(args),
                scattered=tuple(data[k] for k in written if data[k] in access.scattered))
