"""kiln: a deep-learning compiler in Python, built the way Apache TVM is built.

Every operator is an entry in one attribute registry (`kiln.registry`); targets
(`kiln.target`) are entries of registries built on the same machinery.
Importing kiln registers the op library (`kiln.relay`) and the back ends
(`kiln.codegen`, each target kind's `FBuild`).
"""

from kiln import codegen, ir, log, registry, relay, target
from kiln.build import build
from kiln.errors import KilnError
from kiln.target import Target
from kiln.version import __version__

log.configure_from_environment()

__all__ = ["KilnError", "build", "Target", "__version__", "codegen", "ir", "registry", "relay", "target"]
