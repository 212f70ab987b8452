"""Arguments of the wrong kind or value raise hetflow's errors (docs/guide/errors.md):
ArgumentTypeError for a wrong kind, ArgumentError for a wrong value, each naming what
was given and where, before anything runs."""
import math

import numpy as np
import pytest

import hetflow
from hetflow.errors import ArgumentError, ArgumentTypeError
from hetflow.ir import Monitor
from hetflow.runtime.steal import Worker, run_loop

NO_SECONDS = "timeout must be None or a non-negative number of seconds"


@hetflow.kernel
def bump(i, out):
    out[i] = out[i] + 1.0


def _raises(kind, message, call):
    """``call()`` raises exactly ``kind`` (not a subclass) with ``message``."""
    with pytest.raises(kind, match=message) as info:
        call()
    assert type(info.value) is kind
    return info.value


# -- timeouts: one check for events and queues ---------------------------------------------
@pytest.fixture
def pending():
    """A queue with an instance held back by a user event, and that event."""
    gate = hetflow.UserEvent()
    queue = hetflow.Queue(["cpu0"])
    queue.enqueue(bump, 4, np.zeros(4), wait_for=gate)
    yield queue, gate
    if not gate.done:
        gate.set_complete()
    queue.finish(5)
    queue.close()


@pytest.mark.parametrize(("timeout", "kind"), [("x", ArgumentTypeError), (True, ArgumentTypeError),
                                               (float("nan"), ArgumentError), (-1, ArgumentError)])
def test_a_queue_finish_and_an_event_wait_check_their_timeout_alike(pending, timeout, kind):
    queue, gate = pending
    _raises(kind, rf"^queue finish: {NO_SECONDS}, not {timeout!r}$", lambda: queue.finish(timeout=timeout))
    _raises(kind, rf"^event {gate.id} \(user event\): {NO_SECONDS}, not {timeout!r}$",
            lambda: gate.wait(timeout=timeout))


@pytest.mark.parametrize("timeout", [-1, "x"])
def test_a_bad_timeout_is_refused_when_there_is_nothing_to_wait_for(timeout):
    done = hetflow.UserEvent()
    done.set_complete()
    with hetflow.Queue(["cpu0"]) as idle:
        with pytest.raises(ArgumentError, match=f"^queue finish: {NO_SECONDS}"):
            idle.finish(timeout=timeout)
    with pytest.raises(ArgumentError, match=f"^event {done.id} \\(user event\\): {NO_SECONDS}"):
        done.wait(timeout=timeout)


def test_a_queue_finish_with_an_infinite_timeout_waits_without_limit(pending):
    queue, gate = pending
    gate.set_complete()
    queue.finish(timeout=math.inf)


# -- user events -------------------------------------------------------------------------------
def test_a_user_event_fails_with_an_exception_only():
    event = hetflow.UserEvent()
    _raises(ArgumentTypeError, rf"^event {event.id} \(user event\): set_failed takes an exception, not str 'text'$",
            lambda: event.set_failed("text"))
    assert event.status == "queued"  # not set: it can still be set once
    event.set_failed(ValueError("late"))
    assert event.status == "failed"


# -- device lists: one check for contexts and forall -----------------------------------------
@pytest.mark.parametrize(("given", "kind", "message"), [
    (5, ArgumentTypeError, r"^context device must be None, a device id, a Device, .*; got int$"),
    ([5], ArgumentTypeError, r"^context device \[5\] holds 5, which is neither a device id nor a Device$"),
    ([], ArgumentError, r"^context device \[\] names no device; give at least one$"),
    (["cpu0", "cpu0"], ArgumentError, r"^context device \['cpu0', 'cpu0'\] names cpu0 more than once$"),
])
def test_a_context_refuses_what_forall_refuses(given, kind, message):
    _raises(kind, message, lambda: hetflow.Context(given))
    where = message.replace("context device", "device").replace("None, a device id", "an id, 'all', 'gpu'")
    _raises(kind, where, lambda: hetflow.forall(4, bump, np.zeros(4), device=given))


def test_a_context_takes_a_list_of_ids_and_devices():
    cpu = hetflow.devices()[0]
    with hetflow.Context(["cpu0"]) as by_id, hetflow.Context((cpu,)) as by_device:
        assert by_id.devices == by_device.devices == (cpu,)


# -- shares ------------------------------------------------------------------------------------
@pytest.mark.parametrize("schedule", [None, "static"])
def test_shares_of_the_wrong_length_on_one_device_are_refused(schedule):
    out = np.zeros(10)
    _raises(ArgumentError, r"^shares must be 1 non-negative numbers, one per device \(cpu0\), not all zero; "
                           r"got 2 shares: \[1, 2\]$",
            lambda: hetflow.forall(10, bump, out, device="cpu0", schedule=schedule, shares=[1, 2]))
    assert not out.any()


def test_one_share_on_one_device_changes_nothing_but_is_checked():
    out = np.zeros(10)
    hetflow.forall(10, bump, out, device="cpu0", shares=[3])
    np.testing.assert_array_equal(out, 1.0)
    _raises(ArgumentError, r"^shares must be finite, non-negative and not all zero, got \[0\]$",
            lambda: hetflow.forall(10, bump, out, device="cpu0", shares=[0]))


@pytest.mark.simgpu
@pytest.mark.parametrize("n", [1, 10])  # one row runs on one device: shares were ignored there
def test_shares_of_the_wrong_length_on_several_devices_are_refused(gpu_device, n):
    _raises(ArgumentError, rf"^shares must be 2 non-negative numbers, one per device \(cpu0, {gpu_device.id}\), "
                           r"not all zero; got 3 shares: \[1, 1, 1\]$",
            lambda: hetflow.forall(n, bump, np.zeros(n), device=["cpu0", gpu_device.id], shares=[1, 1, 1]))


@pytest.mark.parametrize("shares", [["a"], {"cpu0": 1}, 1.0, [[1.0]], [True], [None]])
def test_shares_that_are_no_list_of_numbers(shares):
    _raises(ArgumentTypeError, r"^shares must be a list of numbers, one per device; got ",
            lambda: hetflow.forall(4, bump, np.zeros(4), device="cpu0", schedule="static", shares=shares))


def test_a_loop_refuses_shares_that_are_no_numbers():
    workers = [Worker(f"w{k}", "cpu", lambda lo, hi: None, 1, "cpu0") for k in range(2)]
    _raises(ArgumentTypeError, r"^shares must be a list of numbers, one per worker; got \['a', 'b'\]$",
            lambda: run_loop(4, workers, shares=["a", "b"]))


# -- the monitor -------------------------------------------------------------------------------
@pytest.mark.parametrize(("period", "kind", "message"), [
    ("a", ArgumentTypeError, r"^monitor period must be a number of seconds; got str 'a'$"),
    (True, ArgumentTypeError, r"^monitor period must be a number of seconds; got bool True$"),
    (math.inf, ArgumentError, r"^monitor period must be positive and finite \(seconds\); got inf$"),
    (float("nan"), ArgumentError, r"^monitor period must be positive and finite \(seconds\); got nan$"),
])
def test_a_monitor_period_is_a_finite_positive_number(period, kind, message):
    _raises(kind, message, lambda: Monitor(period=period, sources=[]))


@pytest.mark.parametrize("call", ["read", "map", "write"])
@pytest.mark.parametrize("timeout,error", [("x", ArgumentTypeError), (-1.0, ArgumentError),
                                           (float("nan"), ArgumentError)])
def test_a_buffer_wait_checks_its_timeout(call, timeout, error):
    buffer = hetflow.array(np.zeros(3))
    args = (np.ones(3),) if call == "write" else ()
    with pytest.raises(error, match=r"<hetflow Buffer .*: timeout must be None or a non-negative number"):
        getattr(buffer, call)(*args, timeout=timeout)


@hetflow.kernel
def _squared(i, x):
    return x[i] * x[i]


@hetflow.kernel
def _squared_into(i, x, out):
    def sq(v):
        return v * v
    out[i] = sq(x[i])
    if x[i] < 0:
        return


@pytest.mark.parametrize("devices", ["cpu0", pytest.param("gpu0", marks=pytest.mark.simgpu),
                                     pytest.param(["cpu0", "gpu0"], marks=pytest.mark.simgpu)])
def test_a_launch_of_a_kernel_that_only_returns_values_is_refused(devices):
    x = np.arange(6.0)
    message = (r"kernel '_squared' returns a value and writes no argument: a launch discards what its kernel "
               r"returns, so it would do nothing; to combine the values, call hetflow\.reduce\(extent, _squared")
    with pytest.raises(ArgumentError, match=message):
        hetflow.forall(6, _squared, x, device=devices)
    with hetflow.Queue(devices) as q, pytest.raises(ArgumentError, match=message):
        q.enqueue(_squared, 6, x)
    assert hetflow.reduce(6, _squared, x, op="sum", device=devices) == np.sum(x * x)
    out = np.zeros(6)  # a nested function's return and a bare return are no value returned
    hetflow.forall(6, _squared_into, x, out, device=devices)
    np.testing.assert_array_equal(out, x * x)
