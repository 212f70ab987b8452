"""Dependencies between execution instances (SPEC §2 "Execution queue", item 2).

**Implicit** dependencies come from the data. The runtime knows which arguments a
kernel reads and which it writes (``kernel.access``) and keeps, per datum, the last
instance that wrote it and the instances that read it since. In enqueue order, across
all queues (like StarPU's sequential consistency), an instance that

* reads a datum waits for its last writer (read-after-write),
* writes a datum waits for its last writer (write-after-write) and for the readers
  since (write-after-read).

A datum is a :class:`~hetflow.Buffer`, or the array that owns an argument's memory:
a view stands for its root array, and NumPy views of one array (slices, reshapes,
``as_strided``, ``sliding_window_view``, ``np.frombuffer(x.data)``) are one datum, so
instances touching disjoint parts of one array are still ordered (conservative).

**Explicit** dependencies are ``wait_for`` events.

Read-after-write and explicit dependencies are *strong*: if the event waited for
fails, the waiter cannot have its inputs and is cancelled — once everything else it
waits for is over, so that it keeps its place in the order of what comes after it.
Write-after-read and write-after-write are only an order, so a failure there just
releases the waiter.
Data whose last writer failed (or was cancelled) is *poisoned*: an instance reading
it is cancelled however long after the failure it is enqueued, rather than run on
garbage — until the failure has been reported to the application (``wait`` raised or
``exception`` returned it, or ``finish`` raised the queue's failures), from when on the
application owns the data's state, or until the data is written again.

What the runtime keeps per datum lives while it tells something. A datum whose whole
state is a pending last writer (no readers since: a fresh output, each link of a chain)
is represented by that instance alone, and forgotten when it completes; otherwise a
record holds the last writer and the readers since, dropped once that writer has
completed and those readers are done (a fan-out over fresh arrays, outputs or inputs,
must not keep a record, and through it a finished instance, per array, however long
the arrays live), and when the datum goes (a weak-reference callback). Objects without
weak references (rare) are forgotten once nothing pending touches them.

**Cycles.** An instance can only wait for events that exist when it is enqueued, so
plain enqueues can never form a cycle. Deferred instances (``enqueue(..., defer=True)``)
can: they exist, and others may wait for them, before they are submitted, and
``submit(event, wait_for=...)`` adds dependencies to an instance that others already
depend on. ``submit`` therefore searches the pending dependency graph from the new
``wait_for`` events; reaching the submitted event means the new edges close a cycle
(which would never run), and :class:`~hetflow.errors.ArgumentError` names it.
"""
from __future__ import annotations

import weakref

from numpy import ndarray

from ..errors import ArgumentError
from .events import COMPLETE, DONE, add_dependent, cancelled_error, dependents
from .launch import SCALARS

READ, WRITE = 1, 2


class _Datum(weakref.ref):
    """What the runtime remembers about one datum: a weak reference to it (one object
    per datum keeps the garbage collector's load down), dropped when the datum goes."""

    __slots__ = ("key", "writer", "readers", "prune_at")

    # Set up in __new__ alone (weakref.ref's own __init__ then only unpacks the arguments):
    # one Python call per new datum, which a fan-out over fresh arrays makes per enqueue.
    def __new__(cls, obj, key):
        self = weakref.ref.__new__(cls, obj, _forget)
        self.key = key
        self.writer = None     # the last instance that wrote it
        self.readers = None    # the instances that read it since (a list, made on demand)
        self.prune_at = 32
        return self


class _Pinned:
    """The record of a datum without weak references: kept while pending instances use it."""

    __slots__ = ("obj", "writer", "readers", "prune_at", "live")

    def __init__(self, obj):
        self.obj = obj
        self.writer = None
        self.readers = None
        self.prune_at = 32
        self.live = 0


_RECORDS = frozenset((_Datum, _Pinned))
# id(datum) -> its record, or the pending instance that last wrote it while that is all
# there is to know (no record made: see the module's docstring).
_data: dict[int, object] = {}


def datum(arg):
    """The object whose identity names the data ``arg`` accesses."""
    root = arg if type(arg) is ndarray else getattr(arg, "root", arg)
    base = getattr(root, "base", None)
    while base is not None:  # slices share their base's memory
        if type(base) is not type(root):
            # NumPy's views through another object: as_strided's and sliding_window_view's
            # holder (its .base), a memoryview (np.frombuffer(x.data): its .obj)
            base = base.obj if type(base) is memoryview else getattr(base, "base", None)
            if type(base) is not type(root):
                break
        root, base = base, getattr(base, "base", None)
    return root


def _record(obj, key: int, writer):
    """A new record of ``obj`` (at ``key``) whose last writer is ``writer``."""
    try:
        rec = _Datum(obj, key)
    except TypeError:
        rec = _Pinned(obj)
        rec.live = int(writer is not None)  # a pending writer holds the datum (untrack_locked)
    rec.writer = writer
    _data[key] = rec
    return rec


def _state(obj) -> tuple:
    """(last writer, readers since) of ``obj`` as the runtime knows them."""
    entry = _data.get(id(obj))
    if entry is None:
        return None, None
    if type(entry) in _RECORDS:
        return entry.writer, entry.readers
    return entry, None


def _forget(rec, _data=_data) -> None:
    # Runs when the datum is freed, before its id can be reused. It must not take LOCK (it
    # may run while that is held, when a finished instance drops the last reference) and
    # needs none: the record can only be replaced once the id is free again. The table
    # is bound here: at interpreter exit a datum may outlive this module's globals.
    if _data.get(rec.key) is rec:
        _data.pop(rec.key, None)


def depend_locked(inst, event, strong: bool) -> None:
    """Make ``inst`` wait for ``event`` (caller holds LOCK). A strong dependency on an
    event that already failed or was cancelled dooms ``inst`` (cancelled once it waits
    for nothing else)."""
    status = event.status
    if status in DONE:
        if status is not COMPLETE and strong and inst.doomed is None:
            inst.doomed = cancelled_error(inst, event, event._error)
        return
    if strong:
        event._needs = add_dependent(event._needs, inst)
    else:
        event._after = add_dependent(event._after, inst)
    inst.pending += 1


def poisoned(writer) -> bool:
    """Did ``writer`` leave its data without valid contents, unbeknown to the application?"""
    return writer.status is not COMPLETE and writer.status in DONE and not writer._retrieved


_SCALAR_TYPES = frozenset((float, int))  # arguments that are no data, told by their type alone


def track_locked(inst, args, modes) -> None:
    """Add the implicit dependencies of ``inst`` and record its accesses (caller holds LOCK).

    ``args`` are its data arguments and ``modes`` their masks of READ and WRITE (as
    :func:`accesses` takes them). ``inst.held`` gets the data :func:`untrack_locked`
    lets go of when ``inst`` is done (one object, a tuple of them, or None): all it
    accesses.
    """
    held = None
    for obj, mode in (zip(args, modes) if _apart(args) else accesses(args, modes)):
        if type(obj) is not ndarray or obj.base is not None:  # accesses(), inlined
            if not mode or type(obj) in _SCALAR_TYPES or isinstance(obj, SCALARS):
                continue
            obj = datum(obj)  # the same object again for a datum accesses() found
        elif not mode:
            continue
        key = id(obj)
        rec = _data.get(key)
        if rec is None:
            if mode & WRITE:  # a fresh datum written: the instance alone stands for it
                _data[key] = inst
                held = obj if held is None else (*held, obj) if type(held) is tuple else (held, obj)
                continue
            rec = _record(obj, key, None)
        elif type(rec) not in _RECORDS:  # a pending last writer, alone
            if mode & WRITE:  # it stays alone: depend_locked(), inlined (a chain's every link)
                if mode & READ:
                    rec._needs = inst if rec._needs is None else add_dependent(rec._needs, inst)
                else:
                    rec._after = inst if rec._after is None else add_dependent(rec._after, inst)
                inst.pending += 1
                if rec.held is obj:  # nothing left for it to let go of (a chain's links)
                    rec.held = None
                _data[key] = inst
                held = obj if held is None else (*held, obj) if type(held) is tuple else (held, obj)
                continue
            rec = _record(obj, key, rec)
        if type(rec) is _Pinned:
            rec.live += 1
        writer = rec.writer
        if writer is not None and writer.status is not COMPLETE:
            if writer.status not in DONE:
                depend_locked(inst, writer, bool(mode & READ))
            elif mode & READ and inst.doomed is None and poisoned(writer):
                inst.doomed = cancelled_error(inst, writer, writer._error)
        if mode & WRITE:
            if rec.readers:
                for reader in rec.readers:
                    if reader.status not in DONE:
                        depend_locked(inst, reader, False)
                rec.readers.clear()
            rec.writer = inst
        else:
            readers = rec.readers
            if readers is None:
                rec.readers = [inst]
            else:
                readers.append(inst)
                if len(readers) >= rec.prune_at:  # finished readers matter to no one
                    readers[:] = [r for r in readers if r.status not in DONE]
                    rec.prune_at = max(32, 2 * len(readers))
        held = obj if held is None else (*held, obj) if type(held) is tuple else (held, obj)
    inst.held = held


def clear_locked(args, modes):
    """Could an instance with these accesses run at once, and leave nothing to remember
    once it completed? The keys of the records of the data it writes (to drop once it
    completed: :func:`drop_locked`), or None where it must be tracked (caller holds
    LOCK): a datum it reads has a writer not known to have completed, or one it writes
    has that or unfinished readers (it would wait); or a record that only
    :func:`track_locked` handles (pinned data, a failed writer: poison)."""
    if not _data:  # nothing pending, nothing recorded (tiny tasks that all ran at once)
        return ()
    keys = ()
    for obj, mode in (zip(args, modes) if _apart(args) else accesses(args, modes)):
        if type(obj) is not ndarray or obj.base is not None:  # accesses(), inlined (track_locked)
            if not mode or type(obj) in _SCALAR_TYPES or isinstance(obj, SCALARS):
                continue
            obj = datum(obj)
        elif not mode:
            continue
        rec = _data.get(id(obj))
        if rec is None:
            continue
        if type(rec) is not _Datum:  # a pending lone writer, or pinned data
            return None
        writer = rec.writer
        if writer is not None and writer.status is not COMPLETE:
            return None
        if mode & WRITE:
            if rec.readers and any(r.status not in DONE for r in rec.readers):
                return None
            keys = (*keys, rec.key)
    return keys


def drop_locked(keys) -> None:
    """An instance that :func:`clear_locked` found clear completed: the records of the
    data it wrote tell nothing any more (their writer completed, their readers are done),
    so they go, as :func:`untrack_locked` would drop them (caller holds LOCK)."""
    for key in keys:
        del _data[key]


def _apart(args) -> bool:
    """Are the arguments (at most two) surely over different data, so that none has to
    be merged with another (:func:`accesses`)? Whole NumPy arrays other than each other,
    and Python numbers, are."""
    if len(args) != 2:
        return len(args) < 2
    a, b = args
    return a is not b and (type(a) in _SCALAR_TYPES or type(a) is ndarray and a.base is None) \
        and (type(b) in _SCALAR_TYPES or type(b) is ndarray and b.base is None)


def untrack_locked(inst, complete: bool) -> tuple | None:
    """``inst`` is done (``complete``: successfully): let go of the data it holds (caller
    holds LOCK, and ``inst`` its arguments, so none of them is freed meanwhile). Failed,
    the keys of the records it poisons are returned (for :func:`unpoison_locked`).

    A completed last writer is forgotten (it orders nothing and poisons nothing), and so
    are finished readers at the end of the list of readers (the last reader to finish
    finds them all finished); a record left with no writer and no readers, or a pinned
    one no pending instance uses, is dropped. A failed (or cancelled) last writer that
    stood alone for its datum gets a record: the datum is poisoned.
    """
    held, inst.held = inst.held, None
    if complete and type(held) is not tuple and _data.get(id(held)) is inst:
        del _data[id(held)]  # the common case first: a lone writer done (each fan-out output)
        return None
    held = held if type(held) is tuple else (held,)
    for obj in held:
        key = id(obj)
        rec = _data.get(key)
        if rec is inst:
            del _data[key]
            if not complete:
                rec = _record(obj, key, inst)
                if type(rec) is _Pinned:  # nothing pending uses it
                    del _data[key]
            continue
        if type(rec) not in _RECORDS:  # a later writer's now, or forgotten by the host
            continue
        if rec.writer is inst and complete:
            rec.writer = None
        readers = rec.readers
        while readers and readers[-1].status in DONE:  # popped once each: the last reader done empties it
            readers.pop()
        if type(rec) is _Pinned:
            rec.live -= 1
            if rec.live:
                continue
        elif rec.writer is not None or rec.readers:
            continue
        del _data[key]
    if not complete:  # the records it poisons, for unpoison_locked
        return tuple(key for key in map(id, held) if type(rec := _data.get(key)) in _RECORDS
                     and rec.writer is inst) or None
    return None


def unpoison_locked(inst, keys) -> None:
    """The failure of ``inst``, a failed or cancelled writer, was reported: the records of
    the data it poisoned (``keys``, from :func:`untrack_locked`) forget it, as they forget
    a completed writer (caller holds LOCK). It poisons nothing any more (:func:`poisoned`),
    and kept, it would keep what its error now holds: the frames of the raise that
    reported it, whose locals often hold the data itself, which then kept its own record,
    and itself, alive for good."""
    for key in keys:
        rec = _data.get(key)
        if type(rec) in _RECORDS and rec.writer is inst:
            rec.writer = None
            if type(rec) is _Datum and all(r.status in DONE for r in rec.readers or ()):
                del _data[key]


def accesses(args, modes) -> list:
    """``(datum, mode)`` pairs of the array/view/buffer arguments, each datum once."""
    out = []
    for arg, mode in zip(args, modes):
        if mode:
            if type(arg) is not ndarray or arg.base is not None:  # not a whole NumPy array
                if type(arg) is float or isinstance(arg, SCALARS):
                    continue
                arg = datum(arg)
            if out:
                for pair in out:
                    if pair[0] is arg:  # passed twice: once, with both modes
                        k = next(k for k, p in enumerate(out) if p is pair)
                        out[k] = (arg, pair[1] | mode)
                        break
                else:
                    out.append((arg, mode))
            else:
                out.append((arg, mode))
    return out


def pending_locked(obj, write: bool) -> list:
    """Instances a host access to ``obj`` must wait for: its unfinished last writer, and for
    a write also its unfinished readers (caller holds LOCK)."""
    writer, readers = _state(obj)
    events = [writer] if writer is not None and writer.status not in DONE else []
    if write and readers:
        events += [r for r in readers if r.status not in DONE]
    return events


def last_writer_locked(obj):
    """The last instance that wrote ``obj`` and is not known to have completed, or None."""
    return _state(obj)[0]


def host_wrote_locked(obj) -> None:
    """The host overwrote ``obj``: later readers depend on nothing before (caller holds LOCK)."""
    rec = _data.get(id(obj))
    if rec is None:
        return
    if type(rec) in _RECORDS:
        rec.writer = rec.readers = None
    else:
        del _data[id(obj)]


def check_cycle_locked(event, wait_for) -> None:
    """Raise ArgumentError if ``event`` waiting for ``wait_for`` closes a cycle:
    if one of them already waits, transitively, for ``event``."""
    if not wait_for:  # nothing new to wait for: no walk over everything that waits
        return
    targets = set(wait_for)
    parent = {event: None}
    stack = [event]
    while stack:
        ev = stack.pop()
        if ev in targets:
            chain = []
            while ev is not None:
                chain.append(str(ev))
                ev = parent[ev]
            raise ArgumentError(
                f"{event} cannot wait for {chain[0]}: that closes a dependency cycle ("
                + " -> ".join([str(event), *chain]) + "; '->' reads 'waits for')")
        for dep in (*dependents(ev._needs), *dependents(ev._after)):
            if dep not in parent and dep.status not in DONE:
                parent[dep] = ev
                stack.append(dep)
