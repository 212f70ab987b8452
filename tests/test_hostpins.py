"""Host memory registered for GPU copies (hetflow.runtime.hostpins).

The bookkeeping is checked against a recording driver here; the real driver and the GPU
copies that use the registered memory are checked on a real GPU (mark ``gpu``), against
NumPy.
"""
import gc
import mmap

import numpy as np
import pytest

import hetflow
from hetflow.runtime.hostpins import SMALLEST, HostPins, host_pins, owner_of
from test_coexec_faults import fail_gpu

PIECE = 1 << 20


class Driver:
    """Records registrations as the driver would hold them; refuses overlaps."""

    def __init__(self, refuse=()):
        self.held = {}  # address -> nbytes
        self.refuse = set(refuse)

    def register(self, address, nbytes):
        pages = lambda a, n: set(range(a // mmap.PAGESIZE, (a + n - 1) // mmap.PAGESIZE + 1))  # noqa: E731
        mine = pages(address, nbytes)
        if address in self.refuse or any(mine & pages(a, n) for a, n in self.held.items()):
            raise RuntimeError("cudaErrorHostMemoryAlreadyRegistered")
        self.held[address] = nbytes

    def unregister(self, address):
        del self.held[address]

    def check(self, array, spans):
        """``spans`` tile ``array``'s memory, each inside one registration."""
        assert spans is not None
        reach = array.ctypes.data
        for address, nbytes in spans:
            assert address == reach and nbytes > 0
            assert any(a <= address and address + nbytes <= a + n for a, n in self.held.items())
            reach += nbytes
        assert reach == array.ctypes.data + array.nbytes


def pins(driver, **kw):
    return HostPins(driver.register, driver.unregister, piece=PIECE, **kw)


def test_pieces_are_registered_as_rows_reach_them_and_released_with_their_owner():
    driver = Driver()
    p = pins(driver)
    x = np.zeros(SMALLEST // 8 * 2)          # 8 MiB: 8 or 9 pieces of 1 MiB
    rows = x[1000:50_000]
    driver.check(rows, p.segments(rows))
    assert sum(driver.held.values()) < x.nbytes // 2   # only the pieces those rows lie in
    whole = x[::-1][::-1]                      # a view of a view: the same owner
    spans = p.segments(whole)
    driver.check(whole, spans)
    assert len(spans) == len(driver.held) >= 8  # one span per registration crossed
    assert sum(driver.held.values()) == x.nbytes == p.registered
    driver.check(x[5:9], p.segments(x[5:9]))   # already registered: nothing more
    assert sum(driver.held.values()) == x.nbytes
    del x, rows, whole
    gc.collect()
    assert driver.held == {} and p.registered == 0


def test_memory_that_is_not_numpys_own_small_or_scattered_is_not_registered():
    driver = Driver()
    p = pins(driver)
    foreign = np.frombuffer(bytearray(SMALLEST * 2), dtype=np.float64)
    assert owner_of(foreign) is None and p.segments(foreign) is None
    small = np.zeros(SMALLEST // 8 - 1)
    assert p.segments(small) is None
    big = np.zeros((SMALLEST // 8, 2))
    assert p.segments(big[:, 0]) is None             # not C-contiguous: a copy would be moved
    assert driver.held == {}


def test_a_refused_piece_is_staged_and_the_limit_is_kept():
    x = np.zeros(SMALLEST // 8 * 2)
    start = x.ctypes.data - x.ctypes.data % PIECE
    driver = Driver(refuse={max(x.ctypes.data, start + PIECE)})   # piece 1 is someone else's
    p = pins(driver)
    assert p.segments(x[:10]) is not None
    assert p.segments(x) is None                # piece 1 refused: the whole is staged
    assert p.segments(x) is None and len(driver.held) == 1  # and piece 1 not asked again
    limited = pins(Driver(), limit=3 * PIECE)
    y = np.zeros(SMALLEST // 8 * 2)
    assert limited.segments(y[:10]) is not None and limited.segments(y) is None
    assert limited.registered <= 3 * PIECE


def test_a_registered_array_cannot_be_resized_under_its_registration():
    p = pins(Driver())
    x = np.zeros(SMALLEST // 8 * 2)
    assert p.segments(x) is not None
    with pytest.raises(ValueError, match="referenced"):  # NumPy: it has a weak reference
        x.resize(SMALLEST // 8 * 3, refcheck=False)


@hetflow.kernel
def scale(i, x, out):
    out[i] = 2.0 * x[i] + 1.0


@hetflow.kernel
def accumulate(i, x, out):
    out[i] += x[i]


@pytest.mark.gpu
@pytest.mark.parametrize("devices, schedule", [("gpu0", None), (["gpu0"], "static"),
                                               (["cpu0", "gpu0"], "static")])
def test_numpy_arrays_are_registered_and_copied_directly_on_a_real_gpu(gpu_device, devices, schedule):
    # One GPU without a schedule: the launch runs whole, its rows in pieces over two
    # streams (staging.run); with one, as chunks of a loop, alone or beside the cores.
    devices = gpu_device.id if devices == "gpu0" else [gpu_device.id if d == "gpu0" else d for d in devices]
    kw = {} if schedule is None else {"schedule": schedule}
    p = host_pins()
    gc.collect()                                # arrays of earlier tests that are garbage go first
    before = p.registered
    rng = np.random.default_rng(3)
    x = rng.random(1 << 24)                     # 128 MiB: a whole launch runs 8 pieces, 4 in flight
    out = np.zeros_like(x)
    acc = rng.random(x.size)
    want_acc = acc.copy()
    for _ in range(3):                          # the later calls find the memory registered
        hetflow.forall(x.size, scale, x, out, device=devices, **kw)
        hetflow.forall(x.size, accumulate, x, acc, device=devices, **kw)
        want_acc += x
    np.testing.assert_array_equal(out, 2.0 * x + 1.0)
    np.testing.assert_allclose(acc, want_acc, rtol=1e-15)
    assert p.registered >= before + x.nbytes    # x at least: read directly by the copy engine
    del x, out, acc
    gc.collect()
    assert p.registered == before


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", [scale, accumulate])
def test_a_gpu_failing_mid_loop_over_registered_arrays_applies_every_update_once(gpu_device, monkeypatch, kernel):
    # scale's results copy straight into the registered array as chunks finish;
    # accumulate's land at sync through staging (it reads what it writes).
    rng = np.random.default_rng(4)
    x = rng.random(1 << 25)                     # about 14 GPU chunks of an H100's
    target = rng.random(x.size)
    want = 2.0 * x + 1.0 if kernel is scale else target + x
    calls = fail_gpu(monkeypatch, 3)
    report = hetflow.forall(x.size, kernel, x, target, device=["cpu0", gpu_device.id],
                            schedule="static", shares=[0.1, 0.9])
    assert calls["n"] >= 3 and report.failures
    np.testing.assert_allclose(target, want, rtol=1e-15)


def test_a_piece_the_driver_fails_to_unregister_is_reported_and_forgotten(caplog):
    driver = Driver()

    def fail(address):
        raise RuntimeError("cudaErrorInvalidValue")

    p = HostPins(driver.register, fail, piece=PIECE)
    x = np.zeros(SMALLEST // 8)
    assert p.segments(x) is not None and p.registered == x.nbytes
    del x
    gc.collect()
    assert p.registered == 0
    assert "could not unregister" in caplog.text and "cudaErrorInvalidValue" in caplog.text
