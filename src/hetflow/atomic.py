"""``hetflow.atomic``: atomic updates of array elements inside kernels (add, min, max and
compare-and-swap ``cas``), for the CPU, GPUs and plain Python alike; see
:mod:`hetflow.kernels.atomic`."""
from .kernels.atomic import add, cas, max, min  # noqa: A004  (named as cuda.atomic's)

__all__ = ["add", "cas", "max", "min"]
