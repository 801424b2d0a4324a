"""`kiln.testing.train`: 10 compiled SGD steps (forward, softmax cross-entropy, `relay.transform.gradient`, the
update, one library) on the MLP and the small CNN match the same steps written by hand in numpy (float64) to
1e-4 in the parameters, and the loss falls."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kiln import relay
from kiln.testing import models, train

Array = np.ndarray[Any, Any]
LR = 0.1
STEPS = 10


def mlp_step(x: Array, labels: Array, p: dict[str, Array]) -> tuple[float, dict[str, Array]]:
    """One SGD step of the MLP, forward and backward by hand (`train.numpy_mlp_step`)."""
    return train.numpy_mlp_step(x, labels, p, LR)


def im2col(x: Array) -> Array:
    n, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    cols = np.empty((n, c, 3, 3, h, w))
    for i in range(3):
        for j in range(3):
            cols[:, :, i, j] = xp[:, :, i:i + h, j:j + w]
    return cols.reshape(n, c * 9, h * w)


def col2im(dcols: Array, shape: tuple[int, ...]) -> Array:
    n, c, h, w = shape
    dxp = np.zeros((n, c, h + 2, w + 2))
    d = dcols.reshape(n, c, 3, 3, h, w)
    for i in range(3):
        for j in range(3):
            dxp[:, :, i:i + h, j:j + w] += d[:, :, i, j]
    return dxp[:, :, 1:-1, 1:-1]


def cnn_step(x: Array, labels: Array, p: dict[str, Array], layers: int = 2) -> tuple[float, dict[str, Array]]:
    """One SGD step of the CNN (batch_norm in inference form, its statistics fixed), by hand."""
    saved = []
    h = x
    for n in range(layers):
        w = p[f"conv{n}_w"]
        cols = im2col(h)
        conv = (w.reshape(w.shape[0], -1) @ cols).reshape(h.shape[0], w.shape[0], *h.shape[2:])
        inv = 1 / np.sqrt(p[f"bn{n}_var"] + 1e-5)
        scale = p[f"bn{n}_gamma"] * inv
        z = conv * scale[:, None, None] + (p[f"bn{n}_beta"] - p[f"bn{n}_mean"] * scale)[:, None, None]
        a = np.maximum(z, 0)
        b, c, hh, ww = a.shape
        pooled = a.reshape(b, c, hh // 2, 2, ww // 2, 2).max(axis=(3, 5))
        saved.append((h.shape, cols, conv, inv, z, a, pooled))
        h = pooled
    feat = h.mean(axis=(2, 3))
    loss, d = train.numpy_softmax_ce(feat @ p["fc_w"].T + p["fc_b"], labels)
    new = {"fc_w": p["fc_w"] - LR * d.T @ feat, "fc_b": p["fc_b"] - LR * d.sum(axis=0)}
    dh = np.broadcast_to((d @ p["fc_w"])[:, :, None, None] / (h.shape[2] * h.shape[3]), h.shape)
    for n in reversed(range(layers)):
        in_shape, cols, conv, inv, z, a, pooled = saved[n]
        b, c, hh, ww = a.shape
        wins = a.reshape(b, c, hh // 2, 2, ww // 2, 2)
        winner = wins == pooled[:, :, :, None, :, None]
        da = (winner * dh[:, :, :, None, :, None]).reshape(a.shape)
        dz = da * (z > 0)
        dscale = (dz * conv).sum(axis=(0, 2, 3))
        dshift = dz.sum(axis=(0, 2, 3))
        new[f"bn{n}_gamma"] = p[f"bn{n}_gamma"] - LR * (dscale * inv - dshift * p[f"bn{n}_mean"] * inv)
        new[f"bn{n}_beta"] = p[f"bn{n}_beta"] - LR * dshift
        dconv = (dz * (p[f"bn{n}_gamma"] * inv)[:, None, None]).reshape(b, c, hh * ww)
        w = p[f"conv{n}_w"]
        new[f"conv{n}_w"] = p[f"conv{n}_w"] - LR * np.einsum("bop,bkp->ok", dconv, cols).reshape(w.shape)
        dh = col2im(w.reshape(w.shape[0], -1).T @ dconv, in_shape)
    return loss, new


def run_reference(step: Any, x: Array, labels: Array, params: dict[str, Array]) -> tuple[list[float], dict[str, Array]]:
    p = {k: v.astype(np.float64) for k, v in params.items()}
    losses = []
    for _ in range(STEPS):
        loss, updated = step(x.astype(np.float64), labels, p)
        p = {**p, **updated}
        losses.append(loss)
    return losses, p


def assert_matches(got: dict[str, Array], want: dict[str, Array], names: list[str]) -> None:
    for name in names:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4, err_msg=name)


def test_blobs_are_seeded_and_balanced() -> None:
    x, labels = train.blobs(10, (3, 2), seed=4)
    again, _ = train.blobs(10, (3, 2), seed=4)
    assert x.shape == (10, 3, 2) and x.dtype == np.float32 and labels.dtype == np.int64
    np.testing.assert_array_equal(x, again)
    assert np.bincount(labels).tolist() == [5, 5]


def test_mlp_sgd_matches_numpy_and_the_loss_falls() -> None:
    func, params = models.mlp(batch=16, sizes=(20, 32, 32, 10), seed=1)
    x, labels = train.blobs(16, (20,), seed=2)
    step = train.sgd_step(func, lr=LR)
    losses, got = step.fit(x, labels, params, STEPS)
    want_losses, want = run_reference(mlp_step, x, labels, params)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-4)
    assert_matches(got, want, list(params))
    assert losses[-1] < 0.5 * losses[0], losses
    assert not np.allclose(got["w0"], params["w0"])  # the step moved the parameters


def test_cnn_sgd_matches_numpy_and_the_loss_falls() -> None:
    func, params = models.cnn(batch=4, size=8, channels=(4, 6), seed=3)
    x, labels = train.blobs(4, (3, 8, 8), seed=5)
    trained = [n for n in params if not n.endswith(("_mean", "_var"))]
    step = train.sgd_step(func, lr=LR, trained=trained)
    assert step.trained == tuple(n for n in step.params if n in trained)
    losses, got = step.fit(x, labels, params, STEPS)
    want_losses, want = run_reference(cnn_step, x, labels, params)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-4)
    assert_matches(got, want, trained)
    for frozen in ("bn0_mean", "bn1_var"):
        np.testing.assert_array_equal(got[frozen], params[frozen])
    assert losses[-1] < losses[0], losses


def test_the_step_is_one_function_and_one_library() -> None:
    func, _ = models.mlp(batch=4, sizes=(3, 5, 2))
    step_func = train.step_function(func, lr=0.5)
    assert [p.name_hint for p in step_func.params] == ["x", "labels", "w0", "b0", "w1", "b1"]
    fields = step_func.body.checked_type.fields
    assert str(fields[0]) == str(relay.TensorType((), "float32")) and len(fields) == 5


def test_nll_loss_of_log_softmax_trains_as_cross_entropy() -> None:
    func, params = models.mlp(batch=8, sizes=(6, 8, 3), seed=4)
    x, labels = train.blobs(8, (6,), classes=3, seed=6)
    a = train.sgd_step(func, loss="softmax_cross_entropy").fit(x, labels, params, 3)
    b = train.sgd_step(func, loss="nll_loss").fit(x, labels, params, 3)
    np.testing.assert_allclose(a[0], b[0], rtol=1e-5)
    assert_matches(a[1], b[1], list(params))


def test_unknown_trained_parameter_is_refused() -> None:
    func, _ = models.mlp(batch=4, sizes=(3, 5, 2))
    with pytest.raises(ValueError, match="no parameters"):
        train.step_function(func, trained=["w9"])
