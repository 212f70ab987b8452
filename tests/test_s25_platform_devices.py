"""How a user names and holds devices: get_device, device strings at call sites,
LogicalDevice, select, and contexts released while in use (on the CPU, and under the
CUDA simulator where marked)."""
import importlib
import re
import threading

import numpy as np
import pytest

import hetflow
from hetflow.errors import ArgumentError, ArgumentTypeError, DeviceError, InvalidContextError
from hetflow.platform.context import lookup

devices_module = importlib.import_module("hetflow.platform.devices")  # the package's name is the function


@hetflow.kernel
def twice(i, x, out):
    out[i] = 2.0 * x[i]


def _raises(kind, message, call):
    """``call()`` raises exactly ``kind`` (not a subclass) with ``message``."""
    with pytest.raises(kind, match=message) as info:
        call()
    assert type(info.value) is kind
    return info.value


def _ids():
    return [d.id for d in hetflow.devices()]


def _doubled(device):
    x, out = np.arange(12.0), np.zeros(12)
    hetflow.forall(12, twice, x, out, device=device)
    return np.array_equal(out, 2.0 * x)


# -- get_device --------------------------------------------------------------------------
@pytest.mark.parametrize("given", [["cpu0"], [], ("cpu0",), {"cpu0"}, None, 0, True, 3.5, b"cpu0"])
def test_get_device_refuses_what_is_no_id(given):
    _raises(ArgumentTypeError, rf"^a device is named by an id such as 'cpu0' or 'gpu0', or a Device; got "
            rf"{type(given).__name__} ", lambda: hetflow.get_device(given))


def test_get_device_of_a_device_is_the_tables_record():
    cpu = hetflow.devices()[0]
    assert hetflow.get_device(cpu) is cpu


@pytest.mark.parametrize("given", [" cpu0 ", "CPU0", "Cpu0\n"])
def test_an_id_off_by_case_or_spaces_says_which_one_was_meant(given):
    known = ", ".join(_ids())
    _raises(DeviceError, rf"^no device with id {re.escape(repr(given))} \(did you mean 'cpu0'\?\); devices are: {known}$",
            lambda: hetflow.get_device(given))


# -- device strings at call sites ------------------------------------------------------------
@pytest.mark.parametrize("given", ["gpu7", "cpu", "cpu0+gpu0", "cpu0,gpu0", ""])
def test_a_name_of_no_device_lists_the_ids_and_the_names(given):
    ids = _ids()
    message = (rf"^no device with id {re.escape(repr(given))}; devices are: {', '.join(ids)}; or name 'all' \(every device\) "
               rf"or 'gpu' \(every GPU\), or list several devices: \[{', '.join(map(repr, ids))}\]$")
    x, out = np.arange(4.0), np.zeros(4)
    _raises(DeviceError, message, lambda: hetflow.forall(4, twice, x, out, device=given))
    _raises(DeviceError, message, lambda: hetflow.reduce(x, "sum", device=given))
    _raises(DeviceError, message, lambda: hetflow.Context(given))
    _raises(DeviceError, message, lambda: hetflow.Queue(given))
    assert not out.any()  # nothing ran


@pytest.mark.parametrize("name", ["all", "gpu"], ids=["all", "gpus"])  # (an id 'gpu' marks a real-GPU test)
def test_a_context_and_a_queue_take_the_names_forall_takes(name):
    ids = tuple(_ids())
    expected = ids if name == "all" else tuple(i for i in ids if i.startswith("gpu")) or ("cpu0",)
    with hetflow.Context(name) as ctx:
        assert ctx.logical_device.ids == expected
        assert _doubled(ctx)
    x, out = np.arange(12.0), np.zeros(12)
    with hetflow.Queue(name) as q:
        assert tuple(d.id for d in q.devices) == expected
        q.enqueue(twice, 12, x, out).wait(30)
    np.testing.assert_array_equal(out, 2.0 * x)


def test_a_context_on_gpu_is_the_cpu_where_there_is_no_gpu(monkeypatch):
    cpu = devices_module.cpu_device()
    monkeypatch.setattr(devices_module, "devices", lambda refresh=False: (cpu,))
    with hetflow.Context("gpu") as ctx:
        assert ctx.devices == (cpu,)


@pytest.mark.parametrize("given", [{"cpu0"}, frozenset({"cpu0"})])
def test_a_set_of_devices_is_refused_for_its_arbitrary_order(given):
    tail = re.escape(f"{given!r} is a set, whose order is arbitrary: give a list (shares and rows go to devices "
                     f"in its order)") + "$"
    x, out = np.arange(4.0), np.zeros(4)
    _raises(ArgumentTypeError, "^device " + tail, lambda: hetflow.forall(4, twice, x, out, device=given))
    _raises(ArgumentTypeError, "^context device " + tail, lambda: hetflow.Context(given))
    _raises(ArgumentTypeError, "^context device " + tail, lambda: hetflow.Queue(given))


def test_bytes_are_no_device_id():
    x, out = np.arange(4.0), np.zeros(4)
    _raises(ArgumentTypeError, r"^device must be an id, 'all', 'gpu', .*; got bytes b'cpu0'$",
            lambda: hetflow.forall(4, twice, x, out, device=b"cpu0"))


# -- LogicalDevice -----------------------------------------------------------------------------
def test_a_logical_device_of_ids_runs_where_its_devices_do():
    cpu = hetflow.get_device("cpu0")
    group = hetflow.LogicalDevice(["cpu0"])
    assert group.devices == (cpu,) and group == hetflow.LogicalDevice((cpu,))
    assert _doubled(group)
    x, out = np.arange(12.0), np.zeros(12)
    with hetflow.Queue(group) as q:
        q.enqueue(twice, 12, x, out).wait(30)
    np.testing.assert_array_equal(out, 2.0 * x)


@pytest.mark.parametrize(("given", "kind", "message"), [
    ("cpu0", ArgumentTypeError, r"^LogicalDevice devices must be a list of device ids or Devices; got str 'cpu0'$"),
    ([1], ArgumentTypeError, r"^LogicalDevice devices \[1\] holds 1, which is neither a device id nor a Device$"),
    (["cpu0", "cpu0"], ArgumentError, r"^LogicalDevice devices \['cpu0', 'cpu0'\] names cpu0 more than once$"),
    (["tpu0"], DeviceError, r"^no device with id 'tpu0'; devices are: "),
    (5, ArgumentTypeError, r"^LogicalDevice devices must be a list of device ids or Devices; got int$"),
])
def test_a_logical_device_refuses_what_names_no_devices(given, kind, message):
    _raises(kind, message, lambda: hetflow.LogicalDevice(given))


# -- select ------------------------------------------------------------------------------------
@pytest.mark.parametrize("strict", [True, False])
def test_select_refuses_a_capability_no_device_has(strict):
    _raises(ArgumentError, r"^select: a requirement list \{'knd': 'gpu'\} names no capability 'knd'; "
            r"capabilities are id, kind, vendor, .*, arch$",
            lambda: hetflow.select(require={"knd": "gpu"}, strict=strict))
    _raises(ArgumentError, r"^select: prefer \{'speed': 3\} names no capability 'speed'; ",
            lambda: hetflow.select(prefer={"speed": 3}, strict=strict))


@pytest.mark.parametrize("given", ["gpu", ["kind"]], ids=["str", "list"])
def test_select_refuses_a_requirement_list_that_is_no_dict(given):
    _raises(ArgumentTypeError, rf"^select: a requirement list must be a dict \{{capability: wanted\}}; got "
            rf"{type(given).__name__} ", lambda: hetflow.select(given))


def test_select_of_more_devices_than_the_machine_has_says_so():
    ids = _ids()
    lists = [{}] * (len(ids) + 1)
    _raises(DeviceError, rf"^select: {len(lists)} requirement lists pick one device each, but the machine has "
            rf"{len(ids)}: {', '.join(ids)}$", lambda: hetflow.select(*lists))


# -- contexts released while in use -------------------------------------------------------------
def test_lookup_of_a_released_context_says_it_may_have_been_released():
    ctx = hetflow.Context("cpu0")
    ctx.release()
    _raises(InvalidContextError, rf"^unknown context id {ctx.id}: no live context has it \(never created, or "
            r"released\)$", lambda: lookup(ctx.id))


def test_a_context_released_one_time_too_many_under_a_busy_queue_finishes_its_work():
    ctx = hetflow.Context("cpu0")
    q = hetflow.Queue(ctx, run_here=False)
    x = np.arange(64.0)
    outs = [np.zeros(64) for _ in range(4)]
    events = [q.enqueue(twice, 64, x, out) for out in outs]
    ctx.release()
    ctx.release()  # the queue's reference too, with its work in flight
    _raises(InvalidContextError, rf"^context {ctx.id} was released \(devices \('cpu0',\)\)$",
            lambda: q.enqueue(twice, 64, x, outs[0]))
    _raises(InvalidContextError, rf"^context {ctx.id} was released", lambda: _doubled(ctx))
    for event in events:
        event.wait(30)
    q.finish(30)
    q.close()  # finds its reference gone: nothing left to release, and no error
    assert all(np.array_equal(out, 2.0 * x) for out in outs)


def test_threads_retaining_and_releasing_a_context_leave_its_count_exact():
    ctx = hetflow.Context("cpu0")

    def churn():
        for _ in range(500):
            ctx.retain()
            ctx.release()

    threads = [threading.Thread(target=churn) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert ctx.refcount == 1
    ctx.release()
    _raises(InvalidContextError, rf"^context {ctx.id} was released", ctx.release)


# -- under the simulator -------------------------------------------------------------------------
@pytest.mark.simgpu
def test_gpu0_by_case_says_which_id_was_meant(gpu_device):
    _raises(DeviceError, r"^no device with id 'GPU0' \(did you mean 'gpu0'\?\); devices are: cpu0, gpu0; ",
            lambda: hetflow.forall(4, twice, np.arange(4.0), np.zeros(4), device="GPU0"))


@pytest.mark.simgpu
def test_a_logical_device_of_cpu_and_gpu_ids_co_executes(gpu_device):
    assert _doubled(hetflow.LogicalDevice(["cpu0", gpu_device.id]))
    with hetflow.Context("all") as ctx:
        assert ctx.logical_device.ids == ("cpu0", gpu_device.id)
        assert _doubled(ctx)
