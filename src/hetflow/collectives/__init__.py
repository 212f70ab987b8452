"""Collectives across processes: global reduce and allreduce (SPEC §5).

>>> from hetflow import collectives
>>> comm = collectives.world()            # all MPI processes, or just this one
>>> total = comm.allreduce(x, op="sum")  # pipelined halving, then recursive doubling

The distributed program over the same processes (SPEC §4.4) is :mod:`hetflow.cluster`.
"""
from hetflow.collectives.comm import (Communicator, MPICommunicator, SelfCommunicator,
                                      launched_by_mpi, launcher_rank, world)
from hetflow.collectives.ops import BUILTIN_OPS, ReduceOp

__all__ = ["BUILTIN_OPS", "Communicator", "MPICommunicator", "ReduceOp", "SelfCommunicator",
           "launched_by_mpi", "launcher_rank", "world"]
