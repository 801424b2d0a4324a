"""kiln's own exception types.

Every error that a user can cause derives from `KilnError`, so callers can catch
kiln's errors apart from bugs. Each subclass also derives from the builtin that
best describes it (`LookupError`, `ValueError`, `TypeError`), so code written
against the builtins keeps working.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class KilnError(Exception):
    """Base class of every error kiln raises on purpose."""


class RegistryError(KilnError):
    """A registration broke one of the registry's rules."""


class UnknownNameError(RegistryError, LookupError):
    """A lookup named an entry or attribute key that is not registered."""

    def __str__(self) -> str:  # LookupError would otherwise repr() the message
        return str(self.args[0]) if self.args else ""


class DuplicateAttrError(RegistryError):
    """The same attribute was set twice at the same plevel."""


class AttrValueError(RegistryError, TypeError):
    """An attribute or registration value is of the wrong kind."""


class TargetError(KilnError, ValueError):
    """A target string, dict or option is malformed or unknown."""


def closest(name: str, candidates: Iterable[str], n: int = 3) -> list[str]:
    """Returns up to `n` of `candidates` that look most like `name`."""
    return difflib.get_close_matches(name, list(candidates), n=n, cutoff=0.5)


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """Returns " (did you mean 'a', 'b'?)" for the closest candidates, or ""."""
    near = closest(name, candidates)
    if not near:
        return ""
    return " (did you mean " + ", ".join(repr(c) for c in near) + "?)"
