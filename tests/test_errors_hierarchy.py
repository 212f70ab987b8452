"""The exception classes users rely on (issue 19 item 6): a short list under
hetflow.errors, only HetflowError at top level, and each error also the builtin a
generic handler catches. Oracles: Python's builtin exception classes and its
sequence protocol (iteration stops at the first IndexError)."""
import numpy as np
import pytest

import hetflow
from hetflow import errors
from hetflow.runtime.events import UserEvent

KEPT = {"HetflowError", "ArgumentError", "ArgumentTypeError", "ShapeError", "InvalidContextError",
        "IndexOutOfBoundsError", "DeviceError", "KernelError", "KernelCompileError", "KernelRaisedError",
        "EventFailedError", "HetflowTimeoutError", "RuleError", "RuleSyntaxError", "CommError",
        "CommTimeoutError", "RemoteError", "ScatteredWriteWarning", "HostCopyWarning"}


def _classes(namespace):
    return {name for name, value in namespace.items()
            if isinstance(value, type) and issubclass(value, (Exception, Warning))}


def test_all_lists_exactly_the_kept_classes():
    assert set(errors.__all__) == KEPT
    assert _classes(vars(errors)) == KEPT  # nothing defined beside them


def test_every_error_derives_from_the_root():
    for name in KEPT - {"ScatteredWriteWarning", "HostCopyWarning"}:
        assert issubclass(getattr(errors, name), errors.HetflowError), name


def test_star_import_brings_only_the_root():
    namespace = {}
    exec("from hetflow import *", namespace)
    assert _classes(namespace) == {"HetflowError"}
    assert hetflow.HetflowError is errors.HetflowError
    assert not hasattr(hetflow, "ShapeError") and not hasattr(hetflow, "DeviceError")


def test_an_impossible_view_is_a_shape_error_and_a_value_error():
    with pytest.raises(ValueError, match=r"section") as info:
        hetflow.section(np.zeros((3, 3)), (2, 2), (2, 2))  # reaches past the parent
    assert isinstance(info.value, errors.ShapeError) and isinstance(info.value, errors.HetflowError)


def test_a_non_integer_argument_is_a_type_error():
    with pytest.raises(TypeError, match="dim must be an integer") as info:
        hetflow.project(np.zeros((3, 3)), 0.5, 0)
    assert isinstance(info.value, errors.ArgumentTypeError) and isinstance(info.value, errors.ArgumentError)


def test_a_partition_iterates_by_the_index_error_of_its_last_part():
    parts = list(hetflow.partition(np.zeros((6, 2)), 3, 0))  # the sequence protocol
    assert len(parts) == 3
    with pytest.raises(IndexError) as info:
        hetflow.partition(np.zeros((6, 2)), 3, 0)[3]
    assert isinstance(info.value, errors.IndexOutOfBoundsError)


def test_an_unknown_device_is_a_device_error():
    with pytest.raises(RuntimeError, match="no device with id 'tpu9'") as info:
        hetflow.get_device("tpu9")
    assert isinstance(info.value, errors.DeviceError)


def test_an_unknown_reduction_is_a_value_error():
    with pytest.raises(ValueError, match="'mean'") as info:
        hetflow.reduce(np.ones(3), "mean")
    assert isinstance(info.value, errors.ArgumentError)


def test_a_wait_that_outlasts_its_timeout_is_a_timeout_error():
    with pytest.raises(TimeoutError) as info:
        UserEvent().wait(timeout=0.01)
    assert isinstance(info.value, errors.HetflowTimeoutError)


def test_a_peer_timeout_is_both_a_comm_error_and_a_timeout_error():
    assert issubclass(errors.CommTimeoutError, errors.CommError)
    assert issubclass(errors.CommTimeoutError, TimeoutError)
    assert issubclass(errors.RuleSyntaxError, SyntaxError) and issubclass(errors.RuleSyntaxError, errors.RuleError)
