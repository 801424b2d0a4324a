"""`kiln.testing.models` built with symbolic batch (and sequence) dims: compiled once, run at many sizes against
the numpy versions, with no compilation after the build."""

from __future__ import annotations

import numpy as np
import pytest

from kiln import relay
from kiln.relay.backend import te_compiler
from kiln.testing import models

RNG = np.random.default_rng(0)


def no_compiling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(te_compiler, "compile_primitive", lambda *a, **k: pytest.fail("compiled at run time"))


def test_encoder_of_symbolic_batch_and_sequence_runs_every_size(monkeypatch: pytest.MonkeyPatch) -> None:
    func, params = models.encoder("n", "s", hidden=32, heads=4, ffn=64)
    lib = relay.build(func, params=params)
    kernels = len(lib.kernels)
    no_compiling(monkeypatch)
    ex = lib.create_executor()
    for n, s in [(1, 1), (3, 17), (8, 5), (1, 40)]:
        x = RNG.standard_normal((n, s, 32)).astype("float32")
        np.testing.assert_allclose(ex(x=x), models.encoder_numpy(x, params, heads=4), rtol=1e-4, atol=1e-4)
    assert len(lib.kernels) == kernels


def test_mlp_of_symbolic_batch_with_a_specialized_size(monkeypatch: pytest.MonkeyPatch) -> None:
    func, params = models.mlp("n", sizes=(20, 16, 10))
    lib = relay.build(func, params=params, specialize={"n": [4]})
    no_compiling(monkeypatch)
    ex = lib.create_executor()
    for n in (1, 4, 9, 64):
        x = RNG.standard_normal((n, 20)).astype("float32")
        np.testing.assert_allclose(ex(x=x), models.mlp_numpy(x, params), rtol=1e-4, atol=1e-5)


def test_cnn_of_symbolic_batch_runs_batches_1_2_7_and_64(monkeypatch: pytest.MonkeyPatch) -> None:
    func, params = models.cnn("n", size=16, channels=(4, 8))
    lib = relay.build(func, params=params)
    no_compiling(monkeypatch)
    ex = lib.create_executor()
    for n in (1, 2, 7, 64):
        x = RNG.standard_normal((n, 3, 16, 16)).astype("float32")
        np.testing.assert_allclose(ex(x=x), models.cnn_numpy(x, params), rtol=1e-4, atol=1e-4)
