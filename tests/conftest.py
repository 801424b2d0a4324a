"""Shared fixtures: every test runs inside a registry scope, so nothing it registers leaks."""

from __future__ import annotations

import zlib
from collections.abc import Iterator

import numpy as np
import pytest

from kiln import registry


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fuzz-long", type=float, default=None, metavar="SECONDS",
        help="run each fuzzer (Relay graphs, ONNX mutations) for SECONDS instead of its short default budget",
    )


@pytest.fixture(autouse=True)
def _registry_scope() -> Iterator[None]:
    with registry.scope():
        yield


@pytest.fixture(autouse=True)
def _order_independent_rngs(request: pytest.FixtureRequest) -> None:
    """A test module's numpy Generators are reseeded from the test's id before it runs.

    A module-level generator otherwise hands each test whatever state the tests
    before it in the same worker left, so a failure on CI's order would not
    reproduce when the test is run alone.
    """
    module = getattr(request, "module", None)
    if module is None:
        return
    seed = zlib.crc32(request.node.nodeid.encode())
    for name, value in list(vars(module).items()):
        if isinstance(value, np.random.Generator):
            setattr(module, name, np.random.default_rng(seed))


@pytest.fixture(autouse=True, scope="session")
def _private_kernel_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Compiled kernels and the secret key go to temporary folders, never the user's cache and key."""
    mp = pytest.MonkeyPatch()
    mp.setenv("KILN_CACHE_DIR", str(tmp_path_factory.mktemp("kiln-cache")))
    # the secret that signs libraries and cache entries too: tests never read or create the user's key
    mp.setenv("KILN_SECRET_FILE", str(tmp_path_factory.mktemp("kiln-secret") / "secret.key"))
    try:
        yield
    finally:
        mp.undo()
