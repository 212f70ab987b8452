"""Collectives across processes: global reduce and allreduce (SPEC §5).

>>> from hetflow import dist
>>> comm = dist.world()                 # all MPI processes, or just this one
>>> total = comm.allreduce(x, op="sum")  # pipelined halving, then recursive doubling
"""
from hetflow.dist.comm import (Communicator, MPICommunicator, SelfCommunicator,
                               launched_by_mpi, world)
from hetflow.dist.ops import BUILTIN_OPS, ReduceOp
from hetflow.dist.darray import (DistArray, DistView, Distribution, asarray, cshift, empty,
                                 empty_like, interior, is_distributed, section, zeros, zeros_like)
from hetflow.dist.launch import Session, distributed, run_distributed, session
from hetflow.dist.plan import forall
from hetflow.dist.central import CentralInterpreter, central_rules
from hetflow.dist.local import LocalInterpreter, local_rules
from hetflow.dist.program import DistributedProgram

__all__ = ["BUILTIN_OPS", "CentralInterpreter", "Communicator", "DistArray", "DistView",
           "DistributedProgram", "Distribution", "LocalInterpreter", "MPICommunicator", "ReduceOp",
           "SelfCommunicator", "Session", "asarray", "central_rules", "cshift", "distributed", "empty",
           "empty_like", "forall", "interior", "is_distributed", "launched_by_mpi", "local_rules",
           "run_distributed", "section", "session", "world", "zeros", "zeros_like"]
