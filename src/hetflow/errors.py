"""hetflow's exceptions: one class per situation a user would catch.

Every error hetflow raises derives from :class:`HetflowError` and from the matching
builtin, so ``except ValueError`` or ``except TimeoutError`` keeps working. The classes
are reached as ``hetflow.errors.X``; only ``HetflowError`` is also ``hetflow.HetflowError``.

Families, and why each exists (docs/guide/errors.md has the table of who raises what):

- :class:`ArgumentError` (a ``ValueError``): a call was given something it cannot use.
  Programs fix these rather than catch them, so one class covers every plain check;
  :class:`ArgumentTypeError` (also a ``TypeError``) is the wrong *kind* of argument,
  :class:`ShapeError` extents, views and aliasing that do not fit, and
  :class:`InvalidContextError` a context used after its release (which a library handed a
  context can meet without a bug of its own).
- :class:`IndexOutOfBoundsError` (an ``IndexError``): an index outside an extent, on the
  host or in a checked kernel.
- :class:`DeviceError`: no device fits, or one failed and its work could not run elsewhere:
  the place to fall back to another device.
- :class:`KernelError`: a kernel could not be prepared; :class:`KernelCompileError` it does
  not compile; :class:`KernelRaisedError` its own code raised (not the device's fault).
- :class:`EventFailedError`: the work behind an event raised or was cancelled.
- :class:`HetflowTimeoutError` (a ``TimeoutError``): a wait, a device or a peer was too slow.
- :class:`RuleError`: a rule or rule set is wrong or loops; :class:`RuleSyntaxError` (a
  ``SyntaxError``) a rule file or expression that does not parse, with its position.
- :class:`CommError`: a collective or distributed run failed; :class:`CommTimeoutError` a
  peer died or never arrived, :class:`RemoteError` another rank raised.

Warnings go through :func:`warn_user`, which names the user's line that led to them.
"""

import os
import sys
import warnings

__all__ = ["ArgumentError", "ArgumentTypeError", "CommError", "CommTimeoutError", "DeviceError",
           "EventFailedError", "HetflowError", "HetflowTimeoutError", "HostCopyWarning", "IndexOutOfBoundsError",
           "InvalidContextError", "KernelCompileError", "KernelError", "KernelRaisedError", "RemoteError",
           "RuleError", "RuleSyntaxError", "ScatteredWriteWarning", "ShapeError"]


class HetflowError(Exception):
    """Root of every error hetflow raises."""


# -- argument checks ----------------------------------------------------------------
class ArgumentError(HetflowError, ValueError):
    """A call was given something it cannot use: a bad value (an unknown operation name,
    bad shares or timeout, a bad collective root), or an object in a state that does not
    allow the call (a closed queue, a graph not captured yet, a user event set twice)."""


class ArgumentTypeError(ArgumentError, TypeError):
    """An argument has the wrong kind: not a hetflow kernel, the wrong number of kernel
    arguments, not an integer, not an array or view, or an element type the operation does
    not take."""


class ShapeError(ArgumentError):
    """Extents, ranks or views do not fit: a launch extent larger than an array, an
    impossible view, or arguments that alias (a write overlapping another argument's
    reads at other indices)."""


class InvalidContextError(ArgumentError):
    """A context was used after its last release, or is unknown."""


class IndexOutOfBoundsError(HetflowError, IndexError):
    """An index lies outside the extent of the array or view it reads or writes: a view's
    or partition's element access, or a checked kernel's (boundscheck), which names the
    kernel, the parameter, the axis and the index (``None`` where unknown)."""

    def __init__(self, message, kernel=None, array=None, axis=None, index=None):
        super().__init__(message)
        self.kernel, self.array, self.axis, self.index = kernel, array, axis, index


# -- devices and kernels ------------------------------------------------------------
class DeviceError(HetflowError, RuntimeError):
    """No device meets the stated requirements, one is unusable, or one failed while
    running work that could not be run again elsewhere."""


class KernelError(HetflowError):
    """A kernel could not be prepared or launched (no readable source, no executable for a
    device, a released kernel)."""


class KernelCompileError(KernelError):
    """A kernel failed to compile; names the kernel, its file and line."""


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


# -- runtime ------------------------------------------------------------------------
class EventFailedError(HetflowError, RuntimeError):
    """The work behind an event did not complete: its execution instance raised, or was
    cancelled (one it depends on failed, or it was never submitted)."""


class HetflowTimeoutError(HetflowError, TimeoutError):
    """A wait, a device or a peer did not answer in time."""


# -- dynamic IR ---------------------------------------------------------------------
class RuleError(HetflowError):
    """A rule or rule set is wrong, or rules kept re-triggering each other."""


class RuleSyntaxError(RuleError, SyntaxError):
    """A rule file or rule expression does not parse (file, line, column)."""

    def __str__(self):  # the message names the place: not again, as SyntaxError's " (file, line N)"
        return str(self.msg)


# -- distributed --------------------------------------------------------------------
class CommError(HetflowError):
    """A collective, point-to-point operation or distributed run failed (ranks that
    disagree on a collective's arguments, a broken channel)."""


class CommTimeoutError(CommError, HetflowTimeoutError):
    """A peer died or never arrived."""


class RemoteError(CommError):
    """Another rank raised; carries that rank's message."""


class ScatteredWriteWarning(UserWarning):
    """A parallel launch writes an array at indices that are no function of its launch
    index, without :mod:`hetflow.atomic`: updates of one element race and may be lost."""


class HostCopyWarning(UserWarning):
    """Launches keep copying one large NumPy array to a GPU: ``hetflow.array`` would keep
    it there between launches."""


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn_user(message: str, category: type[Warning]) -> None:
    """``warnings.warn`` naming the line outside hetflow that led here (the user's call),
    not hetflow's own; a warning from a worker thread, with no such line, names its
    caller in hetflow."""
    frame, level = sys._getframe(1), 2  # stacklevel 2: warn_user's caller
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level if frame is not None else 2)
