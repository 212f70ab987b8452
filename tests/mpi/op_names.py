"""Run under mpiexec by tests/test_op_names.py: every operation name in allreduce.

Each rank reduces its own rank-dependent integers; the oracle folds every rank's
values (gathered by pickle) with the operation written out here. Ranks may spell an
operation differently ('and' on even ranks, 'BAND' on odd ones). Rank 0 prints
"op names ok: N cases".
"""
import functools
import operator

import numpy as np

from hetflow import collectives

FOLD = {"sum": operator.add, "prod": operator.mul, "min": min, "max": max,
        "and": operator.and_, "or": operator.or_, "xor": operator.xor,
        "land": lambda a, b: int(bool(a) and bool(b)), "lor": lambda a, b: int(bool(a) or bool(b)),
        "lxor": lambda a, b: int(bool(a) != bool(b))}
MPI_NAMES = {"and": "band", "or": "bor", "xor": "bxor"}


def main():
    comm = collectives.world(timeout=60)
    x = ((np.arange(7) + comm.rank) % 4).astype(np.int64)  # zeros included
    everyone = comm.allgather(x.tolist())
    cases = 0
    for name, fn in FOLD.items():
        spelled = MPI_NAMES.get(name, name).upper() if comm.rank % 2 else name
        want = [functools.reduce(fn, column) for column in zip(*everyone)]
        np.testing.assert_array_equal(comm.allreduce(x, op=spelled), want, err_msg=spelled)
        cases += 1
    if comm.rank == 0:
        print(f"op names ok: {cases} cases")


if __name__ == "__main__":
    main()
