"""The queue used as an application would, around failures: work cancelled in one queue
by a failure in another, deferred instances whose dependency failed first, a closed
queue's submit, and the errors that waits raise again and again.

Oracles: NumPy (outputs that must be untouched, or computed), and the event ids the
test itself knows.
"""
import traceback

import numpy as np
import pytest

import hetflow
from hetflow.errors import ArgumentError, EventFailedError
from hetflow.runtime.events import UserEvent
from hetflow.runtime.queue import Queue
from test_queue import checked_inc

T = 120  # seconds: generous, the first launch of a kernel compiles it


@hetflow.kernel
def doubled(i, x, y):
    y[i] = 2.0 * x[i]


def test_finish_raises_work_cancelled_by_another_queue_s_unreported_failure():
    x, y = np.array([1.0, -1.0]), np.full(2, 7.0)
    with Queue("cpu0") as producer, Queue("cpu0") as consumer:
        failing = producer.enqueue(checked_inc, 2, x)
        reader = consumer.enqueue(doubled, 2, x, y)  # reads x: cancelled with its writer
        with pytest.raises(EventFailedError) as info:
            consumer.finish(T)  # y was never computed: no silent return
        assert str(info.value).startswith(f"event {reader.id} (kernel 'doubled') was cancelled: it depends on "
                                          f"event {failing.id} (kernel 'checked_inc'), which failed (")
        assert "negative input" in str(info.value)  # why it failed, in words
        assert info.value.failed_event is failing
        consumer.finish(T)  # reported once
        with pytest.raises(EventFailedError, match=rf"event {failing.id} \(kernel 'checked_inc'\) failed on "
                                                   r"cpu0: .*negative input"):
            producer.finish(T)  # its own failure, still its to report
    np.testing.assert_array_equal(y, 7.0)


def test_a_failure_reported_before_leaves_the_other_queue_s_finish_quiet():
    x, y = np.array([-1.0]), np.zeros(1)
    with Queue("cpu0") as producer, Queue("cpu0") as consumer:
        failing = producer.enqueue(checked_inc, 1, x)
        reader = consumer.enqueue(doubled, 1, x, y)
        with pytest.raises(EventFailedError):
            failing.wait(T)  # the application has seen the failure behind the cancellation
        consumer.finish(T)
    assert reader.status == "cancelled"


def test_a_user_event_failure_is_the_application_s_own_so_finish_stays_quiet():
    gate = UserEvent()
    with Queue("cpu0") as q:
        ev = q.enqueue(checked_inc, 1, np.zeros(1), wait_for=gate)
        gate.set_failed(RuntimeError("upstream lost"))
        q.finish(T)
    assert ev.status == "cancelled"


def test_a_deferred_instance_whose_dependency_already_failed_is_held_back_and_submitted():
    gate = UserEvent()
    gate.set_failed(RuntimeError("upstream lost"))
    x = np.zeros(2)
    with Queue("cpu0") as q:
        ev = q.enqueue(checked_inc, 2, x, wait_for=gate, defer=True)
        with pytest.raises(ArgumentError, match=rf"deferred instance\(s\) never submitted: event {ev.id}"):
            q.finish(T)  # as for a deferred instance whose dependency fails later
        q.submit(ev)  # was: ArgumentError, 'already submitted'
        with pytest.raises(EventFailedError, match=rf"event {ev.id} \(kernel 'checked_inc'\) was cancelled: it "
                                                   rf"depends on event {gate.id} \(user event\), which failed"):
            ev.wait(T)
    np.testing.assert_array_equal(x, 0.0)


def test_submit_to_a_closed_queue_says_it_is_closed():
    q = Queue("cpu0")
    ev = q.enqueue(checked_inc, 1, np.zeros(1), defer=True)
    q.close()
    with pytest.raises(ArgumentError, match=rf"^cannot submit event {ev.id} \(kernel 'checked_inc'\): this "
                                            r"queue is closed$"):
        q.submit(ev)
    with pytest.raises(EventFailedError, match="never submitted before its queue closed"):
        ev.wait(T)


def test_an_error_raised_again_carries_only_the_frames_of_this_raise():
    with Queue("cpu0") as q:
        ev = q.enqueue(checked_inc, 1, np.array([-1.0]))
        with pytest.raises(EventFailedError) as info:
            q.finish(T)
        frames = []
        for _ in range(3):
            with pytest.raises(EventFailedError) as again:
                ev.wait(T)
            assert again.value is info.value
            frames.append([f.name for f in traceback.extract_tb(again.value.__traceback__)])
    # was: each raise kept the frames of the ones before (finish's, then each wait's)
    assert frames[0] == frames[1] == frames[2] and "finish" not in frames[0], frames


def test_a_directly_made_event_is_refused_as_a_dependency():
    q = hetflow.Queue()
    bare = hetflow.Event("mine")
    for wait_for in (bare, [bare]):
        with pytest.raises(ArgumentError, match=r"wait_for holds event \d+ \(mine\), made by calling "
                                                r"hetflow\.Event directly, which nothing completes"):
            q.enqueue(doubled, 4, np.zeros(4), np.zeros(4), wait_for=wait_for)
    q.finish()
