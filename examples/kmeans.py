"""k-means clustering with the centroid sums combined across processes by allreduce.

    python examples/kmeans.py [--points 100000] [--k 5] [--iterations 10]   # one process
    mpiexec -n 4 python examples/kmeans.py    # each rank clusters its share of the points

Each rank assigns its own points to the nearest centroid with a hetflow kernel, sums
them per cluster, and ``allreduce`` adds the sums of all ranks (docs/guide/distributed.md):
every rank then holds the same new centroids.
"""
import argparse
import sys

import numpy as np

import hetflow


@hetflow.kernel
def assign(i, points, centroids, labels):
    best, best_d = 0, np.inf
    for c in range(centroids.shape[0]):
        d = 0.0
        for f in range(points.shape[1]):
            t = points[i, f] - centroids[c, f]
            d += t * t
        if d < best_d:
            best, best_d = c, d
    labels[i] = best


def local_points(rank, size, n, k, dim, seed=0):
    """This rank's slice of a reproducible data set with ``k`` blobs."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-10, 10, (k, dim))
    pts = centres[rng.integers(0, k, n)] + rng.normal(0, 1.0, (n, dim))
    return np.ascontiguousarray(pts[rank * n // size:(rank + 1) * n // size]), pts


def kmeans(points, k, iterations, comm, seed=1):
    """Lloyd's algorithm; ``points`` is this rank's share. Returns the centroids."""
    dim = points.shape[1]
    centroids = comm.bcast(np.random.default_rng(seed).uniform(-10, 10, (k, dim)), root=0)
    labels = np.zeros(points.shape[0], dtype=np.int64)
    for _ in range(iterations):
        hetflow.forall(points.shape[0], assign, points, centroids, labels)
        sums = np.zeros((k, dim + 1))
        np.add.at(sums[:, :dim], labels, points)
        np.add.at(sums[:, dim], labels, 1.0)
        total = comm.allreduce(sums.ravel(), op="sum").reshape(k, dim + 1)
        counts = np.maximum(total[:, dim:], 1.0)
        centroids = np.where(total[:, dim:] > 0, total[:, :dim] / counts, centroids)
    return centroids


def numpy_kmeans(points, k, iterations, seed=1):
    dim = points.shape[1]
    centroids = np.random.default_rng(seed).uniform(-10, 10, (k, dim))
    for _ in range(iterations):
        labels = np.argmin(((points[:, None, :] - centroids[None]) ** 2).sum(-1), axis=1)
        sums = np.zeros((k, dim))
        np.add.at(sums, labels, points)
        counts = np.bincount(labels, minlength=k)[:, None]
        centroids = np.where(counts > 0, sums / np.maximum(counts, 1), centroids)
    return centroids


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--points", type=int, default=100_000, help="points over all ranks (default 100000)")
    p.add_argument("--k", type=int, default=5, help="clusters (default 5)")
    p.add_argument("--iterations", type=int, default=10, help="Lloyd iterations (default 10)")
    a = p.parse_args(argv)
    for option, value in (("--points", a.points), ("--k", a.k), ("--iterations", a.iterations)):
        if value < 1:
            p.error(f"{option} must be at least 1, got {value}")
    comm = hetflow.world()
    mine, everything = local_points(comm.rank, comm.size, a.points, a.k, 3)
    centroids = kmeans(mine, a.k, a.iterations, comm)
    if comm.rank == 0:
        err = np.max(np.abs(centroids - numpy_kmeans(everything, a.k, a.iterations)))
        print(f"{comm.size} rank(s); centroids:\n{np.round(centroids, 3)}\nmax |difference| from NumPy {err:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
