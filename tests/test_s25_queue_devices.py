"""A queue's device= names one device; a launch over a LogicalDevice holding none is refused."""
import numpy as np
import pytest

import hetflow
from hetflow.errors import ArgumentError, ArgumentTypeError


@hetflow.kernel
def double(i, x, out):
    out[i] = 2 * x[i]


@pytest.mark.parametrize("device", [["cpu0"], {"cpu0"}, 0])
def test_a_queue_task_on_anything_but_one_device_is_refused(device):
    x, out = np.arange(8.0), np.zeros(8)
    with hetflow.Queue("cpu0") as q:
        with pytest.raises(ArgumentTypeError, match=r"^device must be one device's id or a Device; got "):
            q.enqueue(double, 8, x, out, device=device)
        with pytest.raises(ArgumentTypeError, match=r"^device must be one device's id or a Device; got "):
            q.set_device_busy(device)
        q.enqueue(double, 8, x, out, device="cpu0")
    np.testing.assert_array_equal(out, 2 * x)


@pytest.mark.parametrize("call", ["forall", "reduce"])
def test_a_logical_device_holding_none_is_refused(call):
    x, out = np.arange(4.0), np.zeros(4)
    empty = hetflow.LogicalDevice(())
    with pytest.raises(ArgumentError, match=r"holds no device; give it at least one"):
        if call == "forall":
            hetflow.forall(4, double, x, out, device=empty)
        else:
            hetflow.reduce(x, "sum", device=empty)
    assert not out.any()
