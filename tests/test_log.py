"""kiln's log: quiet by default; `KILN_LOG_LEVEL` or `kiln -v` shows what a build did (its kernels, the library
cache's hit or store, its time) on stderr; a bad level is a warning, never a failure."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kiln import log

BUILD_TWICE = ("from kiln import relay\n"
               "x = relay.var('x', shape=(2, 3))\n"
               "for _ in range(2):\n"
               "    relay.build(relay.Function([x], relay.exp(x)))\n")


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


def test_quiet_unless_asked_and_then_each_build_is_logged(tmp_path: Path) -> None:
    assert _run(BUILD_TWICE, KILN_CACHE_DIR=str(tmp_path / "quiet")).stderr == ""
    err = _run(BUILD_TWICE, KILN_LOG_LEVEL="info", KILN_CACHE_DIR=str(tmp_path / "logged")).stderr.splitlines()
    assert err[0].startswith("kiln INFO kiln.relay.build: compiled 1 kernels, 1 launches for llvm")
    assert err[1].startswith("kiln INFO kiln.relay.build: 1 kernels for llvm") and "from the library cache" in err[1]


def test_a_bad_level_is_a_warning_and_the_command_line_asks_with_v() -> None:
    done = _run("import kiln", KILN_LOG_LEVEL="loud")
    assert done.returncode == 0
    assert "KILN_LOG_LEVEL: unknown log level 'loud': one of DEBUG, INFO, WARNING, ERROR, CRITICAL" in done.stderr
    done = _run("import sys\nfrom kiln.cli import main\nsys.exit(main(['-v', 'target']))")
    assert done.returncode == 0
    with pytest.raises(ValueError, match="unknown log level 'LOUD'"):
        log.set_level("LOUD")
