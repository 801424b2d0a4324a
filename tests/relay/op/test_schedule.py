"""The generic CPU schedules of kiln/relay/op/_schedule.py: injective groups as rows."""

from __future__ import annotations

import numpy as np
import pytest

from kiln import relay
from kiln.relay.backend.build_module import build


@pytest.mark.parametrize(("shape", "gate"), [
    ((1, 48, 14, 14), (1, 48, 1, 1)),  # squeeze-excite's gate on NCHW: rows of 196 vectorized whole
    ((1, 64, 7, 7), (1, 64, 1, 1)),  # rows of 49
    ((2, 5, 13, 13), (1, 5, 1, 1)),  # rows of 169
    ((3, 7, 65), (3, 7, 1)),  # one axis of rows
    ((1, 300), (1, 1)),  # one row: all axes split into chunks instead
    ((4, 3, 2), (4, 3, 1)),  # rows too short: the same
    ((3, 7, 16), (3, 7, 1)),  # rows of exactly one vector
])
def test_a_broadcast_along_rows_is_one_scalar_per_row(monkeypatch, shape, gate) -> None:
    monkeypatch.setenv("KILN_CACHE", "0")  # compiled here: its assembly is at hand
    x, g = relay.var("x", shape=shape), relay.var("g", shape=gate)
    lib = build(relay.Function([x, g], relay.multiply(x, relay.sigmoid(g))))
    rng = np.random.default_rng(0)
    xv, gv = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(gate).astype(np.float32)
    got = np.asarray(lib.create_executor()(x=xv, g=gv))
    np.testing.assert_allclose(got, xv / (1 + np.exp(-gv)), rtol=1e-6, atol=1e-6)
    if np.prod(shape[:-1]) > 1 and np.prod(shape[1:]) >= 16:  # rows: the gate is one scalar a row, no gather
        assert "vgather" not in lib.kernels[0].get_source("asm")
