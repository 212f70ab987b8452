"""Only hetflow's errors (issue 23, "Only hetflow's errors"): each input that escaped as a
raw Python or Numba exception raises a HetflowError subclass naming what and where,
before anything runs. Oracles: the exception types and NumPy."""
import numpy as np
import pytest

import hetflow
from hetflow.errors import ArgumentError, HetflowError, KernelRaisedError


@hetflow.kernel
def scaled(i, a, x, out):
    out[i] = a * x[i]


@hetflow.kernel
def plus_one(i, x, out):
    out[i] = x[i] + 1


@hetflow.kernel
def past_the_end(i, x, out):
    out[i] = x[i + 10]


def _read_only(n):
    out = np.zeros(n)
    out.flags.writeable = False
    return out


CASES = {
    "no device": (lambda: hetflow.forall(4, scaled, 1.0, np.ones(4), np.zeros(4), device=[]),
                  ArgumentError, r"device \[\] names no device"),
    "a device twice": (lambda: hetflow.forall(4, scaled, 1.0, np.ones(4), np.zeros(4), device=["cpu0", "cpu0"]),
                       ArgumentError, r"device \['cpu0', 'cpu0'\] names cpu0 more than once"),
    "a 70-bit scalar": (lambda: hetflow.forall(4, scaled, 2**70, np.ones(4), np.zeros(4)),
                        ArgumentError, r"argument 'a': the integer 1180591620717411303424 does not fit"),
    "read-only output on cpu0": (lambda: hetflow.forall(4, plus_one, np.ones(4), _read_only(4), device="cpu0"),
                                 ArgumentError, r"writes argument 'out', but that array is read-only"),
    "read-only output on gpu0": (lambda: hetflow.forall(4, plus_one, np.ones(4), _read_only(4), device="gpu0"),
                                 ArgumentError, r"writes argument 'out', but that array is read-only"),
    "out of bounds on the simulated GPU": (
        lambda: hetflow.forall(4, past_the_end, np.ones(4), np.zeros(4), device="gpu0"),
        KernelRaisedError, r"kernel 'past_the_end' raised IndexError on gpu0 in rows \[0, 4\)"),
}
SIMULATED = {"read-only output on gpu0", "out of bounds on the simulated GPU"}


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.simgpu) if c in SIMULATED else c
                                  for c in CASES])
def test_raises_a_hetflow_error(case):
    call, kind, message = CASES[case]
    with pytest.raises(kind, match=message) as info:
        call()
    assert isinstance(info.value, HetflowError)


def test_a_70_bit_scalar_is_rejected_after_a_launch_that_fitted():
    out = np.zeros(4)
    hetflow.forall(4, scaled, 3, np.ones(4), out)
    np.testing.assert_array_equal(out, 3.0)
    with pytest.raises(ArgumentError, match="does not fit int64"):
        hetflow.forall(4, scaled, 2**63, np.ones(4), out)
    hetflow.forall(4, scaled, -2**63, np.ones(4), out)  # the smallest int64 still fits
    np.testing.assert_array_equal(out, float(-2**63))


def test_a_read_only_output_is_refused_before_anything_ran():
    x, out = np.ones(4), np.zeros(4)
    out.flags.writeable = False
    with pytest.raises(ArgumentError):
        hetflow.forall(4, plus_one, x, out)
    assert not out.any()


def test_a_co_map_function_made_by_exec_runs():
    ns = {}
    exec("def backwards(idx):\n    return (7 - idx[0],)\n", ns)
    x, out = np.arange(8.0), np.zeros(8)
    hetflow.forall(8, plus_one, hetflow.co_map(x, ns["backwards"], (8,)), out)
    np.testing.assert_array_equal(out, x[::-1] + 1)


def test_a_rule_file_that_is_not_utf8_names_file_and_line(tmp_path):
    from hetflow.errors import RuleSyntaxError
    from hetflow.ir import RuleSet

    path = tmp_path / "bad.rules"
    path.write_bytes(b"# fine\nname = \"\xff\"\n")
    with pytest.raises(RuleSyntaxError, match=r"bad.rules:2:9: the rule file is not UTF-8 \(byte 0xff\)"):
        RuleSet.load(path)


@pytest.mark.parametrize("path", [None, 3])
def test_a_rule_file_named_by_no_path(path):
    from hetflow.errors import RuleError
    from hetflow.ir import RuleSet

    with pytest.raises(RuleError, match="a rule file is named by a path"):
        RuleSet.load(path)


@pytest.mark.parametrize("timeout", ["1", float("nan"), -1.0, True])
def test_a_wait_with_a_timeout_that_is_no_number_of_seconds(timeout):
    from hetflow.errors import ArgumentError

    with pytest.raises(ArgumentError, match="timeout must be None or a non-negative number of seconds"):
        hetflow.UserEvent().wait(timeout=timeout)


def test_an_infinite_timeout_waits_without_limit():
    import threading

    event = hetflow.UserEvent()
    threading.Timer(0.05, event.set_complete).start()
    event.wait(timeout=float("inf"))
    assert event.done


def test_a_rule_file_syntax_error_names_its_place_once(tmp_path):
    """Before, SyntaxError's own " (bad.toml, line 1)" followed the place the message gives."""
    from hetflow.errors import RuleSyntaxError
    from hetflow.ir import RuleSet

    path = tmp_path / "bad.toml"
    path.write_text("[[rule\nname = 1\n")
    with pytest.raises(RuleSyntaxError) as info:
        RuleSet.load(path)
    text = str(info.value)  # tomllib's own words follow the place
    assert text.startswith(f"{path}:1:7: Expected ']") and "line 1)" not in text and text.count("bad.toml") == 1
    assert (info.value.filename, info.value.lineno, info.value.offset) == (str(path), 1, 7)
