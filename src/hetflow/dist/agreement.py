"""Checking that all ranks called the same collective, fused with small reductions.

Every rank reduces a *header* (collective, length, dtype, op, root, segments, buffer
kind, path) to a 56-bit digest. Recursive doubling over the ranks (folding the ranks
beyond a power of two, as the reduction does) computes the maximum and minimum digest
on every rank: they differ exactly when some ranks disagree, and then every rank
raises CommMismatchError, after gathering the headers to say who disagrees on what.

For small messages the payload rides in the same messages ([max, min] + data): one
message per step does both the check and the reduction, so checking costs nothing.
A rank reduces a partner's payload only when the partner's [max, min] are both its
own digest, so mismatched lengths never corrupt memory. Receives are sized for the
largest small payload, so a rank on the small path and one on the large path still
match their messages and both learn of the mismatch.
"""
from __future__ import annotations

import hashlib

import numpy as np

from hetflow.dist import schedule
from hetflow.errors import CommMismatchError

HEADER_FIELDS = ("collective", "length", "dtype", "op", "root", "segments", "buffers",
                 "path")

# The small-message path never carries more than this: receives are sized for it.
MAX_SMALL_BYTES = 256 << 10

_HEAD = 16  # two int64: the largest and smallest digest seen
_TAG = 1000  # apart from the schedule's tags (< 5 * 64)
_digests = {}
_mailboxes = {}


def header(name, n, dtype, reduce_op, root, segments, buffers, small):
    """What every rank must agree on before data moves (fields: HEADER_FIELDS)."""
    return (name, n, dtype, reduce_op.name, root, segments, buffers,
            "small" if small else "pipelined")


def agree(comm, transport, head) -> None:
    """Raise CommMismatchError on every rank unless all ranks passed the same ``head``."""
    _rounds(comm, transport, head, None, None)


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
        self.payload = self.arrived = None
        if dtype is not None:
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
    digest = _digest(head)
    if source is None:
        box = _mailbox(0, None)
    else:
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
            if same and payload is not None:
                reduce_op.combine(payload, arrived, payload)
            high, low = max(high, their_high), min(low, their_low)
        else:  # unfold: the partner's result is the result
            high, low = their_high, their_low
            if same and payload is not None:
                payload[...] = arrived
    if high != low:
        readable = tuple(str(value) for value in head)
        raise CommMismatchError(_describe(comm.allgather(readable)))
    return payload


def _digest(head) -> int:
    digest = _digests.get(head)
    if digest is None:
        text = repr(tuple(str(value) for value in head)).encode()
        digest = int.from_bytes(hashlib.blake2b(text, digest_size=7).digest(), "little")
        if len(_digests) > 1024:
            _digests.clear()
        _digests[head] = digest
    return digest


def _describe(headers) -> str:
    parts = []
    for i, field in enumerate(HEADER_FIELDS):
        values = [h[i] for h in headers]
        if len(set(values)) > 1:
            ranks = ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))
            parts.append(f"{field} ({ranks})")
    return f"{headers[0][0]}: ranks disagree on " + "; ".join(parts)
