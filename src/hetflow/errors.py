"""hetflow's exception hierarchy: every error hetflow raises derives from HetflowError.

Errors also derive from the matching builtin (ValueError, TypeError, TimeoutError)
so that generic handlers keep working.
"""


class HetflowError(Exception):
    """Root of every error hetflow raises."""


# -- platform ---------------------------------------------------------------
class DeviceError(HetflowError):
    """A device is missing, unusable or failed."""


class NoDeviceError(DeviceError, LookupError):
    """No device satisfies the stated requirements."""


class DeviceFailure(DeviceError, RuntimeError):
    """A device raised or disappeared while running work."""


class InvalidContextError(HetflowError, ValueError):
    """A context was used after its last release, or is unknown."""


# -- kernels ----------------------------------------------------------------
class KernelError(HetflowError):
    """A kernel could not be prepared or launched."""


class KernelCompileError(KernelError):
    """A kernel failed to compile; names the kernel, its file and line."""


class KernelArgumentError(KernelError, TypeError):
    """Wrong number or kinds of kernel arguments."""


class NoExecutableError(KernelError, LookupError):
    """No compatible executable exists and there is no source to compile."""


class IndexOutOfBoundsError(KernelError, IndexError):
    """A checked kernel (boundscheck) indexed an array outside its extent; names the
    kernel, the parameter, the axis and the index (``None`` where unknown)."""

    def __init__(self, message, kernel=None, array=None, axis=None, index=None):
        super().__init__(message)
        self.kernel, self.array, self.axis, self.index = kernel, array, axis, index


class KernelRaisedError(KernelError, RuntimeError):
    """The kernel's own code raised (a ``raise`` in it, an error of an operation it
    called): not a fault of the device, so co-execution does not run its rows again.
    Names the kernel and, where known, the device and the rows ``[lo, hi)`` of the
    chunk that raised; the kernel's exception is ``__cause__``."""

    def __init__(self, message, kernel=None, device=None, rows=None):
        super().__init__(message)
        self.kernel, self.device, self.rows = kernel, device, rows

    @classmethod
    def of(cls, kernel: str, device, lo, hi, exc: BaseException) -> "KernelRaisedError":
        """The error for ``exc`` raised by ``kernel`` running rows ``[lo, hi)`` on ``device``
        (a device id; None and None where unknown)."""
        where = f" on {device}" if device else ""
        rows = f" in rows [{lo}, {hi})" if lo is not None else ""
        detail = f": {exc}" if str(exc) else ""
        return cls(f"kernel {kernel!r} raised {type(exc).__name__}{where}{rows}{detail}", kernel, device,
                   None if lo is None else (lo, hi))


# -- index spaces and views ---------------------------------------------------
class ShapeError(HetflowError, ValueError):
    """Extents, ranks or dtypes do not fit."""


class ViewError(ShapeError):
    """A view operator was given impossible parameters."""


class AliasingError(ViewError):
    """A launch writes, through one argument, elements of an array that another argument
    reads or writes at other indices: the result would depend on the order of the indices."""


class IndexTypeError(ShapeError, TypeError):
    """An index, extent or indexable argument has the wrong type (not an integer, not an array or view)."""


class IndexOutOfRangeError(ViewError, IndexError):
    """An index lies outside the extent of the view or array it reads or writes."""


class DTypeError(ShapeError, TypeError):
    """An element type does not fit the operation (e.g. a bitwise op on floats)."""


# -- runtime ------------------------------------------------------------------
class RuntimeFailure(HetflowError, RuntimeError):
    """Work run by the runtime failed."""


class EventFailedError(RuntimeFailure):
    """The execution instance behind an event raised."""


class DependencyCancelledError(RuntimeFailure):
    """An instance was cancelled because one it depends on failed."""


class DependencyCycleError(RuntimeFailure, ValueError):
    """Explicit dependencies form a cycle."""


class QueueError(HetflowError, ValueError):
    """A queue, event or buffer was used wrongly (closed queue, bad wait list, set twice)."""


class ScheduleError(HetflowError, ValueError):
    """A loop was given invalid workers, shares, chunk sizes or schedule."""


class UnknownOpError(HetflowError, ValueError):
    """A call site (reduce, scan) was given an operation name it does not know."""


class TraceError(HetflowError, ValueError):
    """A trace file, recording, timeline or progress bar was given bad input or used wrongly."""


class HetflowTimeoutError(HetflowError, TimeoutError):
    """A wait, a device or a peer did not answer in time."""


# -- dynamic IR ---------------------------------------------------------------
class RuleError(HetflowError):
    """A rule or rule set is wrong."""


class RuleSyntaxError(RuleError, SyntaxError):
    """A rule file or rule expression does not parse (file, line, column)."""


class RuleLoopError(RuleError):
    """Rules kept re-triggering each other past the round limit."""


class GraphError(HetflowError):
    """A captured graph is malformed or used wrongly."""


class MonitorError(HetflowError, ValueError):
    """A monitor event or variable is malformed."""


# -- distributed ----------------------------------------------------------------
class CommError(HetflowError):
    """A collective or point-to-point operation failed."""


class CommMismatchError(CommError, ValueError):
    """Ranks disagree on the length, dtype or operation of a collective."""


class CommArgumentError(CommError, ValueError):
    """A collective was called with an unknown op, a bad root or bad segments."""


class CommTimeoutError(CommError, HetflowTimeoutError):
    """A peer died or never arrived."""


class RemoteError(CommError):
    """Another rank raised; carries that rank's message."""


class ScatteredWriteWarning(UserWarning):
    """A parallel launch writes an array at indices that are no function of its launch
    index, without :mod:`hetflow.atomic`: updates of one element race and may be lost."""
