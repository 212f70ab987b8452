"""Kernels: the decorator, access analysis, atomics and per-device code generation."""
from . import atomic
from .kernel import Kernel, kernel

__all__ = ["Kernel", "atomic", "kernel"]
