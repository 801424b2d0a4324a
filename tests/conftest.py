"""Shared fixtures: every test runs inside a registry scope, so nothing it registers leaks."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kiln import registry


@pytest.fixture(autouse=True)
def _registry_scope() -> Iterator[None]:
    with registry.scope():
        yield


@pytest.fixture(autouse=True, scope="session")
def _private_kernel_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Compiled kernels go to a temporary folder, never the user's cache."""
    mp = pytest.MonkeyPatch()
    mp.setenv("KILN_CACHE_DIR", str(tmp_path_factory.mktemp("kiln-cache")))
    try:
        yield
    finally:
        mp.undo()
