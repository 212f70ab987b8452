"""Collectives across processes: global reduce and allreduce (SPEC §5).

>>> from hetflow import dist
>>> comm = dist.world()                 # all MPI processes, or just this one
>>> total = comm.allreduce(x, op="sum")  # pipelined halving, then recursive doubling
"""
from hetflow.dist.comm import (Communicator, MPICommunicator, SelfCommunicator,
                               launched_by_mpi, world)
from hetflow.dist.ops import BUILTIN_OPS, ReduceOp

__all__ = ["BUILTIN_OPS", "Communicator", "MPICommunicator", "ReduceOp",
           "SelfCommunicator", "launched_by_mpi", "world"]
