"""Registration sites: the file and line a user wrote a registration on."""

from __future__ import annotations

import os
import sys
from types import FrameType

import attrs

_HELPER_FILES: set[str] = set()
_HELPER_DIRS: set[str] = {os.path.dirname(os.path.abspath(__file__))}
_KILN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_FOREIGN: list[str] = []  # the first registration site outside the kiln package, once there is one


def foreign_registration() -> str | None:
    """The site of the first registration made from outside the kiln package in this process, or None.

    Caches of whole compiled models are keyed by kiln's own source; once user code has registered an
    op, an attribute or an implementation, what a build produces depends on code no key covers, and
    those caches step aside (`relay.build` compiles).
    """
    return _FOREIGN[0] if _FOREIGN else None


def mark_registration_helper(path: str) -> None:
    """Makes sites skip frames in `path` (a module that registers on a caller's behalf).

    A decorator module that calls `set_attr` for its user marks itself, so the
    recorded site is the user's line, not the helper's.
    """
    _HELPER_FILES.add(os.path.abspath(path))


def _is_registration_api(obj: object) -> bool:
    return bool(getattr(type(obj), "_registration_api", False))


@attrs.frozen
class Site:
    """Where a registration was made: the first caller outside the registry."""

    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"

    @staticmethod
    def here() -> Site:
        """Returns the site of the innermost frame outside kiln's registry code.

        Frames of the registry package, of files marked as registration helpers,
        and of methods of registration classes (those with a true class
        attribute `_registration_api`, such as every `RegEntry`) are skipped, so
        the site is the line a user wrote.
        """
        frame: FrameType | None = sys._getframe(1)
        while frame is not None:
            path = os.path.abspath(frame.f_code.co_filename)
            if (
                os.path.dirname(path) not in _HELPER_DIRS
                and path not in _HELPER_FILES
                and not _is_registration_api(frame.f_locals.get("self"))
            ):
                site = Site(_short_path(path), frame.f_lineno)
                if not _FOREIGN and not path.startswith(_KILN_DIR):
                    _FOREIGN.append(str(site))
                return site
            frame = frame.f_back
        return Site("<unknown>", 0)


def _short_path(path: str) -> str:
    cwd = os.getcwd()
    if path.startswith(cwd + os.sep):
        return os.path.relpath(path, cwd)
    return path
