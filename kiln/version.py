"""kiln's version (a leaf module: cache keys read it from anywhere)."""

__version__ = "0.1.0"
