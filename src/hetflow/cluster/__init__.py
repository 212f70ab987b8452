"""A program over the ranks of an MPI run (SPEC §4.4): distributed arrays with halos,
launches over them, and central and local interpreters that partition and rebalance.

>>> from hetflow import cluster
>>> u = cluster.asarray(grid)             # each rank keeps its block of rows (+ halo)
>>> cluster.forall(shape, step, cluster.interior(v, 1), cluster.interior(u, 1))

Its communicators and collectives are :mod:`hetflow.collectives`.
"""
from hetflow.cluster.darray import (DistArray, DistView, Distribution, asarray, cshift, empty,
                                    empty_like, interior, is_distributed, section, zeros, zeros_like)
from hetflow.cluster.launch import Session, distributed, run_distributed, session
from hetflow.cluster.plan import forall
from hetflow.cluster.central import CentralInterpreter, central_rules
from hetflow.cluster.local import LocalInterpreter, local_rules
from hetflow.cluster.program import DistributedProgram

__all__ = ["CentralInterpreter", "DistArray", "DistView", "DistributedProgram", "Distribution",
           "LocalInterpreter", "Session", "asarray", "central_rules", "cshift", "distributed",
           "empty", "empty_like", "forall", "interior", "is_distributed", "local_rules",
           "run_distributed", "section", "session", "zeros", "zeros_like"]
