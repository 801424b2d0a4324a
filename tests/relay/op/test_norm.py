"""The normalizations of kiln.relay.op.norm (nn.batch_norm, nn.layer_norm), compiled.

Their relations and references are tested in test_nn.py; here each op goes
through the lowering path and must agree with its numpy reference, every output
of batch_norm's tuple included.
"""

from __future__ import annotations

import numpy as np
import pytest
from op_helpers import check_build, rand

from kiln.relay.op import nn, norm


def test_the_constructors_are_those_of_relay_nn() -> None:
    assert nn.batch_norm is norm.batch_norm and nn.layer_norm is norm.layer_norm
    assert nn.BatchNormAttrs is norm.BatchNormAttrs and nn.LayerNormAttrs is norm.LayerNormAttrs


def _bn_params(c: int, dtype: str = "float32") -> list[np.ndarray]:
    return [rand(c, dtype=dtype), rand(c, dtype=dtype), rand(c, dtype=dtype), np.abs(rand(c, dtype=dtype)) + 0.1]


@pytest.mark.parametrize(("shape", "axis"), [((2, 3, 4, 4), 1), ((2, 4, 4, 3), -1), ((5, 6), 1), ((6,), 0)])
@pytest.mark.parametrize(("center", "scale"), [(True, True), (False, True), (True, False), (False, False)])
def test_batch_norm_builds(shape, axis, center, scale) -> None:
    check_build("nn.batch_norm", rand(*shape), *_bn_params(shape[axis]), rtol=1e-5, atol=1e-5,
                axis=axis, center=center, scale=scale)


def test_batch_norm_builds_in_float64_with_epsilon() -> None:
    check_build("nn.batch_norm", rand(2, 3, 5, dtype="float64"), *_bn_params(3, "float64"), rtol=1e-12,
                axis=-2, epsilon=1e-2)


@pytest.mark.parametrize(("shape", "axis"), [((3, 8), -1), ((3, 8), 0), ((2, 5, 4), 1), ((8,), 0), ((16, 64), -1)])
@pytest.mark.parametrize(("center", "scale"), [(True, True), (False, False)])
def test_layer_norm_builds(shape, axis, center, scale) -> None:
    size = shape[axis]
    check_build("nn.layer_norm", rand(*shape) * 3 + 1, rand(size), rand(size), rtol=1e-4, atol=1e-4,
                axis=axis, center=center, scale=scale)


def test_layer_norm_builds_in_float64_with_epsilon() -> None:
    check_build("nn.layer_norm", rand(4, 6, dtype="float64"), rand(6, dtype="float64"), rand(6, dtype="float64"),
                rtol=1e-12, atol=1e-12, epsilon=0.5)
