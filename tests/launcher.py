"""The mpiexec that MPI tests launch ranks with: the one beside this Python (the mpich
wheel's), else the one on PATH; Open MPI also gets --oversubscribe (tests use more ranks
than CI has cores)."""
import functools
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


@functools.lru_cache(maxsize=1)
def _found() -> tuple:
    beside = Path(sys.executable).with_name("mpiexec")
    exe = str(beside) if beside.exists() else shutil.which("mpiexec")
    if exe is None:
        return ()
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    return (exe, "--oversubscribe") if "Open MPI" in version else (exe,)


def mpiexec() -> list:
    """The launcher's command words; skips the test where there is no mpiexec."""
    found = _found()
    if not found:
        pytest.skip("mpiexec not found (install hetflow[mpi])")
    return list(found)
