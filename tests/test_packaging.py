"""Packaging as a well-kept library has it: one version, written once; the type hints shipped (PEP 561);
an Apache-2.0 LICENSE, as TVM's; classifiers that say what kiln is."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import kiln

ROOT = Path(__file__).parent.parent


def test_the_version_is_written_once_and_installed_as_written() -> None:
    project = (ROOT / "pyproject.toml").read_text().split("\n[project]\n")[1].split("\n[")[0]
    assert not re.search(r"^version\s*=", project, re.MULTILINE) and re.search(r'^dynamic = \["version"\]', project,
                                                                             re.MULTILINE)
    assert importlib.metadata.version("kiln") == kiln.__version__


def test_the_type_hints_the_license_and_the_classifiers_ship() -> None:
    assert (Path(kiln.__file__).parent / "py.typed").is_file()
    assert (ROOT / "LICENSE").read_text().split()[:4] == ["Apache", "License", "Version", "2.0,"]
    meta = importlib.metadata.metadata("kiln")
    assert meta["License-Expression"] == "Apache-2.0" and "Typing :: Typed" in (meta.get_all("Classifier") or [])
