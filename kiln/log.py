"""kiln's log: the standard `logging` logger "kiln", quiet (warnings only) unless asked.

`KILN_LOG_LEVEL` (`DEBUG`, `INFO`, `WARNING`, ... or a number) sets its level when kiln is imported, with
a handler on stderr; `kiln -v` / `-vv` on the command line does the same for INFO / DEBUG. A program that
configures `logging` itself sees kiln's records as any library's. What is logged: each build (how many
kernels, the library cache's hit or store, the time) and a library cache entry refused (then compiled again).
A leaf module: it imports nothing of kiln, so any layer may log.
"""

from __future__ import annotations

import logging
import os
import sys

LOG = logging.getLogger("kiln")
_FORMAT = "kiln %(levelname)s %(name)s: %(message)s"


def get(name: str) -> logging.Logger:
    """The logger of a kiln module (`kiln.relay.build`, ...), under "kiln"."""
    return LOG.getChild(name)


def set_level(level: int | str) -> None:
    """Logs kiln's records of `level` and above to stderr (one handler, however often it is called).

    Raises:
        ValueError: for a level `logging` does not know.
    """
    value = int(level) if isinstance(level, str) and level.isdigit() else level
    if isinstance(value, str):
        value = value.upper()
        if not isinstance(logging.getLevelName(value), int):  # (the name's level, for a known name)
            raise ValueError(f"unknown log level {level!r}: one of DEBUG, INFO, WARNING, ERROR, CRITICAL")
    LOG.setLevel(value)
    if not any(getattr(h, "_kiln", False) for h in LOG.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(_FORMAT))
        handler._kiln = True  # type: ignore[attr-defined]
        LOG.addHandler(handler)


def configure_from_environment() -> None:
    """Applies `KILN_LOG_LEVEL` when it is set (a bad value is reported as a warning, not an error)."""
    level = os.environ.get("KILN_LOG_LEVEL")
    if level:
        try:
            set_level(level)
        except ValueError as err:
            logging.getLogger("kiln").warning("KILN_LOG_LEVEL: %s", err)
