"""kiln: a deep-learning compiler in Python, built the way Apache TVM is built.

Every operator is an entry in one attribute registry (`kiln.registry`); targets
(`kiln.target`) are entries of registries built on the same machinery.
"""

__version__ = "0.1.0"

from kiln import (  # importing relay registers the op library
    codegen,  # registers the back ends (each target kind's FBuild)
    ir,
    registry,
    relay,
    target,
)
from kiln.build import build
from kiln.errors import KilnError
from kiln.target import Target

__all__ = ["KilnError", "build", "Target", "__version__", "codegen", "ir", "registry", "relay", "target"]
