"""kiln's version and a digest of its source (a leaf module: cache keys read them from anywhere)."""

import functools
import hashlib
from pathlib import Path

__version__ = "0.1.0"


@functools.cache
def source_digest() -> str:
    """A sha256 of every Python file of the kiln package: caches keyed by it never serve what an
    earlier version of kiln made."""
    h = hashlib.sha256()
    root = Path(__file__).parent
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()
