"""The GPU row schedule (relay/op/cuda_reduce.py): how many threads a row gets, how rows fill blocks, and the
kernels that the reductions, softmax and layer norm get on cuda at model sizes (compiled, without a GPU).

Their numerics, through the cupy stand-in and on a GPU, are the `ROW_CASES` of tests/relay/op/test_cuda_ops.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from op_helpers import compile_op

from kiln.relay.op.cuda_reduce import launch_shape, rows_per_block, threads_per_row

SM90 = "cuda -arch=sm_90"


@pytest.mark.parametrize(
    ("rows", "n", "threads"),
    [
        (12288, 128, 32),  # BERT-base's attention softmax: a warp a row
        (50000, 700, 32),  # many rows up to 1024 long: a warp each
        (8, 7, 8),  # short rows: the lanes that cover them
        (100, 2, 2),
        (1024, 768, 64),  # BERT-base's layer norm: 1024 rows of a warp would leave the device idle
        (100000, 2048, 256),  # past 1024: a block's warps, 8 elements a thread
        (64, 4096, 512),
        (1, 2000, 128),  # one long row (a whole-tensor reduction)
        (4, 1 << 20, 1024),  # at most a block
    ],
)
def test_threads_per_row(rows: int, n: int, threads: int) -> None:
    assert threads_per_row(rows, n) == threads


def test_rows_fill_blocks_of_about_256_threads_without_a_partial_block() -> None:
    assert rows_per_block(12288, 32) == 8
    assert rows_per_block(6, 8) == 6 and rows_per_block(11, 32) == 1  # 11 is prime: a row a block
    assert rows_per_block(1024, 64) == 4 and rows_per_block(100, 256) == 1
    assert launch_shape(12288, 128) == (32, 8, 1536)


def kernel_of(op: str, *arrays: np.ndarray, **kw: Any) -> tuple[tuple[int, ...], int, str]:
    """The block and the blocks of the first kernel that `op` compiles to for sm_90, and the CUDA C of all."""
    module = compile_op(op, *arrays, target=SM90, **kw).module
    spec = module.kernels[0]
    grid = [int(str(e)) for axis in spec.grid for e in axis]
    return spec.block, int(np.prod(grid)), module.get_source("cuda")


def test_bert_softmax_is_a_warp_a_row_eight_rows_a_block_in_one_kernel() -> None:
    block, blocks, src = kernel_of("nn.softmax", np.zeros((8, 12, 128, 128), "float32"), axis=-1)
    assert block == (32, 8, 1) and blocks == 8 * 12 * 128 // 8
    assert src.count("__shfl_xor_sync") == 2 and "__syncthreads" not in src  # the maximum, then the sum
    assert src.count("__global__") == 1


def test_bert_layer_norm_is_two_warps_a_row_in_one_kernel() -> None:
    zeros = np.zeros(768, "float32")
    block, blocks, src = kernel_of("nn.layer_norm", np.zeros((8, 128, 768), "float32"), zeros, zeros, axis=-1)
    assert block == (64, 4, 1) and blocks == 256
    assert src.count("__shfl_xor_sync") == 4  # sum and squares: each within the warps, then across them
    assert src.count("__global__") == 1


@pytest.mark.parametrize(
    ("op", "shape", "attrs", "block"),
    [
        ("sum", (2, 3, 70), {"axis": (1, 2)}, (32, 2, 1)),  # trailing axes, fused
        ("sum", (130, 3), {"axis": 0}, (32, 3, 1)),  # a leading axis, but only 3 rows
        ("mean", (64, 4096), {"axis": -1}, (512, 1, 1)),
        ("argmax", (5, 100), {"axis": 1}, (32, 5, 1)),
        ("max", (40, 50), {}, (128, 1, 1)),  # all axes: one row
    ],
)
def test_reductions_spread_rows_over_threads(op: str, shape: tuple[int, ...], attrs: dict[str, Any],
                                             block: tuple[int, ...]) -> None:
    got, _, src = kernel_of(op, np.zeros(shape, "float32"), **attrs)
    assert got == block and "__shfl_xor_sync" in src


@pytest.mark.parametrize(
    ("op", "shape", "attrs"),
    [
        ("sum", (8, 4096), {"axis": 0}),  # a leading axis of many rows: a thread per output reads them coalesced
        ("min", (2, 3, 4), {"axis": (0, 2)}),  # not trailing, and short
        ("nn.softmax", (3, 7), {"axis": 0}),  # another axis than the last: the generic compute
        ("sum", (4, 1), {"axis": 1}),  # rows of one element
    ],
)
def test_what_stays_a_thread_per_output(op: str, shape: tuple[int, ...], attrs: dict[str, Any]) -> None:
    _, _, src = kernel_of(op, np.zeros(shape, "float32"), **attrs)
    assert "__shfl_xor_sync" not in src
