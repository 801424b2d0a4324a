"""The compiled-kernel cache: in memory and on disk.

A kernel's key is the sha256 of its canonical loop-IR text (`str(prim_func)`),
the target string (CPU name and features), the llvmlite version, kiln's
version and a digest of the code generator's source files. In memory, a bounded LRU dict of
compiled `Module`s; on disk, one file per key under `$KILN_CACHE_DIR` (default
`~/.cache/kiln`) holding the object code behind a header with its length,
checksum and key. A file whose header, length, checksum or key does not match
is deleted and the kernel recompiled: it is never loaded. Files are written
to a temporary name and renamed, so readers never see half a file.
`KILN_CACHE=0` turns both caches off.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

import llvmlite

from kiln.target import Target

if TYPE_CHECKING:
    from kiln.runtime.module import Module


def _codegen_version() -> str:
    """A digest of the code generator's own source, so editing it never serves kernels it made before."""
    h = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


CODEGEN_VERSION = _codegen_version()
_MAGIC = b"KILNOBJ1"
_MEMORY_LIMIT = 256


def enabled() -> bool:
    """Whether caching is on (`KILN_CACHE` is not "0")."""
    return os.environ.get("KILN_CACHE", "1") != "0"


def directory() -> Path:
    """The on-disk cache folder: `$KILN_CACHE_DIR`, else `~/.cache/kiln`."""
    env = os.environ.get("KILN_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "kiln"


def cache_key(func_text: str, target: Target) -> str:
    """The sha256 key of a kernel: loop-IR text, target, llvmlite, kiln and codegen versions."""
    import kiln

    h = hashlib.sha256()
    for part in (func_text, str(target), llvmlite.__version__, kiln.__version__, CODEGEN_VERSION):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


class KernelCache:
    """Compiled kernels by key: an LRU of live Modules, and object files on disk."""

    def __init__(self, limit: int = _MEMORY_LIMIT) -> None:
        self._memory: OrderedDict[str, Module] = OrderedDict()
        self._limit = limit
        self._lock = threading.Lock()
        self.hits = self.misses = self.disk_hits = self.corrupt = 0

    # -- memory ------------------------------------------------------------------------

    def get(self, key: str) -> Module | None:
        """The live Module of `key`, or None."""
        with self._lock:
            mod = self._memory.get(key)
            if mod is not None:
                self._memory.move_to_end(key)
                self.hits += 1
            return mod

    def put(self, key: str, module: Module) -> None:
        """Keeps `module` under `key`, dropping the least recently used beyond the limit."""
        with self._lock:
            self._memory[key] = module
            self._memory.move_to_end(key)
            while len(self._memory) > self._limit:
                self._memory.popitem(last=False)

    def clear(self) -> None:
        """Forgets every live Module (the disk cache stays)."""
        with self._lock:
            self._memory.clear()

    # -- disk --------------------------------------------------------------------------

    def path(self, key: str) -> Path:
        """Where the object code of `key` is stored."""
        return directory() / key[:2] / f"{key}.kobj"

    def load(self, key: str) -> tuple[bytes, list[str]] | None:
        """(object code, external symbols) of `key` from disk, or None when absent or corrupt.

        A corrupt or truncated file is deleted.
        """
        path = self.path(key)
        try:
            data = path.read_bytes()
        except OSError:
            self.misses += 1
            return None
        got = _decode(data, key)
        if got is None:
            self.corrupt += 1
            self.misses += 1
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        self.disk_hits += 1
        return got

    def store(self, key: str, obj: bytes, symbols: list[str]) -> None:
        """Writes the object code of `key` atomically; an unwritable folder only skips the store."""
        path = self.path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".kobj")
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(_encode(key, obj, symbols))
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError:
            pass


def _encode(key: str, obj: bytes, symbols: list[str]) -> bytes:
    header = json.dumps({"key": key, "length": len(obj), "sha256": hashlib.sha256(obj).hexdigest(),
                         "symbols": symbols}).encode()
    return _MAGIC + struct.pack("<Q", len(header)) + header + obj


def _decode(data: bytes, key: str) -> tuple[bytes, list[str]] | None:
    if not data.startswith(_MAGIC) or len(data) < len(_MAGIC) + 8:
        return None
    (hlen,) = struct.unpack_from("<Q", data, len(_MAGIC))
    start = len(_MAGIC) + 8
    if hlen > len(data) - start:
        return None
    try:
        header = json.loads(data[start:start + hlen])
    except ValueError:
        return None
    obj = data[start + hlen:]
    if not isinstance(header, dict) or header.get("key") != key or header.get("length") != len(obj):
        return None
    if header.get("sha256") != hashlib.sha256(obj).hexdigest():
        return None
    symbols = header.get("symbols")
    if not isinstance(symbols, list) or not all(isinstance(s, str) for s in symbols):
        return None
    return obj, symbols


KERNEL_CACHE = KernelCache()
