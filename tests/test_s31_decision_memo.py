"""A co-executed launch's choice (co-execute, or one device alone) reads the performance
model at every launch; what it reads is kept between launches until the model changes
(``coexec._estimate``). Oracle: the same estimate worked out afresh from the model."""
import numpy as np
import pytest

import hetflow
from hetflow.runtime import coexec
from hetflow.runtime.perfmodel import PerfModel


@hetflow.kernel
def triple(i, x, out):
    out[i] = 3.0 * x[i]


@pytest.mark.simgpu
def test_the_estimate_kept_between_launches_follows_every_change_of_the_model(gpu_device, tmp_path):
    rng = np.random.default_rng(31)
    model = PerfModel(tmp_path / "perfmodel.json")
    targets = (hetflow.get_device("cpu0"), gpu_device)
    n_gpus, _, _, counts, names = coexec._workers_of(triple, targets, 1)
    assert n_gpus == 1 and counts == (1, 1) and names[0].endswith(coexec.TEAM)
    key = coexec.history_key(triple, 1, (hetflow.array(np.zeros(4)),), n_gpus)
    alone_keys = [coexec._device_key(d) + coexec.ALONE for d in targets]
    answers = set()
    for _ in range(400):
        action = rng.integers(7)
        rate = float(10 ** rng.uniform(4, 8))
        if action == 0:
            model.observe(key, names[rng.integers(2)], rate)
        elif action == 1:
            model.observe(key, alone_keys[rng.integers(2)], rate)
        elif action == 2:
            model.observe_overhead(key, float(rng.uniform(0, 1e-2)))
        elif action == 3:
            model.save()
        elif action == 4 and rng.random() < 0.1:
            model.forget()
        rows = int(rng.choice([1000, 4096]))
        kept = coexec._estimate(model, key, targets, names, counts, rows)
        coexec._estimates.clear()
        assert kept == coexec._estimate(model, key, targets, names, counts, rows)
        answers.add(None if kept is None else (kept[0], kept[1] is None))
    # every kind of answer came up: learn more, measure a device alone, or choose
    assert {None, (1, True), (0, False), (1, False)} <= answers, answers


@pytest.mark.simgpu
def test_the_workers_of_a_launch_are_worked_out_once_per_kernel_and_devices(gpu_device):
    targets = (hetflow.get_device("cpu0"), gpu_device)
    first = coexec._workers_of(triple, targets, 1)
    assert coexec._workers_of(triple, targets, 1) is first
    assert coexec._workers_of(triple, targets[:1], 1) != first  # the CPU alone: a worker per core
    n_gpus, cores, team, counts, _ = coexec._workers_of(triple, targets[:1], 1)
    assert (n_gpus, team, counts) == (0, False, cores)
