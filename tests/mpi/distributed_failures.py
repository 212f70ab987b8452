"""Run under mpiexec by tests/test_distributed.py: how a distributed run fails.

``python distributed_failures.py MODE`` with MODE one of
  raise: rank 1 raises ValueError between iterations of the heat program; it re-raises
      its own error, every other rank gets RemoteError naming rank 1 and its message;
  reduce: rank 1 raises while the others reduce a distributed array (they wait in the
      communicator's allreduce, whose waits watch for the notice too);
  timeout (2 ranks): rank 1 stalls for 4 s between iterations; rank 0, waiting for its
      halo rows, gets CommTimeoutError after the 2 s timeout, and rank 1, back, gets
      RemoteError naming rank 0.
Every rank prints "rank R: MODE ok" and exits 0: nobody hangs.
"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import heat_distributed as heat  # noqa: E402

from hetflow import cluster, collectives  # noqa: E402
from hetflow.errors import CommError, CommTimeoutError, RemoteError  # noqa: E402
from oracle import expect  # noqa: E402


def main(mode):
    comm = collectives.world(timeout=2 if mode == "timeout" else 30)
    rank = comm.rank

    def body():
        program, u, v = heat.setup(32, comm, report_every=2)
        program.run(3)
        if rank == 1 and mode in ("raise", "reduce"):
            raise ValueError("injected failure on rank 1")
        if mode == "reduce":
            u.sum()
        if rank == 1 and mode == "timeout":
            time.sleep(4)  # stalled, past the others' timeout
        program.run(10)

    if mode in ("raise", "reduce") and rank == 1:
        expect(ValueError, lambda: cluster.run_distributed(body, comm=comm), "injected failure on rank 1")
    elif mode == "timeout" and rank == 0:
        expect(CommTimeoutError, lambda: cluster.run_distributed(body, comm=comm),
               "no answer within 2 s", "halo exchange")
    elif mode == "timeout":
        expect(RemoteError, lambda: cluster.run_distributed(body, comm=comm),
               "rank 0 raised CommTimeoutError", "no answer within 2 s")
    else:
        expect(RemoteError, lambda: cluster.run_distributed(body, comm=comm),
               "rank 1 raised ValueError: injected failure on rank 1")
    # the run is over for everyone: the session refuses further work at once
    expect(CommError, lambda: cluster.asarray([1.0, 2.0, 3.0, 4.0], comm=comm))
    print(f"rank {rank}: {mode} ok", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
