"""Checking that all ranks called the same collective, fused with small reductions.

Every rank reduces a *header* (collective, length, shape, dtype, op, root, segments,
buffer kind, path) to a 56-bit digest. ``agree`` computes the maximum and minimum digest on
every rank with one native ``MPI_Iallreduce`` (MAX of [digest, -digest]), the same
tiny call whatever path the data then takes, so ranks that chose different paths
still meet in it. The two differ exactly when some ranks disagree, and then every rank
raises CommError, after gathering the headers to say who disagrees on what.

``ensure_agreed`` runs ``agree`` on the first call of each header per communicator
and remembers the headers all ranks passed: their repetitions are not checked again.

``small_allreduce`` is the small-message path of the ops and dtypes MPI cannot reduce
natively: recursive doubling over the ranks (folding the ranks beyond a power of two,
as the reduction does) whose messages carry [max, min] digest and data together, so
the check rides with the data even when ``agree`` was skipped (``check=False``). A
rank reduces a partner's payload only when the partner's [max, min] are both its own
digest, so mismatched lengths never corrupt memory; receives are sized for the
largest small payload.
"""
from __future__ import annotations

import hashlib
import math

import numpy as np

from hetflow.collectives import schedule
from hetflow.errors import CommError

HEADER_FIELDS = ("collective", "length", "shape", "dtype", "op", "root", "segments",
                 "buffers", "path")

# The small-message path never carries more than this: receives are sized for it.
MAX_SMALL_BYTES = 256 << 10

# Heads remembered per communicator as agreed on (ensure_agreed).
MAX_AGREED = 4096

_HEAD = 16  # two int64: the largest and smallest digest seen
_TAG = 1000  # apart from the schedule's tags (< 5 * 64)
_digests = {}
_mailboxes = {}


def header(name, shape, dtype, reduce_op, root, segments, buffers, path):
    """What every rank must agree on before data moves (fields: HEADER_FIELDS). The
    shape as well as the length: arrays of one length but other shapes would be reduced
    element by element in memory order, pairing elements of different indices."""
    return (name, math.prod(shape), shape, dtype, reduce_op.name, root, segments, buffers, path)


def object_header(name, root):
    """The header of a collective of picklable objects (bcast, allgather, barrier),
    checked on every call: it has no length, dtype or op, but meets the reductions'
    headers in :func:`agree`, so ranks that call collectives in other orders fail there,
    naming each rank's (where the reductions' call is checked: its first)."""
    return (name, None, None, None, None, root, None, "host", "objects")


_stamp = np.empty(2, np.int64)  # [digest, -digest], reduced by MAX to [max, -min]
_seen = np.empty(2, np.int64)


def agree(comm, transport, head) -> None:
    """Raise CommError on every rank unless all ranks passed the same ``head``."""
    digest = digest_of(head)
    _stamp[0], _stamp[1] = digest, -digest
    link = transport.link
    transport.wait([link.comm.Iallreduce(_stamp, _seen, op=link.MPI.MAX)],
                   "checking that all ranks made the same call")
    if _seen[0] != -_seen[1]:
        _mismatch(comm, head)


def ensure_agreed(comm, transport, head, always=False) -> None:
    """:func:`agree` on ``head`` the first time this communicator sees it (every time
    with ``always``); a head all ranks passed is remembered and not checked again.

    Ranks making the same calls remember the same heads, so they all skip the same
    checks. Forgetting (past MAX_AGREED heads) happens at the same call on every rank,
    and drops the prepared native calls with it (they rest on heads agreed on).
    """
    agreed = comm._agreed
    if head in agreed and not always:
        return
    agree(comm, transport, head)
    if len(agreed) >= MAX_AGREED:
        comm._forget()
    agreed.add(head)


def small_allreduce(comm, transport, head, reduce_op, source):
    """Check ``head`` and reduce ``source`` (contiguous, small) over all ranks at once.

    Returns a contiguous vector holding the result on every rank, valid until the
    next small collective (copy it out).
    """
    return _rounds(comm, transport, head, reduce_op, source)


class _Mailbox:
    """The send and receive buffers of one (payload size, dtype), with their views.

    Reused from call to call (views cost as much as the rest of a small call);
    collectives on one process run one at a time, as MPI requires.
    """

    inbox = None  # shared by all mailboxes: sized for any small message

    def __init__(self, nbytes, dtype):
        if _Mailbox.inbox is None:
            _Mailbox.inbox = np.empty(_HEAD + MAX_SMALL_BYTES, np.uint8)
        self.message = np.empty(_HEAD + nbytes, np.uint8)
        self.stamp = self.message[:_HEAD].view(np.int64)  # [max, min] digest seen
        self.heard = self.inbox[:_HEAD].view(np.int64)
        self.payload = self.message[_HEAD:].view(dtype)
        self.arrived = self.inbox[_HEAD:_HEAD + nbytes].view(dtype)


def _mailbox(nbytes, dtype) -> _Mailbox:
    key = (nbytes, dtype)
    box = _mailboxes.get(key)
    if box is None:
        if len(_mailboxes) >= 16:
            _mailboxes.clear()
        box = _mailboxes[key] = _Mailbox(nbytes, dtype)
    return box


def _rounds(comm, transport, head, reduce_op, source):
    digest = digest_of(head)
    box = _mailbox(source.nbytes, source.dtype)
    box.payload[...] = source
    payload, arrived, heard = box.payload, box.arrived, box.heard
    high = low = digest
    for step in schedule.plan(comm.rank, comm.size, 0, 0, True, True):
        requests = []
        if step.recv:
            requests.append(transport.irecv(box.inbox, step.partner, _TAG))
        if step.send:
            box.stamp[0], box.stamp[1] = high, low
            requests.append(transport.isend(box.message, step.partner, _TAG))
        transport.wait(requests, step)
        if not step.recv:
            continue
        their_high, their_low = heard.tolist()
        same = their_high == digest and their_low == digest
        if step.reduce:  # fold or recursive doubling: merge
            if same:
                reduce_op.combine(payload, arrived, payload)
            high, low = max(high, their_high), min(low, their_low)
        else:  # unfold: the partner's result is the result
            high, low = their_high, their_low
            if same:
                payload[...] = arrived
    if high != low:
        _mismatch(comm, head)
    return payload


def _mismatch(comm, head):
    readable = tuple(str(value) for value in head)
    raise CommError(_describe(comm._gather_all(readable)))  # every rank is here: in step


def digest_of(head) -> int:
    """``head``'s 56-bit digest, the same on every rank for heads that print alike."""
    digest = _digests.get(head)
    if digest is None:
        text = repr(tuple(str(value) for value in head)).encode()
        digest = int.from_bytes(hashlib.blake2b(text, digest_size=7).digest(), "little")
        if len(_digests) > 1024:
            _digests.clear()
        _digests[head] = digest
    return digest


def _describe(headers) -> str:
    calls = [h[0] for h in headers]
    if len(set(calls)) > 1:  # their other fields differ too, as a consequence
        ranks = ", ".join(f"rank {r}: {c}" for r, c in enumerate(calls))
        return (f"ranks called different collectives ({ranks}); every rank must make the same "
                f"collective calls in the same order")
    parts = []
    for i, field in enumerate(HEADER_FIELDS):
        values = [h[i] for h in headers]
        if len(set(values)) > 1:
            ranks = ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))
            parts.append(f"{field} ({ranks})")
    return f"{headers[0][0]}: ranks disagree on " + "; ".join(parts)
