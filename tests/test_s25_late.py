"""A graph refuses, while recording, the schedule= a forall refuses (its devices may
be a planning topology's: tests/test_ir_scenarios.py); a nan the monitor samples again is no change; an owner's reference to a
context is dropped only while it is alive."""

import numpy as np
import pytest

import hetflow
from hetflow.errors import ArgumentError
from hetflow.ir.monitor import Monitor
from test_s25_staging_overlap import twice2


@hetflow.kernel
def triple(i, x, out):
    out[i] = 3 * x[i]


@pytest.mark.parametrize("options, error, message", [
    (dict(schedule="fast"), ArgumentError, r"^schedule must be 'steal' or 'static', got 'fast'$"),
    (dict(device="cpu0", schedule=1), ArgumentError, r"^schedule must be 'steal' or 'static', got 1$"),
])
def test_recording_a_launch_refuses_the_schedule_running_it_refuses(options, error, message):
    x, out = np.arange(4.0), np.zeros(4)
    with pytest.raises(error, match=message) as eager:
        hetflow.forall(4, triple, x, out, **options)
    with hetflow.graph("g") as g:
        with pytest.raises(error) as recorded:
            hetflow.forall(4, triple, x, out, **options)
    assert str(recorded.value) == str(eager.value)
    g.run()
    assert not out.any()   # nothing was recorded, nothing ran
    with hetflow.graph("h") as h:
        hetflow.forall(4, triple, x, out, device="cpu0", schedule="static")
    h.run()
    np.testing.assert_array_equal(out, 3 * x)


def test_a_nan_sampled_again_is_no_change():
    m = Monitor()
    m.set("load", float("nan"))
    revision = m.revision
    m.set("load", float("nan"))
    m.set("load", np.nan)
    assert m.revision == revision
    m.set("load", 0.5)
    assert m.revision == revision + 1


def test_release_if_alive_drops_one_reference_and_none_of_a_released_context():
    ctx = hetflow.Context("cpu0").retain()
    ctx.release_if_alive()
    assert ctx.refcount == 1
    ctx.release()
    ctx.release_if_alive()   # released already: nothing to drop, nothing raised
    assert ctx.refcount == 0
    with pytest.raises(hetflow.errors.InvalidContextError):
        ctx.release()


@pytest.mark.simgpu
@pytest.mark.parametrize("device", ["cpu0", "gpu0", ["cpu0", "gpu0"]])
def test_a_launch_without_indices_runs_nothing_on_every_device(device):
    """An extent with a zero dim: before, gpu0 copied an empty strided argument in and
    failed ("incompatible strides"); nothing runs, nothing changes."""
    a = np.arange(20.0).reshape(4, 5)
    hetflow.forall((1, 0), twice2, a[0:1, 0:1], a.T[0:1, 4:5], device=device)
    np.testing.assert_array_equal(a, np.arange(20.0).reshape(4, 5))
