"""Tools for checking compiled models: the reference comparison and the demo/bench models."""

from kiln.testing.compare import Mismatch, compare
from kiln.testing.grad import check_grad

__all__ = ["Mismatch", "check_grad", "compare"]
