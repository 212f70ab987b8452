"""The oracle of the MPI test scripts: NumPy's reduction of every rank's input,
gathered with MPI's own Allgather of the raw bytes (no hetflow code involved); and
``expect``, their check of an error's type and words."""
import functools

import numpy as np
from mpi4py import MPI

UFUNCS = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
          "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
          "land": np.logical_and, "lor": np.logical_or, "lxor": np.logical_xor}


def gather(x):
    send = np.ascontiguousarray(x).reshape(-1)
    everyone = np.empty((MPI.COMM_WORLD.Get_size(), send.size), send.dtype)
    MPI.COMM_WORLD.Allgather([send.view(np.uint8), MPI.BYTE],
                             [everyone.view(np.uint8), MPI.BYTE])
    return list(everyone)


def oracle(x, ufunc):
    everyone = gather(x)
    if x.dtype.names:
        result = np.empty_like(everyone[0])
        for name in x.dtype.names:
            result[name] = functools.reduce(ufunc, [a[name] for a in everyone])
        return result.reshape(x.shape)
    return functools.reduce(lambda a, b: ufunc(a, b).astype(a.dtype), everyone
                            ).reshape(x.shape)


def expect(exc_type, fn, *words):
    """The ``exc_type`` that ``fn()`` raises, its message holding each of ``words``."""
    try:
        fn()
    except exc_type as exc:
        for word in words:
            assert word in str(exc), f"{word!r} not in {str(exc)!r}"
        return exc
    raise AssertionError(f"{exc_type.__name__} not raised")
