"""Tools for checking compiled models: the reference comparison and the demo/bench models."""

from kiln.testing.compare import Mismatch, compare

__all__ = ["Mismatch", "compare"]
