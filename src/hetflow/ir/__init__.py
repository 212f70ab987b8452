"""The dynamic IR (SPEC §4): captured dataflow graphs, rules, monitor and interpreter.

    with hetflow.graph() as g:          # record instead of run
        t = hetflow.empty(n)
        hetflow.forall(n, scale, 2.0, x, t)
        hetflow.forall(n, shift, t, 1.0, y)
    g.run()                              # rules adjust the DIR, then it runs
    print(g.diff(0, 1))                  # what the rules changed
"""
from .actions import (Action, AddRule, ChangeRule, Compile, Fuse, Partition, RemoveRule, Replace, Set,
                      Split, Substitute)
from .cache import VariantCache
from .capture import Graph, current_graph, graph
from .graph import Node, Version
from .interpreter import Interpreter, RuleContext
from .expressions import Expr, parse
from .monitor import Monitor, MonitorEvent
from .patterns import Chain, Match, NodePattern, TopologyPattern
from .rules import Rule
from .ruleset import RuleSet
from .topology import Topology, simulated_device
from .values import Handle, LazyArray

__all__ = [
    "Action", "AddRule", "ChangeRule", "Chain", "Compile", "Expr", "Fuse", "Graph",
    "Handle", "Interpreter", "LazyArray", "Match", "Monitor", "MonitorEvent", "Node", "NodePattern", "Partition",
    "RemoveRule", "Replace", "Rule", "RuleContext", "RuleSet", "Set", "Split", "Substitute", "Topology",
    "TopologyPattern", "VariantCache", "Version", "current_graph", "graph", "parse", "simulated_device",
]
