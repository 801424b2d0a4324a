"""Who wrote this code? The per-user secret that authenticates kiln's own compiled files.

Models are data; compiled libraries and cache entries are code. A sha256 in a
file's header only detects accidents: anyone who can edit the file can
recompute it. So every file of code that kiln writes (an exported `.kiln`
library, a kernel-cache entry, a cached CUBIN) also carries an HMAC-SHA256 tag
of its contents under a secret that only this user can read, and kiln loads
only files whose tag verifies.

The secret is 32 random bytes in a key file: `$KILN_SECRET_FILE`, default
`~/.config/kiln/secret.key`. It is created on first use with mode 0600 in a
folder created 0700, atomically (`O_CREAT | O_EXCL`: when several processes
race, one file wins and every process reads it). A key file owned by another
user, or readable or writable by group or others, is refused with
`TrustSetupError`: a secret others can read authenticates nothing.

`check_private_folder` applies the same rule to the folders code is read from
(the kernel cache): owned by this user and not writable by group or others.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import os
import stat
import threading
from pathlib import Path

from kiln.errors import KilnError

KEY_BYTES = 32
TAG_BYTES = 32  # HMAC-SHA256


class TrustSetupError(KilnError, RuntimeError):
    """The secret key file or a folder of code is unsafe (wrong owner or permissions) or unusable.

    Not an OSError on purpose: code that skips an unwritable cache (`except OSError`) must not skip this.
    """


def secret_path() -> Path:
    """The key file: `$KILN_SECRET_FILE`, else `~/.config/kiln/secret.key`."""
    env = os.environ.get("KILN_SECRET_FILE")
    return Path(env) if env else Path.home() / ".config" / "kiln" / "secret.key"


def _check_owner_and_mode(st: os.stat_result, path: Path, what: str, forbidden: int, fix: str) -> None:
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise TrustSetupError(
            f"{what} {str(path)!r} is owned by user id {st.st_uid}, not by you (user id {os.getuid()}); "
            f"kiln refuses it because another user could change it. {fix}"
        )
    if st.st_mode & forbidden:
        raise TrustSetupError(
            f"{what} {str(path)!r} has mode {stat.S_IMODE(st.st_mode):04o}, which lets other users "
            f"{'read or write' if forbidden & 0o044 else 'write'} it; kiln refuses it. {fix}"
        )


def check_private_folder(path: Path, what: str = "folder") -> None:
    """Refuses a folder that is not this user's own: another owner, or writable by group or others.

    Args:
        path: an existing folder.
        what: how the message names it (e.g. "kiln cache folder").

    Raises:
        TrustSetupError: naming the folder, what is wrong and how to fix it.
    """
    st = path.stat()
    fix = (f"Fix it with `chmod go-w {path}` if it is yours, or point kiln elsewhere "
           "(KILN_CACHE_DIR=<a folder of yours>, or KILN_CACHE=0 to turn caching off).")
    if not stat.S_ISDIR(st.st_mode):
        raise TrustSetupError(f"{what} {str(path)!r} is not a folder. {fix}")
    _check_owner_and_mode(st, path, what, 0o022, fix)


def make_private_folder(path: Path, what: str = "folder") -> None:
    """Creates `path` (and missing parents) with mode 0700 if absent, then `check_private_folder`s it.

    Raises:
        TrustSetupError: when the folder exists but is unsafe.
        OSError: when it cannot be created.
    """
    if not path.is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):  # another process made it first: checked below
            path.mkdir(mode=0o700)
    check_private_folder(path, what)


def _read_key(path: Path) -> bytes:
    fix = (f"Fix it with `chmod 600 {path}` if it is yours, or delete it (kiln makes a new one; files it "
           "signed before must then be re-exported), or set KILN_SECRET_FILE to a file of your own.")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as fh:
        _check_owner_and_mode(os.fstat(fh.fileno()), path, "kiln secret key file", 0o077, fix)
        key = fh.read(KEY_BYTES + 1)
    if len(key) != KEY_BYTES:
        raise TrustSetupError(f"kiln secret key file {str(path)!r} holds {len(key)} bytes, not {KEY_BYTES}; "
                              "delete it and kiln makes a new one (files signed with it must be re-exported)")
    return key


def _create_key(path: Path) -> bytes | None:
    """Writes a new random key to `path`; None when another process created the file first."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = os.urandom(KEY_BYTES)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(key)
            fh.flush()
            os.fsync(fh.fileno())
        # link() fails with EEXIST if the name exists, so the key file appears whole, once: a
        # concurrent reader never sees a half-written key, and a loser reads the winner's
        try:
            os.link(tmp, path)
        except FileExistsError:
            return None
        except OSError as exc:  # a file system without hard links: exclusive create in place
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise
            try:
                fd2 = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                return None
            with os.fdopen(fd2, "wb") as fh:
                fh.write(key)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return key


def secret() -> bytes:
    """This user's secret key, created on first use.

    Raises:
        TrustSetupError: when the key file is another user's, readable or writable by others,
            or not a key; or cannot be created.
    """
    # read every time (a few microseconds): a key file replaced or opened up to others is seen at once
    path = secret_path()
    try:
        key = _read_key(path) if path.exists() else _create_key(path)
        return key if key is not None else _read_key(path)
    except TrustSetupError:
        raise
    except OSError as exc:
        raise TrustSetupError(
            f"cannot read or create kiln's secret key file {str(path)!r} ({exc.strerror or exc}); "
            "set KILN_SECRET_FILE to a file in a folder of yours (KILN_CACHE=0 builds without the disk cache, "
            "which needs no key)"
        ) from exc


def sign(data: bytes) -> bytes:
    """The HMAC-SHA256 tag of `data` under this user's secret."""
    return hmac.new(secret(), data, hashlib.sha256).digest()


def verify(data: bytes, tag: bytes) -> bool:
    """Whether `tag` is this user's tag of `data` (compared in constant time)."""
    return hmac.compare_digest(sign(data), tag)
