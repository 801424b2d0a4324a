"""Reading and forging kiln library files as an attacker would: the tests of the library format share these.

A library file is `KILNLIB2`, the payload's length, its sha256, an HMAC tag
(`kiln.runtime.trust`), then the payload: a JSON header's length, the header,
and the blobs it sizes.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

FIXED = 8 + 8 + 32 + 32  # magic, length, sha256, tag


def split(path: Path) -> tuple[dict[str, Any], list[bytes]]:
    """The JSON header and blobs of a library file (no checks: the attacker's view)."""
    payload = path.read_bytes()[FIXED:]
    (head_len,) = struct.unpack_from("<Q", payload, 0)
    header = json.loads(payload[8: 8 + head_len])
    blobs, pos = [], 8 + head_len
    for n in header["blobs"]:
        blobs.append(payload[pos: pos + n])
        pos += n
    return header, blobs


def forge(path: Path, header: dict[str, Any], blobs: list[bytes], out: Path, sizes: list[int] | None = None) -> Path:
    """Writes a library with `header` and `blobs` (declared `sizes`, by default theirs), its sha256
    recomputed and its tag left unforged: the original file's tag, which covered other bytes."""
    header = {**header, "blobs": sizes if sizes is not None else [len(b) for b in blobs]}
    head = json.dumps(header).encode()
    payload = struct.pack("<Q", len(head)) + head + b"".join(blobs)
    tag = path.read_bytes()[48:FIXED]
    out.write_bytes(b"KILNLIB2" + struct.pack("<Q", len(payload)) + hashlib.sha256(payload).digest() + tag + payload)
    return out


def edited(lib_file: Path, edit: Callable[[dict[str, Any], list[bytes]], None], name: str = "edited.kiln") -> Path:
    """A copy of `lib_file` next to it with `edit(header, blobs)` applied (and the tag left unforged)."""
    header, blobs = split(lib_file)
    edit(header, blobs)
    return forge(lib_file, header, blobs, lib_file.parent / name)
