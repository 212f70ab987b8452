"""Kernels: the decorator, access analysis and per-device code generation."""
from .kernel import Kernel, kernel

__all__ = ["Kernel", "kernel"]
