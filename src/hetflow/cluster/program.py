"""A captured program run over every rank: central interpreter on rank 0, a local one on
each rank (SPEC §4.4), halos exchanged and partitions rebalanced between iterations.

    u = cluster.asarray(grid); v = cluster.zeros_like(u)
    with hetflow.graph("heat") as g:
        cluster.forall(shape, step, *views(u, v))      # recorded, not run
        cluster.forall(shape, step, *views(v, u))
    program = cluster.DistributedProgram(g)
    program.run(iterations=50)

Every rank captures the same program. At the first safe point the ranks tell rank 0
their capacities (allgather); rank 0's central interpreter partitions the launches over
the ranks and sends the description (row ranges per rank, and any rules for the local
interpreters) to all; each rank moves its rows to match and materialises its part.
Every ``report_every`` iterations, and once early (at iteration ``FIRST_REPORT``, so that
a poor first guess of the capacities is not kept for long), the ranks report what they
measured (the first iteration after each materialisation not counted); when the
central interpreter's rules see an imbalance, they re-partition, rows move between
neighbouring ranks, and each local interpreter materialises its part again. Between
iterations every rank also checks whether another rank failed (RemoteError). A rank
whose iteration fails (its part refused, not compiled, raised) stops the run as
:func:`hetflow.cluster.distributed` does: the others raise its error naming it at their
next wait (:func:`hetflow.cluster.control.remote_error`), instead of waiting for its rows.
"""
from __future__ import annotations

from hetflow.cluster import darray
from hetflow.cluster.central import DEFAULT_THRESHOLD, CentralInterpreter, partial_version
from hetflow.cluster.launch import session as _session
from hetflow.cluster.local import LocalInterpreter
from hetflow.cluster.plan import plan_for
from hetflow.errors import ArgumentError, RemoteError
from hetflow.ir.rulefile import loads, read

# The early report: capacities are guesses (a GPU counts its multiprocessors, which
# overrates it when every step copies host data to it); measured rates replace them here.
FIRST_REPORT = 3


class DistributedProgram:
    """A captured graph of launches over distributed arrays, run on every rank.

    ``graph``: a captured ``hetflow.graph()``; ``devices``: this rank's device ids
    (default: the session's — its CPU cores and its GPUs — or the GPU holding the
    arrays); ``central_rules``/``local_rules``: RuleSets for the two levels (defaults
    in :mod:`hetflow.cluster.central` and :mod:`hetflow.cluster.local`); ``rule_file``: a TOML
    rule file that rank 0 reads and sends to every rank, whose rules join each local
    interpreter's; ``monitor``: this rank's local monitor; ``report_every``: iterations
    between reports; ``threshold``: the imbalance that triggers a rebalance.
    """

    def __init__(self, graph, *, comm=None, devices=None, central_rules=None, local_rules=None,
                 rule_file=None, monitor=None, report_every: int = 10,
                 threshold: float = DEFAULT_THRESHOLD):
        if isinstance(report_every, bool) or not isinstance(report_every, int) or report_every < 1:
            raise ArgumentError(f"report_every must be an integer >= 1; got {report_every!r}")
        self.nodes = graph.version(0).nodes
        self.distribution = _distribution(self.nodes)
        self.session = _session(comm) if comm is not None else self.distribution.session
        if self.session is not self.distribution.session:
            raise ArgumentError("the program's arrays belong to another communicator than comm")
        self.report_every = report_every
        rank, size = self.session.rank, self.session.size
        self.central = None
        if rank == 0:
            shipped = None
            if rule_file is not None:  # only rank 0 needs the file
                shipped = (str(rule_file), read(rule_file))
                loads(shipped[1], shipped[0])  # a bad file fails here, with its line and column
            self.central = CentralInterpreter(self.nodes, size, self.distribution.n,
                                              self.distribution.min_rows, rules=central_rules,
                                              threshold=threshold, local_rules=shipped)
        blocks_on = _blocks_device(self.nodes)
        self.local = LocalInterpreter(rank, devices or ((blocks_on.id,) if blocks_on else self.session.devices),
                                      rules=local_rules, monitor=monitor, blocks_on=blocks_on,
                                      graph=graph.name)
        self.partial = None  # the central version this rank runs its part of
        self.materialised_on = None  # the distribution's version the parts were made on
        self.partitions = []  # (iteration, rows per rank) each time the partition changed
        self.iteration = 0

    @property
    def monitor(self):
        """This rank's local monitor (``inject``/``set`` feedback here)."""
        return self.local.monitor

    def run(self, iterations: int = 1) -> None:
        """Run the program ``iterations`` times on every rank (collective), with a safe
        point before each."""
        if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 0:
            raise ArgumentError(f"iterations must be an integer >= 0; got {iterations!r}")
        self.local.first_iteration = True  # arrays may have changed since the last run
        for _ in range(iterations):
            try:
                self._safe_point()
                self.local.run()
            except RemoteError:
                raise  # another rank failed: it has told everyone
            except Exception as exc:  # a part of this rank's only: the others wait for its rows
                self.session.channel.abort(exc)
                raise
            self.iteration += 1

    def _safe_point(self) -> None:
        channel = self.session.channel
        channel.check()
        if self.partial is None:
            facts = channel.gather(self.local.capacity(self.session.cpu_threads))
            if self.central is not None:
                self.central.capacities(facts)
            self._follow(channel)
        elif self.materialised_on != self.distribution.version:
            # Rows moved since (resize by hand, another program on these arrays): the parts
            # are views of storage the arrays no longer use. Keep the new cut, re-make them.
            if self.central is not None:
                self.central.adopt(self.distribution.sizes)
            self._follow(channel, moved=True)
        elif self._report_due():
            self.local.adjust(force=True)  # fold local feedback into the report
            reports = channel.gather(self.local.report())
            if self.central is not None:
                self.central.report(reports)
            self._follow(channel)
        else:
            self.local.adjust()

    def _report_due(self) -> bool:
        """Every ``report_every`` iterations, and at FIRST_REPORT when that comes sooner."""
        if self.iteration % self.report_every == 0:
            return True
        return self.iteration == FIRST_REPORT and FIRST_REPORT < self.report_every

    def _follow(self, channel, moved: bool = False) -> None:
        """Rank 0 decides, every rank applies what it decided (``moved``: the rows moved
        outside this program; its parts are made again even if nothing else changed)."""
        description = None
        if self.central is not None:
            self.central.adjust()
            description = self.central.description(with_rules=self.partial is None)
        description = channel.bcast(description)
        if not moved and self.partial is not None and description["version"] == self.partial.number:
            return
        if description["rules"] is not None:
            name, text = description["rules"]
            self.local.add_rules(loads(text, f"{name} (from rank 0)"))
        if self.distribution.resize(description["sizes"]) or self.partial is None or moved:
            self.partitions.append((self.iteration, tuple(description["sizes"])))
        self.partial = partial_version(description, self.nodes)
        self.local.materialise(self.partial, self.distribution.bounds)
        self.materialised_on = self.distribution.version


def _distribution(nodes):
    if not nodes:
        raise ArgumentError("the graph has no launches: capture the program with 'with g:' first")
    found = {}
    for node in nodes:
        if node.op != "forall" or not any(darray.is_distributed(a) for a in node.args):
            raise ArgumentError(f"node #{node.id} ({node.op} {node.name}) is not a launch over "
                                "distributed arrays; a distributed program runs only those")
        plan = plan_for(node.extent, node.kernel, node.args)
        found[id(plan.distribution)] = plan.distribution
    if len(found) != 1:
        raise ArgumentError(f"the program's launches use {len(found)} distributions; make every array "
                            "with *_like(...) or like= so that they share one")
    return next(iter(found.values()))


def _blocks_device(nodes):
    """The GPU holding this rank's blocks of the arrays, or None for host memory."""
    for node in nodes:
        for arg in node.args:
            if darray.is_distributed(arg) and darray.as_view(arg).base.device is not None:
                return darray.as_view(arg).base.device
    return None
