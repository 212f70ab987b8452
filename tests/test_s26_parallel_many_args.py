"""A kernel of many arguments (views, each passing several numbers) runs over every core:
the parallel entry hands its pieces the parameters in tuples, since Python compiles a call
of more than 30 arguments in a way Numba refuses (LIST_TO_TUPLE)."""
import numpy as np

import hetflow
from hetflow import cshift, interior
from hetflow.runtime import cpu


@hetflow.kernel
def nine_point(i, j, new, c, n, s, w, e, ne, nw, se, sw):
    new[i, j] = c[i, j] + n[i, j] + s[i, j] + w[i, j] + e[i, j] + ne[i, j] + nw[i, j] + se[i, j] + sw[i, j]


def test_a_nine_view_stencil_over_every_core_is_numpys():
    u = np.random.default_rng(0).random((300, 300))
    new = np.zeros_like(u)
    views = [interior(cshift(cshift(u, 0, di), 1, dj), 1) for di, dj in
             ((0, 0), (-1, 0), (1, 0), (0, -1), (0, 1), (-1, 1), (-1, -1), (1, 1), (1, -1))]
    assert 298 * 298 > cpu.INLINE_LIMIT  # the whole launch goes to the parallel entry
    hetflow.forall((298, 298), nine_point, interior(new, 1), *views, device="cpu0")
    want = sum(np.roll(np.roll(u, -di, 0), -dj, 1) for di in (-1, 0, 1) for dj in (-1, 0, 1))
    np.testing.assert_allclose(new[1:-1, 1:-1], want[1:-1, 1:-1], rtol=1e-12)
