"""Access analysis sees every write and read a kernel makes, wherever it makes them:
through views the kernel makes (``a.T``, ``a.reshape(n)``, ``np.ravel(a)``, ``a.flat``),
loops over an array, tuples, conditional expressions, the walrus, lambdas and local
functions, the functions and kernels it calls with a row, ufuncs' and NumPy's outputs.

An unseen write is never copied back from a GPU and is lost where devices split a launch
by rows; an index it takes for the launch index when it is not (a nested function's
parameter ``i``) splits what must not be split; an unseen read lets a write to the same
array race (``forall(k, a, a)``), and lets a captured graph reorder launches. Each kernel
runs on the CPU, the simulated GPU and both at once, against NumPy."""
import logging
import warnings

import numba
import numpy as np
import pytest

import hetflow
from test_ir_graph import add, scale

N = 6
WHERE = ["on-cpu", "on-a-gpu", "co-executed"]  # not "gpu": the real-GPU mark


def _device(where, gpu_device):
    return {"on-cpu": "cpu0", "on-a-gpu": gpu_device.id, "co-executed": ["cpu0", gpu_device.id]}[where]


def _run(kernel, device, *args):
    split = dict(schedule="static", shares=[0.5, 0.5]) if isinstance(device, list) else {}
    hetflow.forall(N, kernel, *args, device=device, **split)


# -- writes through a view the kernel makes ------------------------------------------------------
@hetflow.kernel
def through_transpose(i, a, b):
    t = a.T
    t[i, 0] = b[i]


@hetflow.kernel
def through_attribute(i, a, b):
    a.T[i, 0] = b[i]


@hetflow.kernel
def through_reshape(i, a, b):
    a.reshape(a.size)[2 * i] = b[i]


@hetflow.kernel
def through_ravel(i, a, b):
    np.ravel(a)[2 * i] = b[i]


@hetflow.kernel
def through_flat(i, a, b):
    a.flat[2 * i] = b[i]


@hetflow.kernel
def through_a_loop(i, a, b):
    for k, row in enumerate(a):
        if k == i:
            row[0] = b[i]


@hetflow.kernel
def through_a_tuple(i, a, b):
    (a, b)[0][i, 0] = b[i]


@hetflow.kernel
def through_a_choice(i, a, b):
    (a if b[i] >= 0 else a[:, ::-1])[i, 0] = b[i]


@hetflow.kernel
def through_the_walrus(i, a, b):
    (o := a)[i, 0] = b[i]  # noqa: F841 (the store goes through the name the walrus binds)


@hetflow.kernel
def through_a_lambda(i, a, b):
    first = lambda k: a[k, 0:1]  # noqa: E731
    first(i)[0] = b[i]


@hetflow.kernel
def fill_a_row(i, a, b):
    a[i].fill(b[i])


@hetflow.kernel
def setrow(j, r, v):
    r[j] = v


@hetflow.kernel
def kernel_on_a_row(i, a, b):
    setrow(1, a[i], b[i])


@numba.njit
def clear(r, v):
    for k in range(r.shape[0]):
        r[k] = v


@hetflow.kernel
def function_on_a_row(i, a, b):
    clear(a[i], b[i])


@hetflow.kernel
def local_function_on_a_row(i, a, b):
    def put(r, v):
        r[0] = v
    put(a[i], b[i])


def _column(k):
    def want(a, b):
        a[:, k] = b
        return a
    return want


def _first_column_of_the_transpose(a, b):
    a[0, :] = b
    return a


VIEWS = [  # kernel, shape of a, what the kernel leaves in a given a and b (N,)
    (through_transpose, (2, N), _first_column_of_the_transpose),
    (through_attribute, (2, N), _first_column_of_the_transpose),
    (through_reshape, (N, 2), _column(0)),
    (through_ravel, (N, 2), _column(0)),
    (through_flat, (N, 2), _column(0)),
    (through_a_loop, (N, 2), _column(0)),
    (through_a_tuple, (N, 2), _column(0)),
    (through_a_choice, (N, 2), _column(0)),
    (through_the_walrus, (N, 2), _column(0)),
    (through_a_lambda, (N, 2), _column(0)),
    (fill_a_row, (N, 2), lambda a, b: np.repeat(b[:, None], 2, axis=1)),
    (kernel_on_a_row, (N, 2), _column(1)),
    (function_on_a_row, (N, 2), lambda a, b: np.repeat(b[:, None], 2, axis=1)),
    (local_function_on_a_row, (N, 2), _column(0)),
]


@pytest.mark.parametrize("kernel", [k for k, *_ in VIEWS], ids=lambda k: k.name)
def test_a_write_through_a_view_the_kernel_makes_counts_as_written(kernel):
    assert kernel.access(1).writes("a")


@pytest.mark.simgpu
@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("kernel, shape, want", VIEWS, ids=[k.name for k, *_ in VIEWS])
def test_a_write_through_a_view_the_kernel_makes_reaches_the_host(gpu_device, where, kernel, shape, want):
    # Before, a GPU never copied these writes back: a kept its old values.
    rng = np.random.default_rng(5)
    a, b = rng.random(shape), rng.random(N)
    expected = want(a.copy(), b)
    _run(kernel, _device(where, gpu_device), a, b)
    np.testing.assert_array_equal(a, expected)


# -- outputs of NumPy's functions and ufuncs ---------------------------------------------------
@hetflow.kernel
def ufunc_into_a_row(i, a, b):
    np.add(b[i], 1.0, a[i])


@hetflow.kernel
def sum_into_a_row(i, a, b):
    np.cumsum(b[i], 0, None, a[i])


def test_a_ufunc_or_numpy_output_is_written_and_its_inputs_only_read():
    for kernel in (ufunc_into_a_row, sum_into_a_row):
        access = kernel.access(1)
        assert access.modes == {"a": "rw", "b": "r"} and access.rows == {"a", "b"}, kernel.name


@pytest.mark.simgpu
@pytest.mark.parametrize("where", WHERE)
def test_a_ufunc_output_row_reaches_the_host(gpu_device, where):
    b = np.random.default_rng(6).random((N, 2))
    a = np.zeros((N, 2))
    _run(ufunc_into_a_row, _device(where, gpu_device), a, b)
    np.testing.assert_array_equal(a, b + 1.0)


# -- an index that is not the launch index ------------------------------------------------------
@hetflow.kernel
def index_named_anew(i, a, b):
    def put(i):  # this i is put's own: a[i] is not the launch's row
        a[i] = b[a.shape[0] - 1 - i]
    put(a.shape[0] - 1 - i)


@hetflow.kernel
def index_named_anew_by_a_lambda(i, a, b):
    first = lambda i: b[i]  # noqa: E731
    a[i] = first(0)


def test_a_nested_function_parameter_named_like_the_launch_index_is_not_it():
    for kernel in (index_named_anew, index_named_anew_by_a_lambda):
        access = kernel.access(1)
        assert access.writes("a") and "b" not in access.rows and "b" not in access.identity, kernel.name
    assert "a" not in index_named_anew.access(1).rows
    assert "a" in index_named_anew_by_a_lambda.access(1).rows  # a[i] outside the lambda is


@pytest.mark.simgpu
@pytest.mark.parametrize("where", WHERE)
def test_a_nested_function_parameter_named_like_the_launch_index_gives_numpys_result(gpu_device, where):
    # Before, co-executed launches split a and b by rows and each device lost the other's.
    device = _device(where, gpu_device)
    b = np.random.default_rng(7).random(N)
    a = np.zeros(N)
    _run(index_named_anew, device, a, b)
    np.testing.assert_array_equal(a, b[::-1])
    a = np.zeros(N)
    _run(index_named_anew_by_a_lambda, device, a, b)
    np.testing.assert_array_equal(a, np.full(N, b[0]))


# -- reads of a whole array: the same array passed twice ----------------------------------------
@hetflow.kernel
def total(i, x, out):
    out[i] = np.sum(x)


@hetflow.kernel
def total_by_a_loop(i, x, out):
    s = 0.0
    for v in x:
        s += v
    out[i] = s


@hetflow.kernel
def first_row(i, x, out):
    out[i] = x


@pytest.mark.parametrize("kernel", [total, total_by_a_loop])
def test_a_whole_array_read_by_a_call_or_a_loop_is_read(kernel):
    access = kernel.access(1)
    assert access.reads("x") and "x" not in access.rows and "x" not in access.aligned


@pytest.mark.parametrize("kernel", [total, total_by_a_loop])
def test_an_array_read_whole_and_written_through_another_argument_is_refused(kernel):
    # Before, x counted as unused: forall(k, a, a) ran in place, each out[i] summing
    # what the earlier indices had already overwritten.
    a = np.arange(1.0, N + 1)
    with pytest.raises(hetflow.errors.ShapeError, match=rf"kernel '{kernel.name}' writes argument 'out' .* "
                                                         r"and reads argument 'x' .* overlap"):
        hetflow.forall(N, kernel, a, a, device="cpu0")
    np.testing.assert_array_equal(a, np.arange(1.0, N + 1))
    hetflow.forall(N, kernel, a, a, device="cpu0", snapshot=True)
    np.testing.assert_array_equal(a, np.full(N, N * (N + 1) / 2))


def test_an_array_assigned_whole_is_read_not_written():
    # Before, x counted as read and written anywhere (first_row could not co-execute).
    assert first_row.access(1).modes == {"x": "r", "out": "w"}
    x, out = np.array([1.0, 2.0]), np.zeros((N, 2))
    hetflow.forall(N, first_row, x, out, device="cpu0")
    np.testing.assert_array_equal(out, np.tile(x, (N, 1)))


# -- a part updated in place through a local -----------------------------------------------------
@hetflow.kernel
def bump(i, w, y):
    cell = w[i:i + 1]  # a view: += updates w in place
    cell += y[i]


def test_a_part_updated_in_place_counts_as_written():
    assert bump.access(1).modes == {"w": "rw", "y": "r"}


def test_a_graph_keeps_the_order_of_a_part_updated_in_place():
    # Before, w's update was unseen: the graph fused the first and last launches and
    # ran them before it.
    def program(x, w, y):
        hetflow.forall(N, scale, 2.0, x, y)  # y = 2x
        hetflow.forall(N - 1, bump, w, y)    # w[:N-1] += y
        hetflow.forall(N, add, y, w, x)      # x = y + w

    start = np.arange(1.0, N + 1)
    eager = [start.copy(), np.ones(N), np.zeros(N)]
    program(*eager)
    captured = [start.copy(), np.ones(N), np.zeros(N)]
    with hetflow.graph() as g:
        program(*captured)
    g.run()
    want = 2 * start + 1
    want[:N - 1] += 2 * start[:N - 1]
    np.testing.assert_array_equal(eager[0], want)
    np.testing.assert_array_equal(captured[0], want)


# -- what keeps its precision ---------------------------------------------------------------------
@numba.njit
def mix(p, q):
    return 0.75 * p + 0.25 * q


@hetflow.kernel
def mixes(i, x, y, out):
    out[i] = mix(x[i], y[i])


@hetflow.kernel
def accumulates(i, x, out):
    acc = x[i]  # a number where x is 1-D, a row of x where it is 2-D: counts as written there
    acc += 1.0
    out[i] = acc


def test_elements_handed_to_a_function_that_only_reads_them_stay_read():
    access = mixes.access(1)
    assert access.modes == {"x": "r", "y": "r", "out": "w"} and access.aligned == {"x", "y", "out"}


def test_an_accumulator_taken_from_an_element_keeps_its_row():
    access = accumulates.access(1)
    assert access.writes("x") and access.rows == {"x", "out"} and access.aligned == {"x", "out"}
    assert not access.scattered


@pytest.mark.simgpu
def test_an_accumulator_taken_from_an_element_co_executes(gpu_device, caplog):
    x, out = np.arange(float(N)), np.zeros(N)
    with caplog.at_level(logging.WARNING), warnings.catch_warnings():
        warnings.simplefilter("error")
        report = hetflow.forall(N, accumulates, x, out, device=["cpu0", gpu_device.id], schedule="static",
                                shares=[0.5, 0.5])
    assert not caplog.records and {w.device_id for w in report.workers if w.indices} == {"cpu0", gpu_device.id}
    np.testing.assert_array_equal(out, x + 1.0)
    np.testing.assert_array_equal(x, np.arange(float(N)))


def test_scalars_used_in_arithmetic_keep_no_mode():
    assert scale.access(1).modes == {"a": "", "x": "r", "out": "w"}
    assert add.access(1).modes == {"x": "r", "y": "r", "out": "w"}
