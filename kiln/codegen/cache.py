"""The compiled-kernel cache: in memory and on disk.

A kernel's key is the sha256 of its canonical loop-IR text (`str(prim_func)`),
the target string (CPU name and features), the llvmlite version, kiln's
version and a digest of the code generator's source files. In memory, a bounded LRU dict of
compiled `Module`s; on disk, one file per key under `$KILN_CACHE_DIR` (default
`$XDG_CACHE_HOME/kiln` or `~/.cache/kiln`) holding the object code behind a header with its length,
checksum, key and an HMAC-SHA256 tag of key and code under the user's secret
(`kiln.runtime.trust`); at most `MAX_FILES` files and `MAX_BYTES` in all, the least recently used removed
first (`kiln cache info` / `kiln cache clear` show and empty the folder). A cache entry is code: the sha256 only detects
accidents (anyone can recompute it), the tag tells that this user's kiln
wrote the entry. A file whose header, length, checksum, key or tag does not
match is deleted and the kernel recompiled: it is never loaded (`corrupt`
counts them; `untrusted`, those refused for their tag alone). Files are
written to a temporary name and renamed, so readers never see half a file.

The folder is created 0700 (and each of its subfolders); a cache folder owned
by another user, or writable by group or others, is refused with
`TrustSetupError`, which names it and says how to fix it. `KILN_CACHE=0`
turns both caches off.
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
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import llvmlite

from kiln.runtime import library_cache, trust
from kiln.target import Target
from kiln.version import __version__

if TYPE_CHECKING:
    from kiln.runtime.module import Module


def _codegen_version() -> str:
    """A digest of the code generator's own source, so editing it never serves kernels it made before."""
    h = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


CODEGEN_VERSION = _codegen_version()
_MAGIC = b"KILNOBJ2"  # 2: with an HMAC tag
_MEMORY_LIMIT = 64  # live Modules: each holds a JIT engine, about 50 KB of native memory


enabled = library_cache.enabled  # KILN_CACHE, for both caches
directory = library_cache.cache_directory
MAX_FILES = 100_000  # kernels kept on disk at most (the least recently used go first)
MAX_BYTES = 2 << 30  # and bytes of them in all
_TRIM_EVERY = 256  # stores between two trims (a trim reads every file's time)


def kernel_files() -> Iterator[Path]:
    """The kernel cache's files on disk."""
    return directory().glob("??/*.kobj")


def cache_key(func_text: str, target: Target) -> str:
    """The sha256 key of a kernel: loop-IR text, target, llvmlite, kiln and codegen versions."""
    h = hashlib.sha256()
    for part in (func_text, str(target), llvmlite.__version__, __version__, CODEGEN_VERSION):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


class KernelCache:
    """Compiled kernels by key: an LRU of live Modules, and object files on disk."""

    def __init__(self, limit: int = _MEMORY_LIMIT) -> None:
        self._memory: OrderedDict[str, Module] = OrderedDict()
        self._limit = limit
        self._lock = threading.Lock()
        self.hits = self.misses = self.disk_hits = self.corrupt = self.untrusted = 0
        self._stores = 0

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
        if not _private_folders(path.parent, create=False):
            self.misses += 1
            return None
        try:
            data = path.read_bytes()
        except OSError:
            self.misses += 1
            return None
        got = _decode(data, key)
        if isinstance(got, str):
            self.corrupt += 1
            self.untrusted += got == "untrusted"
            self.misses += 1
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        self.disk_hits += 1
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: trimmed last
        return got

    def store(self, key: str, obj: bytes, symbols: list[str]) -> None:
        """Writes the object code of `key` atomically; an unwritable folder only skips the store.

        Raises:
            TrustSetupError: when the cache folder is another user's or writable by others.
        """
        path = self.path(key)
        try:
            _private_folders(path.parent, create=True)  # TrustSetupError is no OSError: it goes up
        except OSError:
            return
        try:
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".kobj")
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(_encode(key, obj, symbols))
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError:
            return
        self._stores += 1
        if self._stores % _TRIM_EVERY == 1:  # the first store of a process, then every so often
            library_cache.trim(kernel_files(), MAX_FILES, MAX_BYTES)


def _private_folders(folder: Path, create: bool) -> bool:
    """Checks (with `create`, first makes, mode 0700) the cache folder and `folder` inside it; False
    when they do not exist.

    Raises:
        TrustSetupError: for a folder owned by another user or writable by others.
    """
    for d in dict.fromkeys((directory(), folder)):
        if create:
            trust.make_private_folder(d, "kiln cache folder")
        elif not d.is_dir():
            return False
        else:
            trust.check_private_folder(d, "kiln cache folder")
    return True


def _signed(key: str, symbols: list[str], obj: bytes) -> bytes:
    """What an entry's tag covers: the key (so an entry cannot be moved to another key), the
    (informational) symbols and the code."""
    return b"\0".join((_MAGIC, key.encode(), json.dumps(symbols).encode(), obj))


def _encode(key: str, obj: bytes, symbols: list[str]) -> bytes:
    header = json.dumps({"key": key, "length": len(obj), "sha256": hashlib.sha256(obj).hexdigest(),
                         "symbols": symbols, "hmac": trust.sign(_signed(key, symbols, obj)).hex()}).encode()
    return _MAGIC + struct.pack("<Q", len(header)) + header + obj


def _decode(data: bytes, key: str) -> tuple[bytes, list[str]] | str:
    """(object code, symbols) of a cache file, or why it is refused: "corrupt" or "untrusted"."""
    if not data.startswith(_MAGIC) or len(data) < len(_MAGIC) + 8:
        return "corrupt"
    (hlen,) = struct.unpack_from("<Q", data, len(_MAGIC))
    start = len(_MAGIC) + 8
    if hlen > len(data) - start:
        return "corrupt"
    try:
        header = json.loads(data[start:start + hlen])
    except ValueError:
        return "corrupt"
    obj = data[start + hlen:]
    if not isinstance(header, dict) or header.get("key") != key or header.get("length") != len(obj):
        return "corrupt"
    if header.get("sha256") != hashlib.sha256(obj).hexdigest():
        return "corrupt"
    symbols = header.get("symbols")
    if not isinstance(symbols, list) or not all(isinstance(s, str) for s in symbols):
        return "corrupt"
    tag = header.get("hmac")
    try:
        tag_bytes = bytes.fromhex(tag) if isinstance(tag, str) else b""
    except ValueError:
        tag_bytes = b""
    if not trust.verify(_signed(key, symbols, obj), tag_bytes):
        return "untrusted"
    return obj, symbols


KERNEL_CACHE = KernelCache()
