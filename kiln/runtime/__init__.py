"""Compiled kernels (`Module`), the graph executor, its file format and memory planning."""

from kiln.runtime.executor import GraphExecutor
from kiln.runtime.library import ExecutorError, Library, LibraryFormatError, LibraryTrustError, load
from kiln.runtime.module import ArgumentError, KernelMemoryError, Module
from kiln.runtime.trust import TrustSetupError

__all__ = [
    "ArgumentError",
    "ExecutorError",
    "GraphExecutor",
    "KernelMemoryError",
    "Library",
    "LibraryFormatError",
    "LibraryTrustError",
    "Module",
    "TrustSetupError",
    "load",
]
