"""Shared fixtures: every test runs inside a registry scope, so nothing it registers leaks."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kiln import registry


@pytest.fixture(autouse=True)
def _registry_scope() -> Iterator[None]:
    with registry.scope():
        yield
