"""The communication schedule of the global reduction (SPEC §5), as plain data.

``plan`` lists, for one process, the steps it takes; every engine (MPI between host
buffers, NCCL between GPUs) runs the same list, so the algorithm lives here once:

* **fold**: with N not a power of two, the ranks numbered P = 2**floor(log2 N) and up
  send all their data to ``rank - P`` first, which reduces it into its own (and, for
  allreduce, sends the result back at the end: **unfold**);
* **distribution (reduce-scatter) phase**, log2 P steps: at step k the partner is
  ``v XOR (1 << k)``; the lower of the pair keeps the first half of the current range
  and sends the second, the higher one the opposite; the received half is reduced into
  the kept one. Steps run from the highest bit down, so afterwards process v holds
  block v of the result, blocks being cut at ``b * n // P``;
* **collection phase**: to the root by a binomial tree (at step k a process whose
  number is a multiple of 2**(k+1) receives everything process v + 2**k holds), or to
  all by recursive doubling (pairs exchange all they hold).

Processes are renumbered so that the root is 0 (v = (rank - root) mod N), which keeps
the root inside the power-of-two group and its result in place.

For small messages ``plan(..., small=True)`` gives recursive doubling on whole vectors
instead: log2 P exchanges rather than 2 log2 P, which is what counts when latency,
not bandwidth, dominates.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

FOLD = "fold"
DISTRIBUTION = "distribution"
COLLECTION = "collection"
DOUBLING = "recursive doubling"
UNFOLD = "unfold"

_PHASE_TAGS = {FOLD: 0, DISTRIBUTION: 1, COLLECTION: 2, DOUBLING: 3, UNFOLD: 4}

Range = tuple  # (lo, hi): elements lo..hi-1 of the packed vector


@dataclass(frozen=True)
class Step:
    """One exchange with ``partner``: send ``send``, receive ``recv`` (element ranges).

    With ``reduce`` the received data is combined into the same range of the working
    vector; otherwise it is stored there.
    """

    phase: str
    k: int
    partner: int
    send: Range | None
    recv: Range | None
    reduce: bool

    @property
    def pipelined(self) -> bool:
        """Segmented on both ends: the receiving side reduces what arrives."""
        return self.phase in (FOLD, DISTRIBUTION, DOUBLING)

    @property
    def tag(self) -> int:
        """The MPI tag of this step's messages: distinct per phase and step."""
        return _PHASE_TAGS[self.phase] * 64 + self.k


def power_of_two_below(size: int) -> int:
    """P = 2**floor(log2 size): the processes that take part in the halving."""
    return 1 << (size.bit_length() - 1)


def split(rng: Range, segments: int) -> list:
    """Cut ``rng`` into ``segments`` near-equal segments, dropping empty ones.

    Both ends of a transfer call this on the same range, so they agree on the cuts.
    """
    lo, hi = rng
    length = hi - lo
    cuts = [lo + j * length // segments for j in range(segments + 1)]
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


def segment_count(rng: Range, segments: int, itemsize: int, min_bytes: int) -> int:
    """How many segments to cut ``rng`` into: ``segments``, but none below ``min_bytes``.

    Each segment costs a round trip (and, on GPUs, launches), so small halves are not
    cut: the "largest packet" tuning of SPEC §5.1. Both ends compute it from the same
    range and dtype, so they agree.
    """
    lo, hi = rng
    return max(1, min(segments, (hi - lo) * itemsize // max(1, min_bytes)))


@functools.lru_cache(maxsize=256)  # collectives are called in loops with the same shape
def plan(rank: int, size: int, n: int, root: int = 0, to_all: bool = True,
         small: bool = False) -> tuple:
    """The steps process ``rank`` of ``size`` takes to reduce ``n`` elements."""
    v = (rank - root) % size
    p = power_of_two_below(size)

    def real(w):
        return (w + root) % size

    whole = (0, n)
    if v >= p:  # an extra process: hand everything over, get the result back
        steps = [Step(FOLD, 0, real(v - p), whole, None, False)]
        if to_all:
            steps.append(Step(UNFOLD, 0, real(v - p), None, whole, False))
        return tuple(steps)

    steps = []
    has_extra = v + p < size
    if has_extra:
        steps.append(Step(FOLD, 0, real(v + p), None, whole, True))
    if small:
        steps += _doubling(v, p, whole, real)
    else:
        steps += _distribution(v, p, n, real)
        steps += (_collection_to_all if to_all else _collection_to_root)(v, p, n, real)
    if has_extra and to_all:
        steps.append(Step(UNFOLD, 0, real(v + p), whole, None, False))
    return tuple(steps)


def _edges(n: int, p: int, first_block: int, last_block: int) -> Range:
    return (first_block * n // p, last_block * n // p)


def _distribution(v, p, n, real):
    steps = []
    lo, hi = 0, p  # the blocks v is still responsible for
    k = p.bit_length() - 2
    while k >= 0:
        half = 1 << k
        mid = lo + half
        if v & half:
            keep, give = (mid, hi), (lo, mid)
        else:
            keep, give = (lo, mid), (mid, hi)
        steps.append(Step(DISTRIBUTION, k, real(v ^ half),
                          _edges(n, p, *give), _edges(n, p, *keep), True))
        lo, hi = keep
        k -= 1
    return steps


def _collection_to_all(v, p, n, real):
    steps = []
    k = 0
    while (1 << k) < p:
        width = 1 << k
        mine = v & ~(width - 1)
        theirs = mine ^ width
        steps.append(Step(COLLECTION, k, real(v ^ width),
                          _edges(n, p, mine, mine + width),
                          _edges(n, p, theirs, theirs + width), False))
        k += 1
    return steps


def _collection_to_root(v, p, n, real):
    steps = []
    k = 0
    while (1 << k) < p:
        width = 1 << k
        if v % (2 * width) == 0:
            steps.append(Step(COLLECTION, k, real(v + width), None,
                              _edges(n, p, v + width, v + 2 * width), False))
        else:  # v % (2 * width) == width: hand over all v holds, then done
            steps.append(Step(COLLECTION, k, real(v - width),
                              _edges(n, p, v, v + width), None, False))
            break
        k += 1
    return steps


def _doubling(v, p, whole, real):
    steps = []
    k = 0
    while (1 << k) < p:
        steps.append(Step(DOUBLING, k, real(v ^ (1 << k)), whole, whole, True))
        k += 1
    return steps
