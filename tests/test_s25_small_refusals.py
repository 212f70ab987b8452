"""Small refusals a user meets: ``cluster.asarray(like=)`` takes keywords at their default
of None, the allreduce benchmark refuses sizes it cannot time, the demo's device named
twice is a usage error, the device table's ``refresh`` is a bool and a Device must be one
of the table's, and ``transpose`` and ``partition`` say what NumPy's spelling means here."""
import dataclasses
import importlib.util
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import hetflow
from hetflow import cluster
from hetflow.errors import ArgumentError, ArgumentTypeError, DeviceError, ShapeError

BENCH = pathlib.Path(__file__).resolve().parents[1] / "bench"


@hetflow.kernel
def twice(i, x, out):
    out[i] = 2.0 * x[i]


def _raises(error, message, call):
    """``call()`` raises exactly ``error`` (not a subclass) saying ``message``, all of it."""
    with pytest.raises(error) as caught:
        call()
    assert type(caught.value) is error and str(caught.value) == message


# -- cluster.asarray(like=) ---------------------------------------------------------------------
def test_asarray_like_takes_comm_parts_and_device_given_as_none_their_default():
    x = np.arange(12.0).reshape(6, 2)
    u = cluster.asarray(x, halo=0)
    v = cluster.asarray(2 * x, like=u, comm=None, parts=None, device=None)
    assert v.distribution is u.distribution
    np.testing.assert_array_equal(v.gather(), 2 * x)


@pytest.mark.parametrize("given, named", [({"comm": None, "halo": 2}, "halo"), ({"dim": 0}, "dim"),
                                          ({"parts": [1], "comm": None}, "parts")])
def test_asarray_like_still_refuses_what_it_decides(given, named):
    u = cluster.asarray(np.arange(4.0))
    _raises(ArgumentError, f"cluster.asarray: like= gives the distribution; {named} cannot be given with it",
            lambda: cluster.asarray(np.zeros(4), like=u, **given))


# -- bench/allreduce.py --------------------------------------------------------------------------
def _allreduce():
    spec = importlib.util.spec_from_file_location("hetflow_bench_allreduce_s25_small", BENCH / "allreduce.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("argv, message", [
    (["--min-bytes", "64", "--max-bytes", "8"], "--min-bytes 64 is above --max-bytes, 8: no message size to time"),
    (["--min-bytes", "1048576", "--quick"],
     "--min-bytes 1048576 is above --quick's largest size, 65536: no message size to time"),
])
def test_allreduce_refuses_a_smallest_size_above_the_largest_before_mpiexec(argv, message):
    """Before, it started the ranks and printed a table without rows."""
    out = subprocess.run([sys.executable, str(BENCH / "allreduce.py"), "--ranks", "1", *argv],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines()[-1] == f"hetflow bench allreduce: error: {message}"
    assert "usage: hetflow bench allreduce" in out.stderr


def test_allreduce_times_the_one_size_of_equal_bounds():
    allreduce = _allreduce()
    args = allreduce._parse(["--min-bytes", "64", "--max-bytes", "64"])
    assert list(allreduce._sizes(args)) == [64]
    assert list(allreduce._sizes(allreduce._parse(["--min-bytes", "64", "--max-bytes", "300"]))) == [64, 128, 256]


# -- hetflow demo --devices ------------------------------------------------------------------------
def test_a_device_named_twice_is_a_usage_error_of_the_demo(tmp_path, capsys):
    from hetflow.cli import main as cli

    files = ["--trace", str(tmp_path / "t.json"), "--timeline", str(tmp_path / "t.png")]
    status = cli.main(["demo", "--size", "16", "--iterations", "2", "--devices", "cpu0, cpu0", *files])
    out = capsys.readouterr()
    assert status == 2 and out.out == ""
    assert out.err == ("hetflow: error: --devices cpu0, cpu0: names cpu0 more than once (each device runs its "
                       "share once)\n")
    # an id this machine lacks is still the machine's DeviceError (status 1)
    assert cli.main(["demo", "--size", "16", "--iterations", "2", "--devices", "cpu0,tpu9", *files]) == 1
    assert capsys.readouterr().err.startswith("hetflow: error: DeviceError: --devices cpu0,tpu9: no device "
                                              "with id 'tpu9'")
    assert list(tmp_path.iterdir()) == []


# -- the device table --------------------------------------------------------------------------------
@pytest.mark.parametrize("refresh", ["yes", "false", 1, 0, None])
def test_refresh_must_be_a_bool(refresh):
    table = hetflow.devices()
    _raises(ArgumentTypeError, f"devices: refresh must be True or False; got {type(refresh).__name__} {refresh!r}",
            lambda: hetflow.devices(refresh=refresh))
    assert hetflow.devices() is table  # not rebuilt


def _ids() -> str:
    return ", ".join(d.id for d in hetflow.devices())


def _cpu():
    return hetflow.get_device("cpu0")


@pytest.mark.parametrize("build, what", [
    (lambda fake: hetflow.forall(4, twice, np.ones(4), np.zeros(4), device=[fake]), "device"),
    (lambda fake: hetflow.forall(4, twice, np.ones(4), np.zeros(4), device=fake), "device"),
    (lambda fake: hetflow.Context(fake), "context device"),
    (lambda fake: hetflow.Context(["cpu0", fake]), "context device"),
    (lambda fake: hetflow.LogicalDevice((fake,)), "LogicalDevice devices"),
])
def test_a_made_up_device_is_refused_naming_it_and_the_devices(build, what):
    """Before, it ran (a CPU) or failed inside the launch (a GPU: DeviceError ... IndexError)."""
    fake = dataclasses.replace(_cpu(), id="cpu9")
    _raises(DeviceError, f"{what}: Device 'cpu9' is not in the device table; devices are: {_ids()}",
            lambda: build(fake))


def test_a_device_with_other_fields_than_the_tables_is_refused_naming_them():
    cpu = _cpu()
    changed = dataclasses.replace(cpu, compute_units=cpu.compute_units + 7, fp64=False)
    _raises(DeviceError, f"device: Device 'cpu0' differs from the device table's record in compute_units "
                         f"{cpu.compute_units + 7} (the table's: {cpu.compute_units}), fp64 False (the table's: "
                         f"True); take devices from hetflow.devices() or hetflow.get_device()",
            lambda: hetflow.forall(4, twice, np.ones(4), np.zeros(4), device=[changed]))


def test_the_tables_records_and_equal_copies_run():
    x = np.arange(5.0)
    with hetflow.Context(dataclasses.replace(_cpu())) as context:
        for device in ([_cpu()], [dataclasses.replace(_cpu())], context):
            out = np.zeros(5)
            hetflow.forall(5, twice, x, out, device=device)
            np.testing.assert_array_equal(out, 2.0 * x)


# -- transpose and partition -------------------------------------------------------------------------
@pytest.mark.parametrize("dims, shown", [(((1, 0),), "(1, 0)"), ((), ""), ((0, 1, 0), "0, 1, 0")])
def test_transpose_says_it_swaps_two_dims(dims, shown):
    a = np.zeros((2, 3))
    given = f", {shown}" if shown else ""
    _raises(ArgumentTypeError, f"transpose swaps two dims, transpose(a, d1, d2) (NumPy's np.swapaxes(a, d1, d2)); "
                               f"got transpose(a{given})", lambda: hetflow.transpose(a, *dims))
    a = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(hetflow.transpose(a, 1, 0).numpy(), np.swapaxes(a, 1, 0))


@pytest.mark.parametrize("shape, dim", [((0, 4), 0), ((3, 0), 1), ((2, 0, 5), 1)])
def test_an_empty_dim_is_one_empty_part_as_numpys_array_split(shape, dim):
    a = np.zeros(shape)
    parts = hetflow.partition(a, 1, dim)
    want = np.array_split(a, 1, axis=dim)
    assert len(parts) == len(want) == 1
    assert parts.sizes == (0,) and np.asarray(parts[0]).shape == want[0].shape
    for k in (0, 2):
        _raises(ShapeError, f"partition: {k} parts of dim {dim} with extent 0: an empty dim is cut into one "
                            f"empty part; parts must be 1", lambda: hetflow.partition(a, k, dim))


def test_a_dim_with_indices_keeps_its_bounds_on_parts():
    a = np.arange(8.0).reshape(4, 2)
    blocks = hetflow.partition(a, 3, 0)
    for got, want in zip(blocks, np.array_split(a, 3, axis=0)):
        np.testing.assert_array_equal(np.asarray(got), want)
    _raises(ShapeError, "partition: 5 parts of dim 0 with extent 4: parts must be in [1, 4] so that every part "
                        "gets an index", lambda: hetflow.partition(a, 5, 0))
