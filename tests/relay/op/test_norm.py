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


# --- layer_norm along the last axis: the llvm "rows" implementation ------------------------------------


def _layer_norm64(x: np.ndarray, gamma: np.ndarray | None, beta: np.ndarray | None,
                  epsilon: float = 1e-5) -> np.ndarray:
    """layer_norm along the last axis in float64, two passes as the reference."""
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=-1, keepdims=True)
    out = (x64 - mean) / np.sqrt(((x64 - mean) ** 2).mean(axis=-1, keepdims=True) + epsilon)
    if gamma is not None:
        out = out * gamma.astype(np.float64)
    if beta is not None:
        out = out + beta.astype(np.float64)
    return np.asarray(out)


@pytest.mark.parametrize("n", [1, 3, 16, 17, 64, 65, 96, 768, 1000, 4097])
def test_layer_norm_rows_match_numpy_over_odd_row_lengths(n) -> None:
    # rows of n = groups of 4 vectors of 16 lanes, the vectors past them, and the last n % 16 values
    check_build("nn.layer_norm", rand(5, n) * 3 + 1, rand(n), rand(n), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(2, 3, 768), (768,), (1, 197, 768), (64, 96), (2, 2, 3, 5)])
@pytest.mark.parametrize(("center", "scale"), [(True, True), (False, True), (True, False), (False, False)])
def test_layer_norm_rows_of_batch_shapes_with_and_without_gamma_and_beta(shape, center, scale) -> None:
    n = shape[-1]
    check_build("nn.layer_norm", rand(*shape) * 2 - 1, rand(n), rand(n), rtol=1e-4, atol=1e-4,
                center=center, scale=scale)


@pytest.mark.parametrize("n", [3, 17, 768, 4097])
def test_layer_norm_rows_in_float64(n) -> None:
    x, g, b = rand(4, n, dtype="float64") * 5 + 2, rand(n, dtype="float64"), rand(n, dtype="float64")
    check_build("nn.layer_norm", x, g, b, rtol=1e-11, atol=1e-12, epsilon=1e-3)


@pytest.mark.parametrize("n", [17, 768, 4097])
def test_float16_layer_norm_rows_compute_in_float32(n) -> None:
    from op_helpers import build_op

    rng = np.random.default_rng(n)
    x = rng.uniform(-8, 8, (6, n)).astype(np.float16) + np.float16(40)
    g, b = rng.uniform(0.5, 1.5, n).astype(np.float16), rng.uniform(-1, 1, n).astype(np.float16)
    (got,) = build_op("nn.layer_norm", x, g, b)
    assert got.dtype == np.float16
    # float16 sums of thousands of values near 40 would be off by whole units (steps of 32 near 40000);
    # in float32 the output is the float64 result rounded once, to within float16's own steps
    np.testing.assert_allclose(got.astype(np.float64), _layer_norm64(x, g, b), rtol=2e-3, atol=4e-3)


def test_layer_norm_rows_take_deviations_from_the_mean_not_the_mean_of_squares() -> None:
    from op_helpers import build_op

    # rows far from zero with a small spread: E[x^2] - E[x]^2 would cancel to noise (1e4 against 1e-4)
    x = (100 + rand(8, 768) * 0.01).astype(np.float32)
    (got,) = build_op("nn.layer_norm", x, np.ones(768, np.float32), np.zeros(768, np.float32), epsilon=1e-9)
    np.testing.assert_allclose(got, _layer_norm64(x, None, None, epsilon=1e-9), rtol=0, atol=1e-2)
    np.testing.assert_allclose(got.std(axis=-1), 1.0, rtol=1e-3)


def test_layer_norm_of_a_constant_row_is_beta() -> None:
    from op_helpers import build_op

    x = np.full((3, 100), 7.5, np.float32)
    b = rand(100)
    (got,) = build_op("nn.layer_norm", x, rand(100), b)
    np.testing.assert_allclose(got, np.broadcast_to(b, x.shape), rtol=0, atol=1e-6)


@pytest.mark.parametrize("shape", [(1, 16, 64), (2, 3, 768), (4, 1000)])
def test_a_residual_add_fuses_into_the_layer_norm_kernel(shape) -> None:
    from kiln import relay

    n = shape[-1]
    x, y = relay.var("x", shape=shape), relay.var("y", shape=shape)
    bias, g, b = relay.var("bias", shape=(n,)), relay.var("g", shape=(n,)), relay.var("b", shape=(n,))
    out = relay.nn.layer_norm(relay.add(relay.add(x, y), bias), g, b)
    lib = relay.build(relay.Function([x, y, bias, g, b], out))
    assert len(lib.graph.launches) == 1  # the adds are inlined into the reads of the layer norm's rows
    values = {"x": rand(*shape), "y": rand(*shape), "bias": rand(n), "g": rand(n), "b": rand(n)}
    got = lib.create_executor()(**values)
    want = _layer_norm64(values["x"] + values["y"] + values["bias"], values["g"], values["b"])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_residual_add_read_after_the_layer_norm_too_is_computed_once() -> None:
    from kiln import relay

    # pre-norm blocks (GPT-2, ViT): h = x + attn feeds the layer norm and the next residual add; the layer
    # norm does not post-dominate h, so h is its own kernel and the layer norm reads it
    x, y = relay.var("x", shape=(2, 8, 64)), relay.var("y", shape=(2, 8, 64))
    g, b = relay.var("g", shape=(64,)), relay.var("b", shape=(64,))
    h = relay.add(x, y)
    lib = relay.build(relay.Function([x, y, g, b], relay.add(h, relay.nn.layer_norm(h, g, b))))
    assert len(lib.graph.launches) == 3
    values = {"x": rand(2, 8, 64), "y": rand(2, 8, 64), "g": rand(64), "b": rand(64)}
    got = lib.create_executor()(**values)
    hv = values["x"] + values["y"]
    np.testing.assert_allclose(got, hv + _layer_norm64(hv, values["g"], values["b"]), rtol=1e-4, atol=1e-4)


def test_layer_norm_rows_run_in_vectors() -> None:
    from kiln import relay
    from kiln.relay.backend.te_compiler import compile_primitive
    from kiln.target import Target

    if "+avx512f" not in Target("llvm").export().get("mattr", []):
        pytest.skip("the host has no AVX-512 (zmm) registers")
    x, g, b = relay.var("x", shape=(128, 768)), relay.var("g", shape=(768,)), relay.var("b", shape=(768,))
    kernel = compile_primitive(relay.infer_type(relay.Function([x, g, b], relay.nn.layer_norm(x, g, b))), "llvm",
                               name="rows")
    asm = kernel.module.get_source("asm")
    assert "zmm" in asm and "vsqrtss" in asm  # one scalar square root a row, the rest in vectors
