"""The central interpreter: partitions a program over the ranks with global facts.

It runs on rank 0, with its own monitor, rule set and DIR versions (SPEC §4.4). Its
topology has one node per rank and no devices: it does not know the ranks'
processors. What it knows are the facts the ranks report:

====================  ==============================================================
variable              meaning
====================  ==============================================================
``rank<r>.capacity``  rank r's first guess of its speed (its cores, its GPUs), at start
``rank<r>.rate``      rows rank r ran per second its launches worked, over the last report period
``rank<r>.available`` the share of rank r's devices that other work leaves to it
``ranks.imbalance``   how much longer the slowest rank takes than the mean, as a fraction
``ranks.threshold``   the imbalance past which the partition is rebalanced
``ranks.confirmed``   whether an imbalance past the threshold is confirmed: seen in this
                      report and the one before under the same partition, or in a
                      report that brought news (the first measured rates of ranks whose
                      capacities differ, or a change in a rank's available share)
``partition.sizes``   rows per rank: the partition the rules chose
====================  ==============================================================

Default rules (:func:`central_rules`): partition rows in proportion to capacity at the
start; when the imbalance passes the threshold and is confirmed, re-partition in
proportion to measured speed (rate x available). Timing noise on shared cores passes
the threshold in one report now and then; re-cutting on it moves rows for nothing and
leaves a worse cut. Cut every launch into one piece per rank (``place``) with
the rows its rank owns (``rows``). The result is a *partially materialised* DIR:
launches cut over ranks, not yet placed on any device — each rank's local interpreter
does that (:mod:`hetflow.cluster.local`). :meth:`CentralInterpreter.description` is the
picklable form sent to the ranks: the row ranges per rank, plus rules for them.
"""
from __future__ import annotations

import dataclasses
import itertools

from hetflow.cluster.darray import apportion, bounds_of
from hetflow.cluster.plan import plan_for
from hetflow.errors import RuleError
from hetflow.ir import Action, Interpreter, Monitor, NodePattern, Rule, RuleSet, Topology
from hetflow.ir.graph import Version

DEFAULT_THRESHOLD = 0.1


def imbalance(sizes, speeds) -> float:
    """How much longer the slowest rank takes than the mean (0: balanced)."""
    times = [s / v for s, v in zip(sizes, speeds)]
    mean = sum(times) / len(times)
    return max(times) / mean - 1.0 if mean > 0 else 0.0


def speeds(variables: dict, ranks: int) -> list[float] | None:
    """rate x available per rank; None until every rank has reported a rate."""
    found = []
    for r in range(ranks):
        rate = variables.get(f"rank{r}.rate")
        if not rate:
            return None
        found.append(rate * variables.get(f"rank{r}.available", 1.0))
    return found


@dataclasses.dataclass(frozen=True)
class Apportion(Action):
    """Set ``partition.sizes``: rows per rank in proportion to ``rank<r>.capacity``
    (``weight='capacity'``) or to measured speed, rate x available (``'speed'``); and
    ``ranks.imbalance`` to what the new sizes are predicted to leave."""

    weight: str = "speed"

    def __post_init__(self):
        if self.weight not in ("capacity", "speed"):
            raise RuleError(f"apportion weight must be 'capacity' or 'speed', not {self.weight!r}")

    def apply(self, ctx, match):
        ranks = ctx.topology.nodes
        if self.weight == "capacity":
            weights = [ctx.variables.get(f"rank{r}.capacity", 1.0) for r in range(ranks)]
        else:
            weights = speeds(ctx.variables, ranks)
            if weights is None:
                return
        sizes = apportion(ctx.variables["partition.rows"], weights, ctx.variables["partition.min_rows"])
        ctx.variables["partition.sizes"] = sizes
        if self.weight == "speed":
            ctx.variables["ranks.imbalance"] = round(imbalance(sizes, weights), 6)


@dataclasses.dataclass(frozen=True)
class SplitRanks(Action):
    """Cut each matched launch into one piece per rank: rank r's piece has ``place=r``
    and ``rows``, the launch rows whose results rank r owns under ``partition.sizes``."""

    def apply(self, ctx, match):
        sizes = ctx.variables.get("partition.sizes")
        if sizes is None:
            return
        bounds = bounds_of(sizes)
        for node in match.nodes:
            node = ctx.current(node)
            if node is None:
                continue
            whole = node.attrs.get("whole", node)
            rows = plan_for(whole.extent, whole.kernel, whole.args).rows(bounds)
            group = [n for n in ctx.nodes if n is whole or n.attrs.get("whole") is whole]
            if [n.attrs.get("rows") for n in group] == list(rows):
                continue
            pieces = [whole.evolve(id=ctx.new_id(), origin=(whole.id,)).with_attrs(
                place=r, piece=(r, len(rows)), rows=rows[r], whole=whole) for r in range(len(rows))]
            ctx.replace(group, pieces)


def central_rules() -> RuleSet:
    """The central interpreter's default rules, highest priority first."""
    return RuleSet([
        Rule("partition-by-capacity", when="not defined('partition.sizes')",
             then=Apportion("capacity"), priority=100,
             description="rows per rank in proportion to the capacity each reported"),
        Rule("rebalance-ranks", when="defined('ranks.imbalance') and ranks.imbalance > ranks.threshold "
                                     "and ranks.confirmed",
             then=Apportion("speed"), priority=90,
             description="rows per rank in proportion to measured speed when imbalanced, "
                         "twice in a row or after news"),
        Rule("split-over-ranks", match=NodePattern(op="forall"), when="defined('partition.sizes')",
             then=SplitRanks(), priority=80,
             description="one piece per rank: the rows it owns"),
    ])


class CentralInterpreter:
    """Rank 0's interpreter over a program's captured launches (``nodes``).

    ``rows``: the extent of the distributed dimension; ``min_rows``: the fewest rows a
    rank may own; ``rules``: a RuleSet (default :func:`central_rules`);
    ``threshold``: the imbalance that triggers a rebalance; ``local_rules``: a rule
    file for the ranks' local interpreters, as ``(name, TOML text)``.
    """

    def __init__(self, nodes, ranks: int, rows: int, min_rows: int, *, rules: RuleSet | None = None,
                 threshold: float = DEFAULT_THRESHOLD, local_rules: tuple | None = None):
        self.monitor = Monitor(Topology(devices=[], nodes=ranks), sources=[])
        self.rules = rules if rules is not None else central_rules()
        self.interpreter = Interpreter(self.monitor, rules=self.rules)
        self.local_rules = local_rules
        self.monitor.set("partition.rows", rows)
        self.monitor.set("partition.min_rows", min_rows)
        self.monitor.set("ranks.threshold", float(threshold))
        self.monitor.set("ranks.confirmed", False)
        self._over = 0  # reports in a row, under the current partition, past the threshold
        self._last = None  # (sizes, available shares) at the last report
        self.versions = [Version(0, tuple(nodes), None, "captured")]
        self._ids = itertools.count(max((n.id for n in nodes), default=0) + 1)

    @property
    def current(self) -> Version:
        return self.versions[-1]

    @property
    def ranks(self) -> int:
        return self.monitor.topology.nodes

    def capacities(self, facts) -> None:
        """What each rank said of itself at the start (one dict per rank)."""
        for r, fact in enumerate(facts):
            self.monitor.set(f"rank{r}.capacity", float(fact["capacity"]))

    def report(self, reports) -> None:
        """One report per rank: rows run and the seconds their launches worked since the
        last report, and the share of its devices available."""
        first = speeds(self.monitor.snapshot(), self.ranks) is None
        for r, rep in enumerate(reports):
            if rep["seconds"] > 0 and rep["rows"] > 0:
                self.monitor.set(f"rank{r}.rate", rep["rows"] / rep["seconds"])
            self.monitor.set(f"rank{r}.available", float(rep["available"]))
        found = speeds(self.monitor.snapshot(), self.ranks)
        sizes = self.monitor.get("partition.sizes")
        if found is None or sizes is None:
            return
        value = round(imbalance(sizes, found), 6)
        self.monitor.set("ranks.imbalance", value)
        self._confirm(value, tuple(sizes), [float(rep["available"]) for rep in reports], first)

    def _confirm(self, value: float, sizes: tuple, available: list, first: bool) -> None:
        """Set ``ranks.confirmed`` after a report whose imbalance is ``value`` under
        ``sizes`` (``first``: the first with every rank's rate)."""
        before = self._last or (None, [1.0] * self.ranks)  # (the first cut counted every device)
        self._last = (sizes, available)
        # News: what the partition assumed changed. The first rates are news where the
        # ranks' capacities differ, a guess that measurement corrects; equal ranks need
        # the imbalance confirmed, their first window being two iterations long.
        guessed = len({self.monitor.get(f"rank{r}.capacity") for r in range(self.ranks)}) > 1
        news = (first and guessed) or any(abs(a - b) > 1e-6 for a, b in zip(available, before[1]))
        if value <= self.monitor.get("ranks.threshold"):
            self._over = 0
        else:
            self._over = self._over + 1 if before[0] == sizes else 1
        self.monitor.set("ranks.confirmed", self._over > 0 and (news or self._over >= 2))

    def adopt(self, sizes) -> None:
        """Rows per rank as they are now, moved outside the program: the launches are
        cut again to match at the next :meth:`adjust`."""
        self.monitor.set("partition.sizes", tuple(sizes))

    def adjust(self) -> Version:
        """Evaluate the rules at a safe point; the current version (a new one if changed)."""
        adjusted = self.interpreter.adjust(self.current.nodes, self.rules, new_id=lambda: next(self._ids))
        if adjusted is not None:
            nodes, fired, _ = adjusted
            self.versions.append(Version(len(self.versions), nodes, self.current.number,
                                         "rules: " + (", ".join(fired) or "none")))
        return self.current

    def description(self, with_rules: bool = False) -> dict:
        """The current version as the ranks need it: its number, why it was made, the
        rows per rank and each launch's pieces (id, place, rows); ``with_rules``: also
        the rule file for the local interpreters (sent once, with the first partition)."""
        version = self.current
        pieces: dict = {}
        for node in version.nodes:
            whole = node.attrs.get("whole")
            if whole is not None:
                pieces.setdefault(whole.id, []).append((node.id, node.attrs["place"], node.attrs["rows"]))
        return {"version": version.number, "reason": version.reason,
                "sizes": self.monitor.get("partition.sizes"),
                "pieces": {k: tuple(v) for k, v in pieces.items()},
                "rules": self.local_rules if with_rules else None}


def partial_version(description: dict, nodes) -> Version:
    """The central version a description stands for, rebuilt over this rank's own
    captured ``nodes`` (every rank captured the same program, node for node)."""
    by_id = {n.id: n for n in nodes}
    missing = set(description["pieces"]) - set(by_id)
    if missing:
        raise RuleError(f"the central interpreter cut launches {sorted(missing)}, which this rank "
                        "did not capture: ranks must capture the same program")
    cut_nodes = []
    for node in nodes:
        ranges = description["pieces"].get(node.id)
        if ranges is None:
            cut_nodes.append(node)
            continue
        cut_nodes += [node.evolve(id=piece, origin=(node.id,)).with_attrs(
            place=place, piece=(place, len(ranges)), rows=tuple(rows), whole=node)
            for piece, place, rows in ranges]
    return Version(description["version"], tuple(cut_nodes), None, description["reason"])
