"""Unusual but legal NumPy inputs at the call sites: each works and matches NumPy, or is
refused before anything runs by a hetflow error naming the argument and what is wrong.

Non-native byte order, element types compiled code has no type for (float16 on a CPU,
long double, unstructured void, objects), masked arrays, NumPy subclasses, and scalars
where a kernel subscripts an array. Oracle: NumPy on the same data.
"""
import numpy as np
import pytest

import hetflow
from hetflow import interior, library
from hetflow.errors import ArgumentTypeError, KernelCompileError

CO = ["cpu0", "gpu0"]
ON_GPU = [pytest.param("gpu0", marks=pytest.mark.simgpu), pytest.param(CO, marks=pytest.mark.simgpu, id="cpu0+gpu0")]
BIG_ENDIAN = np.dtype(">f8")


@hetflow.kernel
def twice(i, x, out):
    out[i] = 2.0 * x[i]


@hetflow.kernel
def copy2(i, j, x, out):
    out[i, j] = x[i, j]


@hetflow.kernel
def larger(a, b):
    return a if a >= b else b


@hetflow.kernel
def negated(e):
    return -e


def big_endian(values):
    return np.asarray(values, dtype=BIG_ENDIAN)


# -- byte order ------------------------------------------------------------------------
@pytest.mark.parametrize("device", ["cpu0", *ON_GPU])
@pytest.mark.parametrize("which", ["x", "out"])
def test_forall_refuses_non_native_byte_order_and_writes_nothing(device, which):
    args = {"x": np.arange(4.0), "out": np.full(4, 7.0)}
    args[which] = big_endian(args[which])
    with pytest.raises(ArgumentTypeError, match=rf"kernel 'twice' argument '{which}': element type >f8 is in "
                                                r"non-native byte order.*a\.astype"):
        hetflow.forall(4, twice, args["x"], args["out"], device=device)
    np.testing.assert_array_equal(args["out"], np.full(4, 7.0))


@pytest.mark.parametrize("device", ["cpu0", *ON_GPU])
def test_the_advised_in_place_swap_runs(device):
    out = big_endian([1.0, 2.0, 3.0])
    native = out.byteswap(inplace=True).view(out.dtype.newbyteorder("="))
    hetflow.forall(3, twice, np.array([4.0, 5.0, 6.0]), native, device=device)
    np.testing.assert_array_equal(native, [8.0, 10.0, 12.0])


@pytest.mark.parametrize("device", ["cpu0", *ON_GPU])
def test_call_sites_read_non_native_arrays_as_numpy_does(device):
    x = big_endian([3.0, -1.0, 7.5, 2.0, 0.5, 9.0, -4.0])
    native = x.astype(float)
    assert hetflow.reduce(x, larger, device=device) == native.max()
    assert hetflow.reduce(x, "sum", device=device) == np.add.reduce(x)
    np.testing.assert_array_equal(hetflow.scan(x, larger, device=device), np.maximum.accumulate(native))
    np.testing.assert_array_equal(hetflow.sort(x, key=negated, device=device), np.sort(native)[::-1])
    assert library.dot(x, x, device=device) == np.dot(native, native)


@pytest.mark.parametrize("device", ["cpu0", *ON_GPU])
@pytest.mark.parametrize("site,args", [("reduce", ("sum",)), ("scan", ("max",)), ("sort", ())])
def test_views_of_non_native_arrays_are_refused(device, site, args):
    view = interior(big_endian(np.arange(6.0)), 1)
    with pytest.raises(ArgumentTypeError, match=rf"^{site}: x \(a view, reading its root array\): element type "
                                                r">f8 is in non-native byte order"):
        getattr(hetflow, site)(view, *args, device=device)


# -- element types a device cannot take ---------------------------------------------------
@pytest.mark.parametrize("call,site", [
    (lambda v: hetflow.reduce(v, "sum", device="cpu0"), "reduce"),
    (lambda v: hetflow.reduce(v, larger, device="cpu0"), "reduce"),
    (lambda v: hetflow.scan(v, "sum", device="cpu0"), "scan"),
    (lambda v: hetflow.sort(v, device="cpu0"), "sort"),
])
def test_float16_views_on_the_cpu_name_the_operand_not_a_generated_kernel(call, site):
    with pytest.raises(ArgumentTypeError, match=rf"^{site}: x \(a view, reading its root array\): element type "
                                                r"float16 is not supported on cpu0") as err:
        call(interior(np.arange(6, dtype=np.float16), 1))
    assert "hf_" not in str(err.value)


@pytest.mark.simgpu
@pytest.mark.parametrize("site", ["reduce", "scan"])
def test_co_executed_float16_names_the_device_that_cannot_and_the_one_that_can(site):
    x = np.arange(8, dtype=np.float16)
    with pytest.raises(ArgumentTypeError, match=rf"^{site}: x: element type float16 is not supported on cpu0; "
                                                r"convert it .*; or run it on gpu0 alone$"):
        getattr(hetflow, site)(x, "sum", device=CO)
    np.testing.assert_array_equal(np.asarray(getattr(hetflow, site)(x, "sum", device="gpu0")),
                                  np.asarray(np.add.reduce(x) if site == "reduce" else np.cumsum(x)))


@pytest.mark.simgpu
def test_float16_views_run_on_a_gpu():
    x = np.arange(6, dtype=np.float16)
    assert hetflow.reduce(interior(x, 1), "sum", device="gpu0") == np.add.reduce(x[1:-1])
    np.testing.assert_array_equal(hetflow.sort(interior(x[::-1].copy(), 1), device="gpu0"), np.sort(x[1:-1]))


def test_dot_of_float16_on_the_cpu_names_its_argument():
    with pytest.raises(ArgumentTypeError, match=r"^dot: x: element type float16 is not supported on cpu0"):
        library.dot(np.ones(4, np.float16), np.ones(4, np.float16), device="cpu0")


@pytest.mark.simgpu
def test_float16_keys_are_typed_on_the_cpu_and_say_so():
    with pytest.raises(KernelCompileError, match=r"sort: key kernel 'negated' does not compile for elements of "
                                                 r"dtype float16 on cpu0, where keys are typed"):
        hetflow.sort(np.ones(3, np.float16), key=negated, device="gpu0")


@pytest.mark.parametrize("device", ["cpu0", *ON_GPU])
@pytest.mark.parametrize("dtype", [np.longdouble, np.clongdouble, np.dtype("V8")], ids=["g", "G", "V8"])
def test_element_types_without_a_compiled_type_are_refused_on_every_device(device, dtype):
    x = np.zeros(4, dtype)
    if np.dtype(dtype).itemsize == 8 and np.dtype(dtype).kind in "fc":
        pytest.skip("long double is double on this platform")
    message = rf"element type {np.dtype(dtype)} has no type in compiled code \(Numba\) on any device"
    with pytest.raises(ArgumentTypeError, match=r"kernel 'twice' argument 'x': " + message):
        hetflow.forall(4, twice, x, np.zeros(4), device=device)
    with pytest.raises(ArgumentTypeError, match=r"^reduce: x: " + message):
        hetflow.reduce(x, larger, device=device)
    with pytest.raises(ArgumentTypeError, match=r"^scan: x: " + message):
        hetflow.scan(x, larger, device=device)


def test_sort_of_long_double_still_runs_in_numpy():
    x = np.array([3, 1, 2], np.longdouble)
    out = hetflow.sort(x)
    assert out.dtype == x.dtype
    np.testing.assert_array_equal(out, np.sort(x))


@pytest.mark.parametrize("device", ["cpu0", *ON_GPU])
@pytest.mark.parametrize("site", ["reduce", "scan"])
def test_objects_with_a_user_op_name_the_operand(device, site):
    with pytest.raises(ArgumentTypeError, match=rf"^{site}: x: element type object is not supported on "):
        getattr(hetflow, site)(np.array([1, 2], object), larger, device=device)


# -- masked arrays and subclasses -------------------------------------------------------
MATRIX_WARNING = "ignore:the matrix subclass:PendingDeprecationWarning"


def masked_data():
    return np.ma.masked_array([1.0, 100.0, 3.0, 4.0], mask=[0, 1, 0, 0])


MASKED = r"masked array \(numpy\.ma\), whose mask hetflow does not apply.*x\.filled\(value\).*x\.compressed\(\)"


@pytest.mark.parametrize("device", ["cpu0", *ON_GPU])
@pytest.mark.parametrize("site", ["reduce", "scan", "sort"])
def test_masked_operands_are_refused_not_read_without_their_mask(device, site):
    args = {"reduce": ("sum",), "scan": ("sum",), "sort": ()}[site]
    for operand, what in ((masked_data(), "a"), (interior(masked_data(), 1), "a view of a")):
        with pytest.raises(ArgumentTypeError, match=rf"^{site}: x is {what} " + MASKED):
            getattr(hetflow, site)(operand, *args, device=device)


@pytest.mark.parametrize("device", ["cpu0", *ON_GPU])
def test_masked_kernel_arguments_are_refused_and_nothing_is_written(device):
    out = np.zeros(4)
    with pytest.raises(ArgumentTypeError, match=r"kernel 'twice' argument 'x': a " + MASKED):
        hetflow.forall(4, twice, masked_data(), out, device=device)
    with pytest.raises(ArgumentTypeError, match=r"kernel 'twice' argument 'x': a view of a " + MASKED):
        hetflow.forall(2, twice, interior(masked_data(), 1), out, device=device)
    with pytest.raises(ArgumentTypeError, match=r"^dot: y is a " + MASKED):
        library.dot(np.ones(4), masked_data(), device=device)
    np.testing.assert_array_equal(out, np.zeros(4))


@pytest.mark.filterwarnings(MATRIX_WARNING)
@pytest.mark.parametrize("device", ["cpu0", *ON_GPU])
@pytest.mark.parametrize("shape", [(1, 3), (2, 2)])  # a copy to a GPU took a one-row matrix for another shape
def test_matrix_arguments_are_read_and_written_as_plain_arrays(device, shape):
    x, out = np.matrix(np.arange(6.0)[:np.prod(shape)].reshape(shape)), np.matrix(np.zeros(shape))
    hetflow.forall(shape, copy2, x, out, device=device)
    assert type(out) is np.matrix
    np.testing.assert_array_equal(out, x)


@pytest.mark.filterwarnings(MATRIX_WARNING)
@pytest.mark.parametrize("device", ["cpu0", *ON_GPU])
def test_matrix_and_memmap_operands_give_the_plain_arrays_results(device, tmp_path):
    m = np.matrix([[4, 2], [3, 1]])
    plain = np.asarray(m)
    total = hetflow.reduce(m, "sum", device=device)
    assert type(total) is np.int64 and total == plain.sum()
    along = hetflow.reduce(m, "sum", axis=0, device=device)
    assert type(along) is np.ndarray
    np.testing.assert_array_equal(along, plain.sum(axis=0))
    np.testing.assert_array_equal(hetflow.scan(m, "sum", device=device), np.cumsum(plain))
    ordered = hetflow.sort(m, device=device)
    assert type(ordered) is np.ndarray
    np.testing.assert_array_equal(ordered, np.sort(plain))
    mm = np.memmap(tmp_path / "x.bin", dtype=np.float64, mode="w+", shape=(5,))
    mm[:] = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert hetflow.reduce(mm, larger, device=device) == 5.0
    np.testing.assert_array_equal(hetflow.sort(mm, device=device), np.arange(1.0, 6.0))


# -- scalars where arrays are subscripted --------------------------------------------------
@pytest.mark.parametrize("device", ["cpu0", *ON_GPU])
def test_a_scalar_the_kernel_subscripts_is_refused_before_it_runs(device):
    out = np.zeros(4)
    with pytest.raises(ArgumentTypeError, match=r"kernel 'twice' argument 'x': float 3\.0 is a scalar, but the "
                                                r"kernel subscripts it by its launch index; pass an array"):
        hetflow.forall(4, twice, 3.0, out, device=device)
    with pytest.raises(ArgumentTypeError, match=r"kernel 'twice' argument 'out': float64 2\.0 is a scalar"):
        hetflow.forall(4, twice, np.arange(4.0), np.float64(2.0), device=device)
    np.testing.assert_array_equal(out, np.zeros(4))


@hetflow.kernel
def _squared(i, x):
    return x[i] * x[i]


@pytest.mark.parametrize("x, says", [
    (np.arange(4, dtype=">f8"), r"element type >f8 is in non-native byte order"),
    (np.arange(4, dtype=np.float16), r"element type float16 is not supported on cpu0; convert it .* "
                                     r"\(a map kernel's value is typed on cpu0, whatever the device\)"),
    (np.ma.masked_array(np.arange(4.0), [0, 1, 0, 0]), r"a masked array \(numpy\.ma\), whose mask"),
    (interior(np.ma.masked_array(np.arange(6.0)), 1), r"a view of a masked array \(numpy\.ma\)"),
])
def test_the_kernel_form_of_reduce_refuses_elements_it_cannot_read_naming_the_argument(x, says):
    with pytest.raises(ArgumentTypeError, match=r"reduce: kernel '_squared' argument 'x': " + says):
        hetflow.reduce(4, _squared, x, op="sum")
    assert hetflow.reduce(4, _squared, np.arange(4.0), op="sum") == np.sum(np.arange(4.0) ** 2)
