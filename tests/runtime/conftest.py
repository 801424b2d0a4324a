"""What the runtime tests share."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture()
def own_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh secret key for this test (files signed by other tests' keys are then foreign)."""
    path = tmp_path / "keys" / "secret.key"
    monkeypatch.setenv("KILN_SECRET_FILE", str(path))
    return path
