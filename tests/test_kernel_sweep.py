"""Kernels no device compiles get one verdict everywhere: KernelCompileError naming the
kernel, the user's file and line, before any device compiles (the CUDA simulator runs
kernels as Python and would run them; Numba's CPU compiler gets some silently wrong).
Kernels that compile give NumPy's results (or the sequential loop's, for wavefronts)."""
import numba
import numpy as np
import pytest

import hetflow
from hetflow.errors import KernelCompileError

N = 4


def marker_line(marker: str, path: str = __file__) -> int:
    """The line of ``path`` (default: this file) that holds ``marker`` (in a comment) once."""
    with open(path) as f:
        found = [k for k, text in enumerate(f, 1) if f"# {marker}" in text]
    assert len(found) == 1, marker
    return found[0]


def _devices(gpu_device):
    return ["cpu0", gpu_device.id]


# -- writes into arrays no argument hands the kernel -----------------------------------
FROZEN = np.zeros(N)
STASH = np.zeros(N)


@hetflow.kernel
def writes_a_global(i, x):
    FROZEN[i] = x[i]  # global-write


def _captured(into):
    @hetflow.kernel
    def writes_a_captured(i, x):
        into[i] = x[i] + 1.0  # captured-write
    return writes_a_captured


@numba.njit
def stash(v, i, dst=STASH):
    dst[i] = v


@hetflow.kernel
def writes_a_default(i, x):
    stash(x[i], i)  # default-write


@hetflow.kernel
def reads_a_global(i, x, out):
    out[i] = x[i] + FROZEN[i]


@pytest.mark.parametrize("kernel, held, marker", [
    (writes_a_global, "'FROZEN', a NumPy array held by a global or captured variable", "global-write"),
    (_captured(np.zeros(N)), "'into', a NumPy array held by a global or captured variable", "captured-write"),
    (writes_a_default, "'stash(dst=...)', a NumPy array held by a function's default", "default-write"),
])
def test_a_write_into_an_array_no_argument_hands_is_refused_on_every_device(gpu_device, kernel, held, marker):
    for device in _devices(gpu_device):
        with pytest.raises(KernelCompileError) as info:
            hetflow.forall(N, kernel, np.arange(N, dtype=np.float64), device=device)
        assert str(info.value).startswith(f"kernel {kernel.name!r} ({__file__}:{marker_line(marker)}) cannot be "
                                          f"compiled for any device: it writes {held}")
        assert "pass the array to the kernel as an argument" in str(info.value)
    assert not FROZEN.any() and not STASH.any()


def test_a_global_array_only_read_gives_numpys_result(gpu_device):
    x = np.arange(N, dtype=np.float64)
    for device in _devices(gpu_device):
        out = np.zeros(N)
        hetflow.forall(N, reads_a_global, x, out, device=device)
        assert np.array_equal(out, x + FROZEN)


# -- calls of plain Python functions ----------------------------------------------------
def twice(v):
    return 2.0 * v


@numba.njit
def twice_compiled(v):
    return 2.0 * v


@hetflow.kernel
def calls_a_plain_function(i, x, out):
    out[i] = twice(x[i])  # plain-call-direct


@hetflow.kernel
def calls_a_plain_function_from_a_lambda(i, x, out):
    f = lambda v: twice(v)  # noqa: E731 # plain-call-in-lambda
    out[i] = f(x[i])


@hetflow.kernel
def calls_a_compiled_function(i, x, out):
    out[i] = twice_compiled(x[i])


@pytest.mark.parametrize("kernel, marker", [(calls_a_plain_function, "plain-call-direct"),
                                            (calls_a_plain_function_from_a_lambda, "plain-call-in-lambda")])
def test_a_call_of_a_plain_python_function_is_refused_on_every_device(gpu_device, kernel, marker):
    for device in _devices(gpu_device):
        with pytest.raises(KernelCompileError) as info:
            hetflow.forall(N, kernel, np.arange(N, dtype=np.float64), np.zeros(N), device=device)
        assert str(info.value) == (
            f"kernel {kernel.name!r} ({__file__}:{marker_line(marker)}) cannot be compiled for any device: it calls "
            f"'twice', a plain Python function, which compiled code cannot call; decorate 'twice' with "
            f"@numba.njit, or make it a kernel (@hetflow.kernel)")


# -- constructs refused when the kernel is made -------------------------------------------
def _yields(i, x, out):
    yield x[i]  # refused-yield


def _generator_expression(i, x, out):
    out[i] = sum(v for v in x)  # refused-generator


def _with(i, x, out):
    with open("/dev/null"):  # refused-with
        out[i] = x[i]


def _class(i, x, out):
    class Pair:  # refused-class
        pass
    out[i] = x[i]


def _global_statement(i, x, out):
    global FROZEN  # refused-global
    out[i] = x[i]


def _del(i, x, out):
    t = x[i]
    del t  # refused-del
    out[i] = 1.0


def _format_spec(i, x, out):
    s = f"{x[i]:.2f}"  # noqa: F841 # refused-format
    out[i] = x[i]


def _decorated_nested(i, x, out):
    @staticmethod  # refused-decorated
    def g(v):
        return v
    out[i] = x[i]


def _keyword_only_lambda(i, x, out):
    f = lambda v, *, s=2.0: v * s  # noqa: E731 # refused-kwonly-lambda
    out[i] = f(x[i])


def _default_array(i, x, out):
    def put(v, r=out):  # refused-default-array
        r[i] = v
    put(x[i])


def _default_index(i, x, out):
    def put(v, k=i, r=out):  # refused-default-index
        r[k] = v
    put(x[i])


def _default_returned(i, x, out):
    def whole(r=out):  # refused-default-returned
        return r
    whole()[i] = x[i]


def _keyword_only_kernel(i, x, *, out):  # refused-kwonly-kernel
    out[i] = x[i]


def _varargs_kernel(i, *arrays):  # refused-varargs-kernel
    arrays[1][i] = arrays[0][i]


REFUSED = [
    (_yields, "refused-yield", "it holds 'yield' (a generator)"),
    (_generator_expression, "refused-generator", "it holds a generator expression"),
    (_with, "refused-with", "it holds a 'with' statement"),
    (_class, "refused-class", "it holds a class definition"),
    (_global_statement, "refused-global", "it holds a 'global' or 'nonlocal' statement"),
    (_del, "refused-del", "it deletes a name ('del')"),
    (_format_spec, "refused-format", "an f-string in it has a format spec"),
    (_decorated_nested, "refused-decorated", "nested function 'g' in it is decorated"),
    (_keyword_only_lambda, "refused-kwonly-lambda", "a lambda in it has keyword-only parameters"),
    (_default_array, "refused-default-array",
     "the default of parameter 'r' of nested function 'put' in it is not a constant (out)"),
    (_default_index, "refused-default-index",
     "the default of parameter 'k' of nested function 'put' in it is not a constant (i)"),
    (_default_returned, "refused-default-returned",
     "the default of parameter 'r' of nested function 'whole' in it is not a constant (out)"),
    (_keyword_only_kernel, "refused-kwonly-kernel", "its parameters include *args, **kwargs or keyword-only"),
    (_varargs_kernel, "refused-varargs-kernel", "its parameters include *args, **kwargs or keyword-only"),
]


@pytest.mark.parametrize("fn, marker, what", REFUSED, ids=[m for _, m, _ in REFUSED])
def test_what_no_device_compiles_is_refused_when_the_kernel_is_made(fn, marker, what):
    with pytest.raises(KernelCompileError) as info:
        hetflow.kernel(fn)
    assert str(info.value).startswith(
        f"kernel {fn.__name__!r} ({__file__}:{marker_line(marker)}) cannot be compiled for any device: {what}")


def test_a_kernel_without_source_taking_keyword_only_parameters_is_refused():
    ns = {}
    exec("def k(i, x, *, out):\n    out[i] = x[i]\n", ns)
    with pytest.raises(KernelCompileError, match=r"^kernel 'k' \(<string>:1\) cannot be compiled for any "
                                                 r"device: its parameters include \*args"):
        hetflow.kernel(ns["k"])


@hetflow.kernel
def constant_defaults(i, x, out):
    def scaled(v, s=2.0, t=(1.0, -1.0)):
        return v * s + t[0] + t[1]
    out[i] = scaled(x[i])


@pytest.mark.parametrize("kernel", [calls_a_compiled_function, constant_defaults])
def test_calls_of_numba_functions_and_nested_ones_with_constant_defaults_give_numpys_result(kernel, gpu_device):
    x = np.arange(N, dtype=np.float64)
    for device in _devices(gpu_device):
        out = np.zeros(N)
        hetflow.forall(N, kernel, x, out, device=device)
        assert np.array_equal(out, 2.0 * x)


# -- wavefront: compile errors name the user's line -------------------------------------
@hetflow.kernel
def bad_sweep(i, j, a, b):
    if i > 0 and j > 0:
        v = (a[i - 1, j] +
             b[i, j - 1])
        a[i, j] = v + "x"  # wavefront-bad-line


@hetflow.kernel
def bad_merged_sweep(i, j, a, b):
    v = (b[i, j] *
         2.0)
    a[i, j] = v + "x"  # wavefront-merged-bad-line


@pytest.mark.parametrize("kernel, merged, marker", [(bad_sweep, False, "wavefront-bad-line"),
                                                    (bad_merged_sweep, True, "wavefront-merged-bad-line")])
def test_a_wavefront_compile_error_names_the_users_line(kernel, merged, marker):
    a = np.ones((6, 6))
    with pytest.raises(KernelCompileError) as info:
        hetflow.wavefront(a.shape, kernel, a, a if merged else a.copy(), device="cpu0")
    assert str(info.value).startswith(f"kernel {kernel.name!r} ({__file__}:{marker_line(marker)}) failed to compile "
                                      f"for cpu0")


@hetflow.kernel
def prefixed_names(i, j, a, b, bb):
    a[i, j] = b[i, j] * 2.0 + bb[i, j] + b[i, j] ** 2


def test_a_wavefront_over_one_array_twice_renames_only_that_name(gpu_device):
    """``b`` passed the array ``a`` is: merged into ``a`` in place; ``bb`` stays."""
    rng = np.random.default_rng(11)
    start, other = rng.random((7, 5)), rng.random((7, 5))
    want = start * 2.0 + other + start ** 2
    for device in _devices(gpu_device):
        a = start.copy()
        hetflow.wavefront(a.shape, prefixed_names, a, a, other, tile=(3, 2), device=device)
        assert np.allclose(a, want, rtol=1e-15, atol=0)
