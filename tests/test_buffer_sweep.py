"""Coherent arrays (hetflow.array / Buffer) and views over them behave as NumPy arrays and
NumPy slicing do: the array protocol, len, iteration, truth value, copies, host reads and
writes between launches on cpu0, the (simulated) GPU and both, and hetflow's errors where
NumPy would raise its own. Oracles: NumPy, and NumPy programs run sequentially."""
import copy
import pickle
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hetflow
from hetflow import section
from hetflow.errors import ArgumentError, ArgumentTypeError, IndexOutOfBoundsError, ShapeError
from view_chains import chains

SLOW = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@hetflow.kernel
def inc(i, x):
    x[i] = x[i] + 1.0


@hetflow.kernel
def inc_rows(i, j, x):
    x[i, j] = x[i, j] + 1.0


def _on_gpu(data, gpu_device):
    """A hetflow array holding ``data`` + 1, current only on the GPU."""
    a = hetflow.array(data)
    hetflow.forall(a.shape, inc if a.ndim == 1 else inc_rows, a, device=gpu_device.id)
    assert a.valid == (gpu_device.id,)
    return a


# -- the array protocol, len, iteration, truth value ---------------------------------------------
@pytest.mark.simgpu
def test_array_protocol_copy_false_refuses_a_conversion(gpu_device):
    a = _on_gpu(np.arange(4.0), gpu_device)
    with pytest.raises(ArgumentError, match=r"<hetflow Buffer \(4,\) float64 .*> as float32 needs a copy, "
                                            r"but copy=False was asked"):
        np.asarray(a, dtype=np.float32, copy=False)
    same = np.asarray(a, copy=False)  # no conversion: the host copy itself, no copy made
    assert np.shares_memory(same, np.asarray(a)) and not same.flags.writeable
    np.testing.assert_array_equal(same, np.arange(4.0) + 1)
    converted = np.asarray(a, dtype=np.float32)
    assert converted.dtype == np.float32 and converted.tolist() == [1.0, 2.0, 3.0, 4.0]


def test_a_zero_d_buffer_has_no_len_and_no_iteration():
    a = hetflow.array(2.5)
    with pytest.raises(ArgumentTypeError, match=r"len\(\) of a 0-d Buffer <hetflow Buffer \(\) float64"):
        len(a)
    with pytest.raises(ArgumentTypeError, match=r"iteration over a 0-d Buffer <hetflow Buffer \(\) float64"):
        list(a)  # NumPy raises too; it was an empty list
    with pytest.raises(TypeError):  # NumPy's own behaviour, the oracle
        list(np.array(2.5))


@pytest.mark.simgpu
def test_iteration_yields_numpy_rows_of_the_current_contents(gpu_device):
    data = np.arange(6.0).reshape(3, 2)
    a = _on_gpu(data, gpu_device)
    rows = list(a)
    assert len(rows) == len(a) == 3
    for got, want in zip(rows, data + 1):
        np.testing.assert_array_equal(got, want)
    assert [float(x) for x in _on_gpu(np.arange(3.0), gpu_device)] == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("data", [[0.0], [3.0], 0.0, 1, [[0]], [False], [True]])
def test_truth_value_of_one_element_is_numpy_s(data):
    assert bool(hetflow.array(data)) is bool(np.array(data))


@pytest.mark.parametrize("data, size", [([0.0, 1.0], 2), (np.zeros(0), 0), (np.ones((2, 2)), 4)])
def test_truth_value_of_other_sizes_is_ambiguous(data, size):
    with pytest.raises(ValueError):  # NumPy's meaning, the oracle
        bool(np.array(data))
    with pytest.raises(ArgumentError, match=rf"the truth value of a Buffer of {size} elements <hetflow Buffer "
                                            r".*> is ambiguous"):
        bool(hetflow.array(data))


def test_size_and_astype_as_numpy():
    data = np.arange(12, dtype=np.int64).reshape(3, 4) - 5
    a = hetflow.array(data)
    assert a.size == data.size and a.shape == data.shape and a.ndim == data.ndim and a.dtype == data.dtype
    f = a.astype(np.float32)
    assert isinstance(f, hetflow.Buffer) and f.dtype == np.float32
    np.testing.assert_array_equal(f.numpy(), data.astype(np.float32))
    f.write(0.0)  # a new array: the original keeps its contents
    np.testing.assert_array_equal(a.numpy(), data)


# -- copies -------------------------------------------------------------------------------------------
@pytest.mark.simgpu
@pytest.mark.parametrize("duplicate", [copy.copy, copy.deepcopy, lambda a: pickle.loads(pickle.dumps(a))],
                         ids=["copy", "deepcopy", "pickle"])
def test_copies_are_independent_arrays(gpu_device, duplicate):
    """A copy shared the host and device copies, each with its own validity: the copy's
    host write was overwritten from the original's GPU copy (copy.copy), or it raised."""
    a = _on_gpu(np.arange(4.0), gpu_device)
    b = duplicate(a)
    assert isinstance(b, hetflow.Buffer) and b is not a
    b.write(np.zeros(4))
    np.testing.assert_array_equal(a.numpy(), np.arange(4.0) + 1)
    hetflow.forall(4, inc, b, device=gpu_device.id)
    hetflow.forall(4, inc, a, device="cpu0")
    np.testing.assert_array_equal(b.numpy(), np.ones(4))
    np.testing.assert_array_equal(a.numpy(), np.arange(4.0) + 2)


# -- host access: hetflow's errors where NumPy raises its own ------------------------------------
def test_a_buffer_by_shape_needs_a_numeric_dtype():
    for dtype, got in ((object, "objects"), ("U2", "dtype <U2"), ([("a", "f8")], r"dtype \[\('a', '<f8'\)\]")):
        with pytest.raises(ArgumentError, match=r"Buffer of shape \(3,\) needs numeric data \(bool, integer, "
                                                rf"float or complex\), got {got}"):
            hetflow.Buffer(3, dtype=dtype)
    assert hetflow.Buffer(3, dtype=np.complex64).numpy().dtype == np.complex64


def test_host_access_raises_hetflow_errors():
    a = hetflow.array(np.arange(4.0))
    with pytest.raises(IndexOutOfBoundsError, match=r"<hetflow Buffer \(4,\) float64 valid on host>\[10\]: "
                                                    r"index 10 is out of bounds"):
        a[10]
    with pytest.raises(IndexOutOfBoundsError, match=r"\[\(0, 1\)\]: too many indices"):
        a[0, 1] = 1.0
    with pytest.raises(ArgumentTypeError, match=r"\[0\]: could not convert string to float: 'x'"):
        a[0] = "x"
    with pytest.raises(ArgumentTypeError, match=r"\[slice\(0, 2, None\)\]: could not broadcast"):
        a[0:2] = [1.0, 2.0, 3.0]
    with pytest.raises(ArgumentTypeError, match=r"cannot write str data into <hetflow Buffer \(4,\) float64 valid "
                                                r"on host>: could not convert string to float: 'abc'"):
        a.write("abc")
    with pytest.raises(ArgumentTypeError, match=r"cannot write list data into <hetflow Buffer .*inhomogeneous"):
        a.write([[1.0], [1.0, 2.0]])
    with pytest.raises(ArgumentTypeError, match=r"cannot write list data into .*: cannot convert float NaN to integer"):
        hetflow.array([1, 2]).write([np.nan, 1.0])
    np.testing.assert_array_equal(a.numpy(), np.arange(4.0))  # nothing was written
    with pytest.raises(ArgumentError, match=r"Buffer cannot hold list data: .*inhomogeneous"):
        hetflow.array([[1.0], [1.0, 2.0]])
    with pytest.raises(ArgumentError, match=r"Buffer cannot hold list data: could not convert string to float"):
        hetflow.array(["1.5", "x"], dtype=float)
    with pytest.raises(ArgumentError, match=r"Buffer shape \(4611686018427387904,\) of float64: array is too big"):
        hetflow.Buffer(2**62)


@pytest.mark.simgpu
def test_cupy_of_a_cpu_device_is_refused(gpu_device):
    a = _on_gpu(np.arange(3.0), gpu_device)
    with pytest.raises(ArgumentError, match=r"<hetflow Buffer \(3,\) float64 valid on gpu0>\.cupy\('cpu0'\): "
                                            r"cpu0 is no GPU"):
        a.cupy("cpu0")
    np.testing.assert_array_equal(a.numpy(), [1.0, 2.0, 3.0])


@pytest.mark.simgpu
def test_dlpack_asked_for_the_cpu_hands_out_the_host_copy(gpu_device):
    a = _on_gpu(np.arange(4.0), gpu_device)
    host = np.from_dlpack(a, device="cpu")
    assert a.valid == ("host",)  # the host copy itself, which the consumer may write
    host[0] = 10.0
    hetflow.forall(4, inc, a, device=gpu_device.id)
    np.testing.assert_array_equal(a.numpy(), [11.0, 3.0, 4.0, 5.0])


# -- views over buffers -----------------------------------------------------------------------------------
@pytest.mark.parametrize("make", [np.array, hetflow.array], ids=["numpy", "buffer"])
def test_view_writes_raise_hetflow_errors_and_write_nothing(make):
    root = make(np.arange(12.0).reshape(3, 4))
    view = section(root, (1, 1), (2, 2))
    with pytest.raises(ShapeError, match=r"section view assign: values of shape \(3,\) do not broadcast to "
                                         r"the view's shape \(2, 2\)"):
        view.assign([1.0, 2.0, 3.0])
    with pytest.raises(ArgumentTypeError, match=r"section view assign: values cannot become float64: "
                                                r"could not convert string to float: 'x'"):
        view.assign("x")
    with pytest.raises(ArgumentTypeError, match=r"setting an array element with a sequence"):
        view[0, 0] = [1.0, 2.0]
    np.testing.assert_array_equal(np.asarray(root), np.arange(12.0).reshape(3, 4))
    view.assign([[-1.0], [-2.0]])  # broadcast, as NumPy's a[1:3, 1:3] = [[-1], [-2]]
    want = np.arange(12.0).reshape(3, 4)
    want[1:3, 1:3] = [[-1.0], [-2.0]]
    np.testing.assert_array_equal(np.asarray(root), want)


@hetflow.kernel
def twice_plus_one_1(i, out, x):
    out[i] = x[i] * 2.0 + 1.0


@hetflow.kernel
def twice_plus_one_2(i, j, out, x):
    out[i, j] = x[i, j] * 2.0 + 1.0


@hetflow.kernel
def twice_plus_one_3(i, j, k, out, x):
    out[i, j, k] = x[i, j, k] * 2.0 + 1.0


@hetflow.kernel
def thrice_less_one_1(i, v):
    v[i] = v[i] * 3.0 - 1.0


@hetflow.kernel
def thrice_less_one_2(i, j, v):
    v[i, j] = v[i, j] * 3.0 - 1.0


@hetflow.kernel
def thrice_less_one_3(i, j, k, v):
    v[i, j, k] = v[i, j, k] * 3.0 - 1.0


READ = {1: twice_plus_one_1, 2: twice_plus_one_2, 3: twice_plus_one_3}
WRITE = {1: thrice_less_one_1, 2: thrice_less_one_2, 3: thrice_less_one_3}
# Operators whose views kernels lower without a user index function (a co_map's must compile).
LAUNCH_OPS = ("project", "cshift", "interior", "transpose", "section", "partition", "tile")


@pytest.mark.simgpu
@settings(max_examples=80, **SLOW)
@given(chains(ops=LAUNCH_OPS), st.sampled_from(["cpu0", "gpu", "both"]))
def test_random_view_chains_over_a_buffer_in_launches_match_numpy(gpu_device, chain, where):
    """Each chain (view_chains: NumPy's meaning as the flat root indices ``ids``) over a
    Buffer: read into another Buffer, then written through in place, on each device."""
    root, view, ids, names = chain
    device = {"cpu0": "cpu0", "gpu": gpu_device.id, "both": ["cpu0", gpu_device.id]}[where]
    flat = root.reshape(-1).copy()
    a = hetflow.array(root)
    v = view.on_root(a)
    np.testing.assert_array_equal(v.numpy(), flat[ids])
    if not 0 < v.rank <= 3 or not ids.size:
        return
    out = hetflow.array(np.zeros(ids.shape))
    hetflow.forall(tuple(v.extent), READ[v.rank], out, v, device=device)
    np.testing.assert_array_equal(out.numpy(), flat[ids] * 2.0 + 1.0)
    hetflow.forall(tuple(v.extent), WRITE[v.rank], v, device=device)
    want = flat.copy()
    want[ids.reshape(-1)] = flat[ids.reshape(-1)] * 3.0 - 1.0
    np.testing.assert_array_equal(a.numpy().reshape(-1), want)
    idx = tuple(n // 2 for n in v.extent)  # one element, read through the chain again
    assert v[idx] == want[ids[idx]]


@hetflow.kernel
def inc3(i, j, k, x):
    x[i, j, k] = x[i, j, k] + 1.0


INC = {1: inc, 2: inc_rows, 3: inc3}


@pytest.mark.simgpu
@settings(max_examples=60, **SLOW)
@given(chains(ops=LAUNCH_OPS), st.data())
def test_random_view_chains_over_a_buffer_on_the_host_between_gpu_launches(gpu_device, chain, data):
    """Host reads, element writes and assign through a chain over a Buffer current only on
    the GPU see the GPU's contents, and the next GPU launch sees what they wrote."""
    root, view, ids, names = chain
    a = hetflow.array(root)
    hetflow.forall(root.shape, INC[root.ndim], a, device=gpu_device.id)
    want = root.reshape(-1) + 1.0
    v = view.on_root(a)
    np.testing.assert_array_equal(v.numpy(), want[ids])
    if ids.size:
        idx = tuple(data.draw(st.integers(0, n - 1)) for n in v.extent)
        assert v[idx] == want[ids[idx]]
        v[idx] = -7.0
        want[ids[idx]] = -7.0
    v.assign(ids * 0.5)
    want[ids.reshape(-1)] = ids.reshape(-1) * 0.5
    hetflow.forall(root.shape, INC[root.ndim], a, device=gpu_device.id)
    np.testing.assert_array_equal(a.numpy().reshape(-1), want + 1.0)


# -- random programs of host accesses and launches -------------------------------------------------------
N = 4

step = st.one_of(
    st.tuples(st.just("launch"), st.sampled_from(["cpu0", "gpu", "both"])),
    st.tuples(st.just("assign"), st.integers(0, N - 1), st.integers(1, N), st.floats(-4, 4, allow_nan=False)),
    st.tuples(st.just("element"), st.integers(0, N - 1), st.integers(0, N - 1), st.floats(-4, 4, allow_nan=False)),
    st.tuples(st.just("dlpack"), st.integers(0, N - 1), st.floats(-4, 4, allow_nan=False)),
    st.tuples(st.just("gpu write"), st.integers(0, N - 1), st.floats(-4, 4, allow_nan=False)),
    st.tuples(st.just("rows"),),
    st.tuples(st.just("copy"),),
)


@pytest.mark.simgpu
@settings(max_examples=60, **SLOW)
@given(st.lists(step, min_size=1, max_size=6))
def test_random_host_accesses_and_launches_match_numpy(gpu_device, program):
    """Writes through views, DLPack, the GPU copy itself (``cupy``), iteration and copies,
    between launches on cpu0, the GPU and both, against the same program on NumPy."""
    model = np.arange(N * N, dtype=np.float64).reshape(N, N)
    a = hetflow.array(model)
    devices = {"cpu0": "cpu0", "gpu": gpu_device.id, "both": ["cpu0", gpu_device.id]}
    for op, *args in program:
        if op == "launch":
            hetflow.forall((N, N), inc_rows, a, device=devices[args[0]])
            model += 1.0
        elif op == "assign":
            row, rows, value = args
            rows = min(rows, N - row)
            section(a, (row, 1), (rows, N - 1)).assign(value)
            model[row:row + rows, 1:] = value
        elif op == "element":
            i, j, value = args
            section(a, (i, 0), (1, N))[0, j] = value
            model[i, j] = value
        elif op == "dlpack":
            np.from_dlpack(a, device="cpu")[args[0]] = args[1]
            model[args[0]] = args[1]
        elif op == "gpu write":
            a.cupy(gpu_device.id)[args[0], 0] = args[1]  # the simulator's device array
            model[args[0], 0] = args[1]
        elif op == "rows":
            for got, want in zip(a, model):
                np.testing.assert_array_equal(got, want)
        else:  # go on with a copy; writing the original must not disturb it
            a, original = copy.copy(a), a
            original.write(-100.0)
            hetflow.forall((N, N), inc_rows, original, device=gpu_device.id)
    np.testing.assert_array_equal(a.numpy(), model)


@pytest.mark.parametrize("dtype, data", [(np.int32, np.array([1, 2, 3, 4], dtype=object)),
                                         (np.float64, ["1.5", "2", "3", "4"]),
                                         (np.int32, [True, False, True, False]), (np.int32, 2.75)])
def test_write_converts_as_numpy_assignment_does(dtype, data):
    a, want = hetflow.array(np.zeros(4, dtype=dtype)), np.zeros(4, dtype=dtype)
    a.write(data)
    want[...] = data
    assert a.dtype == dtype
    np.testing.assert_array_equal(a.numpy(), want)


@pytest.mark.parametrize("convert", [float, int, complex])
def test_a_0d_buffer_converts_to_a_scalar_as_numpy_does(convert):
    data = np.array(2.5)
    assert convert(hetflow.array(data)) == convert(data)
    for shape in ((1, 1), (2,)):
        with pytest.raises(TypeError):  # NumPy's verdict
            convert(np.ones(shape))
        with pytest.raises(ArgumentTypeError, match=rf"{convert.__name__}\(\) of a Buffer of shape "
                                                    + re.escape(str(shape)) + r".*only a 0-d Buffer converts"):
            convert(hetflow.array(np.ones(shape)))
