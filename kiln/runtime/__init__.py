"""Compiled kernels (`Module`), the graph executor, its file format and memory planning."""

from kiln.runtime.executor import ExecutorError, GraphExecutor, Library, LibraryFormatError, load
from kiln.runtime.module import ArgumentError, KernelMemoryError, Module

__all__ = [
    "ArgumentError",
    "ExecutorError",
    "GraphExecutor",
    "KernelMemoryError",
    "Library",
    "LibraryFormatError",
    "Module",
    "load",
]
