"""Tensor-core products (`cuda_schedules.schedule_tensorcore`, `kiln.tir.mma`, `kiln.codegen.cuda_mma`).

The per-op cases of tests/relay/op/test_cuda_ops.py run dense, matmul and
batch_matmul on tensor cores through the CPU stand-in, which runs kiln's
fragment loads as written and exchanges the fragments as PTX lays them out.
Here: a fused epilogue, the shapes that stay on the tiled schedule, and the
pass that turns a marked loop nest into the warp's product (or refuses it).
"""

from __future__ import annotations

from typing import Any

import cuda_standin
import numpy as np
import pytest
from cuda_standin import FAKE_CUPY, needs_gxx

from kiln import relay, te, tir
from kiln.tir.mma import MMA, PRAGMA
from kiln.tir.pipeline import optimize_tir

SM90 = "cuda -arch=sm_90"


def _dense_bias_relu(m: int, n: int, k: int) -> relay.Function:
    x = relay.var("x", shape=(m, k), dtype="float16")
    w = relay.var("w", shape=(n, k), dtype="float16")
    b = relay.var("b", shape=(n,), dtype="float16")
    return relay.Function([x, w, b], relay.nn.relu(relay.nn.bias_add(relay.nn.dense(x, w), b)))


@needs_gxx
def test_a_fused_float16_dense_runs_on_tensor_cores_through_the_stand_in(monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: Any) -> None:
    cuda_standin.install(monkeypatch, tmp_path)
    k = 128
    lib = relay.build(_dense_bias_relu(64, 64, k), target=SM90)
    source = lib.get_source("cuda")
    # one warp: 4 x 8 tiles for each of 4 steps of 16 in a panel of 64 k, two panels (a loop)
    assert source.count("kiln_mma_tile<") == 4 * 32
    # the panels are copied with cp.async and waited for before the barrier that precedes their use
    assert "kiln_cp_async16(&" in source and "kiln_cp_async_wait_all();\n" in source
    assert "_fragments[128];" in source  # each lane's 4 x 8 tiles of 2 x 2 accumulators, in registers
    rng = np.random.default_rng(3)
    x, w, b = (rng.standard_normal(s).astype("float16") for s in ((64, k), (64, k), (64,)))
    got = lib.create_executor()(x=FAKE_CUPY.asarray(x), w=FAKE_CUPY.asarray(w), b=FAKE_CUPY.asarray(b)).get()
    want = np.maximum(x.astype(np.float32) @ w.astype(np.float32).T + b.astype(np.float32), 0)
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=2e-3, atol=4e-3)


def test_products_off_the_tiles_stay_on_the_tiled_schedule() -> None:
    # n = 40 and 96 are no multiples of 64, k = 24 none of 16: all compile without tensor cores
    for m, n, k in ((64, 40, 32), (64, 96, 32), (64, 64, 24)):
        source = relay.build(_dense_bias_relu(m, n, k), target=SM90).get_source("cuda")
        assert "kiln_mma_tile<" not in source and "_shared" in source, (m, n, k)  # shared panels, no mma


def _warp_product(column: Any) -> tir.PrimFunc:
    """One 16 x 8 x 16 product per warp, written per lane (rows g, g + 8; `column(t, j)`), its nest marked."""
    a = te.placeholder((16, 16), dtype="float16", name="A")
    b = te.placeholder((16, 9), dtype="float16", name="B")
    k = te.reduce_axis((0, 16), name="k")
    acc = te.compute((32, 2, 2), lambda lane, h, j: te.sum(
        te.cast(a[h * 8 + lane // 4, k], "float32") * te.cast(b[k, column(lane % 4, j)], "float32"),
        axis=k), name="acc")
    out = te.compute((32, 2, 2), lambda lane, h, j: acc[lane, h, j], name="out")
    s = te.create_schedule(out)
    lane, _, _ = out.op.axis
    s[out].bind(lane, te.thread_axis("threadIdx.x"))
    s[acc].set_scope("local")
    s[acc].compute_at(s[out], lane)
    ko, ki = s[acc].split(k, factor=16)  # k's loop outside the marked nest, its zeroing apart from it
    s[acc].reorder(acc.op.axis[0], ko, *acc.op.axis[1:], ki)
    s[acc].pragma(acc.op.axis[1], PRAGMA)
    return optimize_tir(te.lower(s, [a, b, out], name="warp"))


def _calls(func: tir.PrimFunc) -> list[tir.Call]:
    found: list[tir.Call] = []
    tir.post_order_visit(func.body, lambda n: found.append(n) if isinstance(n, tir.Call) and n.name == MMA else None)
    return found


def test_a_marked_nest_of_a_warps_product_becomes_one_call() -> None:
    (call,) = _calls(_warp_product(lambda t, j: t * 2 + j + 1))  # columns 1 to 8 of B: its corner moves
    strides = [int(x.value) for x in call.args if isinstance(x, tir.IntImm)]
    assert strides == [2, 1, 16, 1, 9, 1, 1, 0]  # acc (h, j); A rows, k; B k, columns; A in pairs, B not
    assert [str(i) for i in call.args[6].indices] == ["0", "1"]


def test_a_marked_nest_that_reads_other_columns_is_refused() -> None:
    with pytest.raises(tir.TIRError, match="loop .* marked 'kiln.mma' is not a warp's m16n8k16 product: its "
                                           "indices are not those of the fragments"):
        _warp_product(lambda t, j: t + j * 4)  # lane t's columns t and t + 4: not the fragment's


@pytest.mark.gpu
@cuda_standin.gpu
@pytest.mark.parametrize(("m", "n", "k"), [(512, 3072, 768), (128, 64, 4096), (4096, 128, 64)])
def test_gpu_float16_dense_at_model_sizes_matches_numpy(m: int, n: int, k: int) -> None:
    import cupy

    lib = relay.build(_dense_bias_relu(m, n, k), target="cuda")
    assert "kiln_mma_tile<" in lib.get_source("cuda")
    rng = np.random.default_rng(4)
    x, w, b = (rng.standard_normal(s).astype("float16") for s in ((m, k), (n, k), (n,)))
    got = lib.create_executor()(x=cupy.asarray(x), w=cupy.asarray(w), b=cupy.asarray(b)).get()
    want = np.maximum(x.astype(np.float32) @ w.astype(np.float32).T + b.astype(np.float32), 0)
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=1e-2, atol=1e-1 * np.sqrt(k / 64))
