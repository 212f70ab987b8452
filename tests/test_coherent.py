"""Coherent arrays (hetflow.array / Buffer): launches on cpu0, the (simulated) GPU and
both, interleaved with host reads and writes, give NumPy's sequential result, and data
moves only when a launch or a read needs it."""
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hetflow
from hetflow import cshift, interior, transpose
from hetflow.errors import HostCopyWarning

N = 5


@hetflow.kernel
def blend(i, j, out, src, a):
    out[i, j] = a * src[i, j] + 0.5 * out[i, j]


@hetflow.kernel
def heat(i, j, new, c, n, s, w, e):
    new[i, j] = c[i, j] + 0.1 * (n[i, j] + s[i, j] + w[i, j] + e[i, j] - 4.0 * c[i, j])


# (view over a hetflow array, the same view of a NumPy array, its inverse)
VIEWS = {
    "id": (lambda x: x, lambda m: m, lambda m: m),
    "roll0": (lambda x: cshift(x, 0, 2), lambda m: np.roll(m, -2, 0), lambda m: np.roll(m, 2, 0)),
    "roll1": (lambda x: cshift(x, 1, -1), lambda m: np.roll(m, 1, 1), lambda m: np.roll(m, -1, 1)),
    "T": (lambda x: transpose(x, 0, 1), lambda m: m.T, lambda m: m.T),
}

op = st.one_of(
    st.tuples(st.just("launch"), st.sampled_from(["cpu0", "gpu0", "both"]), st.integers(0, 2),
              st.integers(0, 2), st.sampled_from(sorted(VIEWS)), st.sampled_from(sorted(VIEWS)),
              st.floats(-2, 2, allow_nan=False)),
    st.tuples(st.just("read"), st.integers(0, 2)),
    st.tuples(st.just("write"), st.integers(0, 2), st.floats(-5, 5, allow_nan=False)),
    st.tuples(st.just("map"), st.integers(0, 2), st.integers(0, N - 1)),
    st.tuples(st.just("setitem"), st.integers(0, 2), st.integers(0, N - 1), st.floats(-5, 5, allow_nan=False)),
)


@pytest.mark.simgpu
@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(op, min_size=1, max_size=5))
def test_random_programs_match_numpy(gpu_device, program):
    rng = np.random.default_rng(len(program))
    model = [rng.random((N, N)) for _ in range(3)]
    arrays = [hetflow.array(m) for m in model]
    devices = {"cpu0": "cpu0", "gpu0": gpu_device.id, "both": ["cpu0", gpu_device.id]}
    for step in program:
        if step[0] == "launch":
            _, dev, k_out, k_src, v_out, v_src, a = step
            if k_out == k_src:
                k_src = (k_src + 1) % 3  # no aliasing: another array is read
            make_out, np_out, inverse = VIEWS[v_out]
            make_src, np_src, _ = VIEWS[v_src]
            hetflow.forall((N, N), blend, make_out(arrays[k_out]), make_src(arrays[k_src]), a,
                           device=devices[dev])
            model[k_out] = inverse(a * np_src(model[k_src]) + 0.5 * np_out(model[k_out]))
        elif step[0] == "read":
            np.testing.assert_allclose(np.asarray(arrays[step[1]]), model[step[1]], rtol=1e-12)
        elif step[0] == "write":
            arrays[step[1]].write(step[2])
            model[step[1]][...] = step[2]
        elif step[0] == "map":
            arrays[step[1]].map()[step[2]] += 1.0  # the host copy itself, written in place
            model[step[1]][step[2]] += 1.0
        else:
            arrays[step[1]][step[2]] = step[3]   # a row, written as NumPy writes it
            model[step[1]][step[2]] = step[3]
    for got, want in zip(arrays, model):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)


def _heat_steps(u, v, steps, device):
    for _ in range(steps // 2):
        for src, dst in ((u, v), (v, u)):
            hetflow.forall((src.shape[0] - 2, src.shape[1] - 2), heat, interior(dst, 1), interior(src, 1),
                           interior(cshift(src, 0, -1), 1), interior(cshift(src, 0, 1), 1),
                           interior(cshift(src, 1, -1), 1), interior(cshift(src, 1, 1), 1), device=device)


def _numpy_heat(u, steps):
    u = u.copy()
    for _ in range(steps):
        c = u[1:-1, 1:-1]
        u[1:-1, 1:-1] = c + 0.1 * (u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:] - 4.0 * c)
    return u


def _transfers_of_a_gpu_program(device, shape, steps):
    start = np.random.default_rng(1).random(shape)
    u, v = hetflow.array(start), hetflow.array(start)
    _heat_steps(u, v, steps, device)
    assert u.moved == {"to_device": u.nbytes, "to_host": 0}  # the grid went in once, nothing came back
    np.testing.assert_allclose(np.asarray(u), _numpy_heat(start, steps), rtol=1e-12)
    assert u.moved == {"to_device": u.nbytes, "to_host": u.nbytes}  # and out once, when read
    assert v.moved["to_host"] == 0


@pytest.mark.simgpu
def test_a_gpu_program_moves_the_grid_once_in_and_once_out(gpu_device):
    _transfers_of_a_gpu_program(gpu_device.id, (8, 7), 100)


@pytest.mark.gpu
def test_a_gpu_program_moves_the_grid_once_in_and_once_out_on_a_real_gpu():
    _transfers_of_a_gpu_program("gpu0", (256, 300), 100)


@pytest.mark.gpu
def test_cupy_interoperation_without_transfers():
    from hetflow.cuda_compat import cupy_module

    cp = cupy_module()
    d = cp.arange(12.0).reshape(3, 4)
    a = hetflow.array(d)  # starts on the GPU: nothing to copy in
    assert a.valid == ("gpu0",)
    hetflow.forall((3, 4), blend, a, hetflow.array(np.ones((3, 4))), 2.0, device="gpu0")
    g = a.cupy()
    assert a.moved["to_device"] == 0 and isinstance(g, cp.ndarray)
    np.testing.assert_allclose(g.get(), 2.0 + 0.5 * np.arange(12.0).reshape(3, 4))
    g *= 2  # the caller writes the GPU copy: the host copy is stale now
    np.testing.assert_allclose(a.numpy(), 2 * (2.0 + 0.5 * np.arange(12.0).reshape(3, 4)))
    assert cp.from_dlpack(a).data.ptr == g.data.ptr


def test_host_interoperation():
    x = np.arange(6.0)
    a = hetflow.array(x)
    x[0] = 99  # a holds a copy
    assert np.asarray(a)[0] == 0 and a.numpy()[0] == 0 and str(a) == str(np.arange(6.0))
    with pytest.raises(ValueError):
        np.asarray(a)[1] = 5  # read-only: writes go through write() or map()
    np.testing.assert_array_equal(np.from_dlpack(a), np.arange(6.0))
    assert float(hetflow.reduce(a, "sum")) == 15.0
    assert hetflow.reduce(interior(a, 1), "max") == 4.0
    interior(a, 1).assign(-1.0)
    np.testing.assert_array_equal(a.numpy(), [0, -1, -1, -1, -1, 5])
    a[1:3] = [7.0, 8.0]  # on the host, as NumPy writes
    np.testing.assert_array_equal(a.numpy(), [0, 7, 8, -1, -1, 5])


@pytest.mark.simgpu
def test_a_co_executed_program_moves_halo_rows_not_the_grid(gpu_device):
    """Static shares: each device keeps its block of rows from step to step; per step
    only the rows next to the split cross between the host and the GPU."""
    n, steps = 16, 100
    start = np.random.default_rng(2).random((n, n))
    u, v = hetflow.array(start), hetflow.array(start)
    for _ in range(steps // 2):
        for src, dst in ((u, v), (v, u)):
            hetflow.forall((n - 2, n - 2), heat, interior(dst, 1), interior(src, 1),
                           interior(cshift(src, 0, -1), 1), interior(cshift(src, 0, 1), 1),
                           interior(cshift(src, 1, -1), 1), interior(cshift(src, 1, 1), 1),
                           device=["cpu0", gpu_device.id], schedule="static", shares=[1, 1])
    np.testing.assert_allclose(u.numpy(), _numpy_heat(start, steps), rtol=1e-12)
    row = start[0].nbytes
    moved = sum(a.moved["to_device"] + a.moved["to_host"] for a in (u, v))
    # the GPU's block once in, then a row each way per array and step (and u out at the end)
    assert moved <= 2 * start.nbytes + (4 * steps + 8) * row, moved / row
    assert moved >= steps * row  # halo rows did cross: both devices ran every step


@hetflow.kernel
def double(i, out, x):
    out[i] = 2.0 * x[i]


def _launches_warned(monkeypatch, device, make, launches=4):
    """Which of ``launches`` launches of ``double`` (over ``make(array)``) gave a
    HostCopyWarning, with the hint's threshold lowered to these arrays' size."""
    from hetflow.runtime import staging

    monkeypatch.setattr(staging, "HINT_BYTES", 64)
    monkeypatch.setattr(staging, "_copies", {})
    monkeypatch.setattr(staging, "_hinted", __import__("threading").Event())
    x, out = np.arange(16.0), np.zeros(16)
    warned = []
    for k in range(launches):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            hetflow.forall(16, double, make(out), make(x), device=device)
        warned += [(k, str(w.message)) for w in caught if issubclass(w.category, HostCopyWarning)]
        assert all(w.filename == __file__ for w in caught if issubclass(w.category, HostCopyWarning))
    np.testing.assert_array_equal(np.asarray(make(out)), 2.0 * x)  # out itself, or its coherent array
    return warned


@pytest.mark.simgpu
def test_a_numpy_array_copied_to_a_gpu_again_and_again_gets_one_hint(monkeypatch, gpu_device):
    warned = _launches_warned(monkeypatch, gpu_device.id, lambda a: a)
    assert [k for k, _ in warned] == [2]  # the third copy, and only once
    assert "'double'" in warned[0][1] and "hetflow.array" in warned[0][1]


@pytest.mark.simgpu
def test_coherent_arrays_and_the_cpu_get_no_hint(monkeypatch, gpu_device):
    assert _launches_warned(monkeypatch, "cpu0", lambda a: a) == []
    kept = {}
    assert _launches_warned(monkeypatch, gpu_device.id, lambda a: kept.setdefault(id(a), hetflow.array(a))) == []
