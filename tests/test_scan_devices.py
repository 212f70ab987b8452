"""scan along axis 0 over several devices: its column scans write every row, so the
devices cannot split them; one device runs it, quietly, every call. Oracles: NumPy's
accumulate, a sequential scan."""
import logging

import numpy as np
import pytest

import hetflow
from hetflow import interior, scan

RNG = np.random.default_rng(11)
pytestmark = pytest.mark.simgpu


@hetflow.kernel
def first_nonzero(a, b):
    """Associative, not commutative."""
    return a if a != 0 else b


def _sequential(x, op):
    """The inclusive scan along axis 0, one row after another."""
    out = x.copy()
    for k in range(1, len(x)):
        out[k] = op(out[k - 1], x[k])
    return out


def _exclusive_max(x):
    head = np.full((1,) + x.shape[1:], np.iinfo(x.dtype).min, x.dtype)
    return np.concatenate([head, np.maximum.accumulate(x, 0)[:-1]])


INTS = RNG.integers(-9, 9, (5, 4))
FLOATS = RNG.random((3, 4, 2)) + 0.5
SPARSE = RNG.integers(0, 3, (6, 3)) * RNG.integers(0, 2, (6, 3))
GRID = RNG.random((6, 5))
CASES = {
    "sum": (lambda devs: scan(INTS, "sum", axis=0, device="all"), np.cumsum(INTS, 0)),
    "prod 3-d": (lambda devs: scan(FLOATS, "prod", axis=0, device=devs), np.cumprod(FLOATS, 0)),
    "exclusive max": (lambda devs: scan(INTS, "max", axis=0, inclusive=False, device=devs),
                      _exclusive_max(INTS)),
    "user op": (lambda devs: scan(SPARSE, first_nonzero, axis=0, device=devs),
                _sequential(SPARSE, lambda a, b: np.where(a != 0, a, b))),
    "view": (lambda devs: scan(interior(GRID, 1), "sum", axis=-2, device=devs),
             np.cumsum(GRID[1:-1, 1:-1], 0)),
}


@pytest.mark.parametrize("case", CASES)
def test_scan_along_axis_0_over_several_devices_is_numpys_and_warns_of_nothing(case, gpu_device, caplog):
    run, want = CASES[case]
    assert len(hetflow.devices()) > 1  # device="all" is several
    with caplog.at_level(logging.INFO, logger="hetflow"):
        for _ in range(2):  # every call: the same result, and nothing said
            got = run(["cpu0", gpu_device.id])
            assert got.dtype == want.dtype
            np.testing.assert_allclose(got, want, rtol=1e-13, atol=0)
    assert [r.getMessage() for r in caplog.records if r.name.startswith("hetflow")] == []

