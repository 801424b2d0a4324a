"""Whole compiled models on disk: `relay.build`'s cache of libraries, by the key of what it was given.

A second `relay.build` of the same model (same Relay text, same constants and
params, same target and PassContext, same kiln source) loads the library the
first one stored instead of optimizing, lowering and linking again: from ONNX
file to executor in about a second for ResNet-50, where compiling it takes
many. `relay.build` computes the key (`kiln.relay.backend.build_module`); this
module stores and finds libraries under it.

An entry is an exported library (`Library.export`): signed with the user's
secret (`kiln.runtime.trust`) and fully validated by `runtime.load` before any
of its code is linked; the key is written inside the signed file, so an entry
renamed to another key is refused. A refused or unreadable entry is deleted
and the model compiled. Entries live in `libraries/` of the kernel cache's
folder (`$KILN_CACHE_DIR`, default `$XDG_CACHE_HOME/kiln` or `~/.cache/kiln`; `KILN_CACHE=0`
turns it off), owned by the user and closed to others; at most `MAX_ENTRIES` files and
`MAX_BYTES` in all are kept, the least recently used removed first. CPU and
CUDA libraries alike: a CUDA entry holds CUBINs, and one whose architecture
the current GPU cannot run is refused by `load` (then deleted and rebuilt).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from kiln import log
from kiln.errors import KilnError
from kiln.runtime import trust
from kiln.runtime.library import Library, load

MAX_ENTRIES = 16
MAX_BYTES = 4 << 30


def enabled() -> bool:
    """Whether kiln's caches are on (`KILN_CACHE` is not "0")."""
    return os.environ.get("KILN_CACHE", "1") != "0"


def cache_directory() -> Path:
    """kiln's cache folder (the kernel cache's too): `$KILN_CACHE_DIR`, else `kiln` in the platform's cache
    folder (`$XDG_CACHE_HOME` when it is an absolute path, else `~/.cache`)."""
    env = os.environ.get("KILN_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache") / "kiln"


def folder() -> Path:
    """Where the libraries are stored."""
    return cache_directory() / "libraries"


def path(key: str) -> Path:
    """The file of `key`."""
    return folder() / f"{key}.kiln"


_LOG = log.get("library_cache")


def find(key: str) -> Library | None:
    """The library stored under `key`, or None (absent, or refused: then deleted).

    Raises:
        TrustSetupError: when the cache folder is another user's or writable by others.
    """
    if not enabled():
        return None
    file = path(key)
    if not file.is_file():
        return None
    for d in (cache_directory(), folder()):
        trust.check_private_folder(d, "kiln cache folder")
    try:
        lib = load(file)
    except (KilnError, OSError) as err:  # altered, truncated, not ours, for another CPU or GPU: compile instead
        _LOG.warning("library cache: %s refused (%s); compiling instead", file.name, err)
        lib = None
    if lib is None or lib.cache_key != key:
        with contextlib.suppress(OSError):
            file.unlink()
        return None
    with contextlib.suppress(OSError):
        os.utime(file)  # recently used: evicted last
    return lib


def store(key: str, lib: Library) -> None:
    """Writes `lib` under `key` atomically, then trims the folder; an unwritable folder skips it.

    Raises:
        TrustSetupError: when the cache folder is another user's or writable by others.
    """
    if not enabled():
        return
    for d in (cache_directory(), folder()):
        trust.make_private_folder(d, "kiln cache folder")
    try:
        fd, tmp = tempfile.mkstemp(dir=folder(), prefix=".tmp-", suffix=".kiln")
        os.close(fd)
        try:
            lib.export(tmp, cache_key=key)
            os.replace(tmp, path(key))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError:
        return
    _trim()


def _trim() -> None:
    """Removes the least recently used entries beyond `MAX_ENTRIES` files or `MAX_BYTES`."""
    trim(folder().glob("*.kiln"), MAX_ENTRIES, MAX_BYTES)


def trim(files: Iterable[Path], max_files: int, max_bytes: int) -> None:
    """Removes the least recently used (modified) of `files` beyond `max_files` files or `max_bytes` in all."""
    entries = []
    for f in files:
        with contextlib.suppress(OSError):
            st = f.stat()
            entries.append((st.st_mtime, st.st_size, f))
    entries.sort(reverse=True)
    total = 0
    for n, (_, size, f) in enumerate(entries):
        total += size
        if n >= max_files or total > max_bytes:
            with contextlib.suppress(OSError):
                f.unlink()


def usage(files: Iterable[Path]) -> tuple[int, int]:
    """How many of `files` there are and their bytes in all."""
    count = total = 0
    for f in files:
        with contextlib.suppress(OSError):
            total += f.stat().st_size
            count += 1
    return count, total
