"""Every op's CUDA kernels, and both demo models, on the cuda target.

`CASES` holds at least one representative call of every op that has an
`FCompute` (an op added without a case fails
`test_every_op_with_a_compute_has_a_case`), a few of them in float16 and bfloat16 too.
Without a GPU (CI):
- every case is lowered as relay.build lowers it (`compile_primitive`) and
  compiled to CUBIN for sm_80 and for sm_90;
- the cases in `HOST_RUN` (several per op family) run through the cupy stand-in
  of tests/cuda_standin.py, which executes the generated CUDA C on the CPU, and
  are compared with the op's numpy reference, both on numpy arrays (as
  `build_op` runs them) and on device arrays;
- small versions of both demo models run through `relay.build` and the graph
  executor on the stand-in, against their numpy versions; the full-size models
  compile for sm_80 and sm_90.
Tests marked `gpu` run every case and both models on a real GPU (target
"cuda": the GPU's own arch) and compare the device outputs, `.get()`, with numpy.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import cuda_standin
import numpy as np
import pytest
from cuda_standin import FAKE_CUPY, HostArray, gpu, needs_gxx
from op_helpers import assert_outputs_match, compile_op, reference_outputs, run_on_device, vnni_packed_words

from kiln import relay
from kiln.registry import Op, attr
from kiln.runtime.cuda_module import GRID_LIMITS, CudaModule, eval_int
from kiln.runtime.module import numpy_dtype
from kiln.testing import models

ARCHS = ("sm_80", "sm_90")
SM90 = "cuda -arch=sm_90"
GPU_TARGET = "cuda"  # on a GPU: compile for the GPU's own arch
EM_CUDA = 190  # the ELF machine of a CUBIN


@dataclass(frozen=True)
class Case:
    """One call of an op: its inputs, its attrs and the tolerance of its float outputs."""

    op: str
    arrays: tuple[np.ndarray, ...]
    attrs: dict[str, Any] = field(default_factory=dict)
    rtol: float = 1e-5
    atol: float = 1e-6
    label: str = ""  # tells apart several cases of one op

    @property
    def id(self) -> str:
        return f"{self.op}-{self.label}" if self.label else self.op


_RNG = np.random.default_rng(20240606)


def f32(*shape: int, dtype: str = "float32") -> np.ndarray:
    """Standard-normal values."""
    return _RNG.standard_normal(shape).astype(dtype)


def f16(*shape: int) -> np.ndarray:
    return f32(*shape, dtype="float16")


def bf16(*shape: int) -> np.ndarray:
    """Standard-normal values, rounded to bfloat16 (ml_dtypes')."""
    return f32(*shape).astype(numpy_dtype("bfloat16"))


def positive(*shape: int) -> np.ndarray:
    """Values in [0.1, 3): logarithms, roots, bases of powers, variances."""
    return _RNG.uniform(0.1, 3.0, shape).astype("float32")


def nonzero(*shape: int) -> np.ndarray:
    """Values of both signs at least 0.5 from zero: divisors."""
    return (np.sign(_RNG.standard_normal(shape)) * _RNG.uniform(0.5, 3.0, shape)).astype("float32")


def halves(*shape: int) -> np.ndarray:
    """Multiples of 0.5 in [-3, 3] (ties for round, equal pairs for comparisons, zeros for sign)."""
    return (_RNG.integers(-6, 7, shape) / 2).astype("float32")


def ints(*shape: int, lo: int = -9, hi: int = 10, dtype: str = "int32") -> np.ndarray:
    return _RNG.integers(lo, hi, shape).astype(dtype)


def divisors(*shape: int) -> np.ndarray:
    """Integers of both signs, never zero."""
    return (ints(*shape, lo=1, hi=4) * np.where(_RNG.random(shape) < 0.5, -1, 1)).astype("int32")


def bools(*shape: int) -> np.ndarray:
    return np.asarray(_RNG.random(shape) < 0.5)


def scalar(value: float, dtype: str = "float32") -> np.ndarray:
    return np.array(value, dtype)


HALF = {"rtol": 2e-3, "atol": 2e-3, "label": "float16"}
HALF_SUMS = {"rtol": 1e-2, "atol": 1e-2, "label": "float16"}  # float16 sums round at every step
BF16 = {"rtol": 1e-2, "atol": 1e-2, "label": "bfloat16"}  # a bfloat16 ulp is 2**-8 of the value
SUMS = {"rtol": 1e-5, "atol": 1e-5}  # float32 sums in another order than numpy's (and, on a GPU, with FMA)

CASES: list[Case] = [
    # elementwise (tensor.py, nn.py)
    *(Case(op, (f32(2, 5),)) for op in ["negative", "abs", "exp", "sin", "cos", "tanh", "sigmoid", "erf"]),
    *(Case(op, (halves(3, 5),)) for op in ["floor", "ceil", "round", "sign"]),
    *(Case(op, (positive(2, 5),)) for op in ["log", "sqrt", "rsqrt"]),
    Case("logical_not", (bools(2, 5),)),
    Case("clip", (f32(3, 4),), {"a_min": -0.5, "a_max": 0.75}),
    Case("cast", (f32(3, 4) * 20,), {"dtype": "int32"}),
    Case("nn.relu", (f32(2, 5),)),
    Case("nn.leaky_relu", (f32(2, 5),), {"alpha": 0.2}),
    Case("nn.gelu", (f32(2, 5) * 3,), {"approximate": "tanh"}, atol=1e-5),
    Case("nn.dropout", (f32(3, 4),), {"rate": 0.3}),
    # broadcast
    *(Case(op, (f32(2, 3), f32(3))) for op in ["add", "subtract", "multiply", "maximum", "minimum"]),
    Case("divide", (f32(2, 3), nonzero(3))),
    Case("power", (positive(2, 3), f32(3))),
    Case("floor_divide", (ints(2, 3), divisors(3))),
    Case("floor_mod", (ints(2, 3), divisors(3))),
    *(Case(op, (halves(2, 3), halves(3)))
      for op in ["equal", "not_equal", "less", "less_equal", "greater", "greater_equal"]),
    Case("logical_and", (bools(2, 3), bools(3))),
    Case("logical_or", (bools(2, 3), bools(1, 3))),
    Case("where", (bools(2, 3), f32(2, 3), f32(3))),
    Case("nn.prelu", (f32(2, 3, 4), f32(3)), {"axis": 1}),
    Case("nn.bias_add", (f32(2, 3, 4), f32(3)), {"axis": 1}),
    # injective: transforms and tensor creation
    Case("reshape", (f32(2, 3, 4),), {"newshape": (4, -1)}),
    Case("transpose", (f32(2, 3, 4),), {"axes": (2, 0, 1)}),
    Case("squeeze", (f32(2, 1, 3),), {"axis": (1,)}),
    Case("expand_dims", (f32(2, 3),), {"axis": 1, "num_newaxis": 2}),
    Case("concatenate", (f32(2, 3), f32(2, 2), f32(2, 1)), {"axis": 1}),
    Case("stack", (f32(2, 3), f32(2, 3)), {"axis": 1}),
    Case("broadcast_to", (f32(3, 1),), {"shape": (2, 3, 4)}),
    Case("nn.batch_flatten", (f32(2, 3, 4),)),
    Case("tile", (f32(2, 3),), {"reps": (2, 1, 2)}),
    Case("full", (scalar(2.5),), {"shape": (2, 3), "dtype": "int32"}),
    Case("zeros", (), {"shape": (2, 3), "dtype": "float32"}),
    Case("ones", (), {"shape": (2, 3), "dtype": "int32"}),
    Case("zeros_like", (f32(2, 3),)),
    Case("ones_like", (ints(2, 3),)),
    Case("shape_of", (f32(2, 3, 4),), {"dtype": "int64"}),
    Case("arange", (), {"start": 1.5, "stop": 20.0, "step": 0.7, "dtype": "float32"}),
    Case("nn.pad", (f32(3, 4), scalar(1.5)), {"pad_width": ((1, 2), (0, 3)), "pad_mode": "reflect"}),
    # indexing
    Case("split", (f32(6, 4),), {"indices_or_sections": (2, 5), "axis": 0}),
    Case("strided_slice", (f32(6, 7),), {"begin": (5, 1), "end": (0, 100), "strides": (-2, 3)}),
    Case("take", (f32(4, 5), ints(3, 2, lo=-8, hi=8)), {"axis": 1, "mode": "clip"}),
    # reductions
    Case("sum", (f32(3, 5),), {"axis": 1}, **SUMS),
    Case("mean", (f32(3, 5),), {"axis": 0, "keepdims": True}, **SUMS),
    Case("max", (f32(3, 5),)),  # all axes: a 0-d output, computed by one thread
    Case("min", (f32(2, 3, 4),), {"axis": (0, 2)}),
    Case("prod", (f32(3, 5),), {"axis": 1}, **SUMS),
    Case("argmax", (halves(3, 5),), {"axis": 1, "select_last_index": True}),
    Case("argmin", (f32(3, 5),), {"axis": 0}),
    # softmax and normalization
    Case("nn.softmax", (f32(3, 7) * 3,), {"axis": -1}, **SUMS),
    Case("nn.log_softmax", (f32(3, 7) * 3,), {"axis": 0}, **SUMS),
    Case("nn.batch_norm", (f32(2, 3, 4), f32(3), f32(3), f32(3), positive(3)), {"axis": 1}, **SUMS),
    Case("nn.layer_norm", (f32(3, 8) * 3 + 1, f32(8), f32(8)), {"axis": -1}, rtol=1e-4, atol=1e-4),
    # dense and matmul
    Case("nn.dense", (f32(4, 8), f32(5, 8)), **SUMS),
    Case("nn.matmul", (f32(3, 4), f32(2, 4)), {"transpose_b": True}, **SUMS),
    Case("nn.batch_matmul", (f32(2, 3, 4), f32(2, 5, 4)), **SUMS),
    # the shared-memory tiled products, with tails in every dim (m, n past a tile; k past a step)
    Case("nn.dense", (f32(2, 37, 40), f32(45, 40)), **SUMS, label="tiles"),
    Case("nn.matmul", (f32(2, 1, 21, 19), f32(3, 21, 23)), {"transpose_a": True}, **SUMS, label="tiles"),
    Case("nn.batch_matmul", (f32(3, 35, 17), f32(1, 17, 33)), {"transpose_b": False}, **SUMS, label="tiles"),
    # tensor cores: float16 and bfloat16 products through mma.sync (m and n multiples of 64, k of 16), float32 sums
    Case("nn.dense", (f16(2, 64, 48), f16(64, 48)), rtol=2e-3, atol=2e-3, label="tensorcore"),
    Case("nn.matmul", (f16(2, 32, 64), f16(32, 128)), {"transpose_a": True}, rtol=2e-3, atol=2e-3,
         label="tensorcore"),
    Case("nn.batch_matmul", (f16(2, 64, 32), f16(2, 64, 32)), rtol=2e-3, atol=2e-3, label="tensorcore"),
    Case("nn.dense", (bf16(64, 32), bf16(128, 32)), {"out_dtype": "float32"}, rtol=1e-4, atol=1e-4,
         label="tensorcore-bfloat16"),  # exact products of bfloat16 values, float32 sums
    Case("nn.batch_matmul", (bf16(2, 64, 48), bf16(2, 48, 64)), {"transpose_b": False},
         rtol=1e-2, atol=1e-2, label="tensorcore-bfloat16-out"),
    # narrow floats sum in float32: 2100 ones make 2100, where float16 sums would stop at 2048 (bfloat16's at 256)
    Case("nn.dense", (np.ones((2, 2100), "float16"), np.ones((3, 2100), "float16")), rtol=0, atol=0,
         label="float16-sums"),
    Case("nn.conv2d", (np.ones((1, 256, 3, 3), "float16"), np.ones((2, 256, 3, 3), "float16")), rtol=0, atol=0,
         label="float16-sums"),  # 2304 taps
    Case("nn.batch_matmul", (bf16(1, 2, 300) * 0 + 1, bf16(1, 3, 300) * 0 + 1), rtol=0, atol=0,
         label="bfloat16-sums"),
    # convolutions and pooling
    Case("nn.conv2d", (f32(1, 3, 6, 6), f32(4, 3, 3, 3)), {"padding": 1}, rtol=1e-4, atol=1e-5),
    # the tiled convolution: channel and pixel tails, strides, a channel step with a tail, and a 1x1
    Case("nn.conv2d", (f32(2, 19, 11, 13), f32(37, 19, 3, 3)), {"padding": (1, 2, 0, 1), "strides": (2, 1)},
         rtol=1e-4, atol=1e-4, label="tiles"),
    Case("nn.conv2d", (f32(1, 20, 7, 9), f32(24, 20, 1, 1)), rtol=1e-4, atol=1e-4, label="tiles-1x1"),
    Case("nn.conv2d", (f32(1, 3, 15, 15), f32(8, 3, 5, 5)), {"padding": 2, "strides": 2, "dilation": (1, 2)},
         rtol=1e-4, atol=1e-4, label="tiles-dilated"),
    # too few tiles to fill the device: the input channels split into 4 parts, summed by a second kernel
    Case("nn.conv2d", (f32(1, 128, 5, 5), f32(24, 128, 3, 3)), {"padding": 1}, rtol=1e-4, atol=1e-4,
         label="split"),
    # several groups (depthwise: one channel each) and NHWC / HWIO, with channel and pixel tails
    Case("nn.conv2d", (f32(1, 20, 9, 11), f32(20, 1, 3, 3)), {"padding": 1, "groups": 20}, rtol=1e-4, atol=1e-5,
         label="depthwise"),
    Case("nn.conv2d", (f32(2, 6, 9, 9), f32(12, 1, 3, 3)), {"padding": 1, "strides": 2, "groups": 6},
         rtol=1e-4, atol=1e-5, label="depthwise-multiplier"),
    Case("nn.conv2d", (f32(1, 16, 7, 6), f32(16, 4, 3, 3)), {"padding": (0, 1, 2, 1), "groups": 4},
         rtol=1e-4, atol=1e-5, label="grouped"),
    Case("nn.conv2d", (f32(1, 12, 5, 6), f32(18, 4, 3, 3)), {"padding": 1, "groups": 3}, rtol=1e-4, atol=1e-5,
         label="grouped-generic"),  # 6 channels a group: a block of 16 would straddle groups unevenly
    Case("nn.conv2d", (f32(1, 7, 9, 19), f32(3, 3, 19, 24)),
         {"padding": 1, "data_layout": "NHWC", "kernel_layout": "HWIO"}, rtol=1e-4, atol=1e-4, label="nhwc"),
    Case("nn.conv2d", (f32(1, 8, 8, 20), f32(3, 3, 1, 20)),
         {"padding": 1, "strides": 2, "groups": 20, "data_layout": "NHWC", "kernel_layout": "HWIO"},
         rtol=1e-4, atol=1e-5, label="nhwc-depthwise"),
    Case("nn.conv2d_transpose", (f32(1, 2, 4, 5), f32(2, 3, 3, 3)), {"strides": 2}, rtol=1e-4, atol=1e-5),
    Case("nn.max_pool2d", (f32(1, 2, 7, 8),), {"pool_size": 3, "strides": 2, "padding": 1}),
    Case("nn.avg_pool2d", (f32(1, 2, 7, 8),), {"pool_size": 3, "strides": 2, "padding": 1,
                                               "count_include_pad": False}, **SUMS),
    Case("nn.global_avg_pool2d", (f32(1, 2, 5, 6),), **SUMS),
    Case("nn.global_max_pool2d", (f32(1, 2, 5, 6),)),
    # other dtypes
    Case("add", (f16(2, 3), f16(3)), **HALF),
    Case("multiply", (f16(2, 3), f16(2, 3)), **HALF),
    Case("exp", (f16(2, 5),), **HALF),
    Case("sigmoid", (f16(2, 5),), **HALF),
    Case("nn.relu", (f16(2, 5),), **HALF),
    Case("cast", (f32(3, 4),), {"dtype": "float16"}, **HALF),
    Case("cast", (np.concatenate([f32(30), np.array([np.inf, -np.inf, 3.4e38, 1e-40, -0.0, 1 + 2**-8, 1 + 3 * 2**-8,
                                                     np.nan], "float32")]),), {"dtype": "bfloat16"},
         rtol=0, atol=0, label="bfloat16"),  # exactly ml_dtypes' rounding: ties to even, overflow, NaN
    Case("cast", (bf16(3, 4),), {"dtype": "float32"}, rtol=0, atol=0, label="from-bfloat16"),
    Case("add", (bf16(2, 3), bf16(3)), **BF16),
    Case("exp", (bf16(2, 5),), **BF16),
    Case("sum", (bf16(3, 40),), {"axis": 1}, **BF16),
    Case("max", (bf16(4, 40),), {"axis": -1}, **BF16),
    Case("nn.softmax", (bf16(3, 7),), {"axis": -1}, **BF16),
    Case("nn.layer_norm", (bf16(2, 64), bf16(64), bf16(64)), **BF16),
    Case("sum", (f16(3, 5),), {"axis": 1}, **HALF_SUMS),
    Case("max", (f16(3, 5),), {"axis": 0}, **HALF),
    Case("nn.softmax", (f16(3, 7),), {"axis": -1}, **HALF_SUMS),
    Case("nn.dense", (f16(4, 8), f16(5, 8)), **HALF_SUMS),
    Case("nn.dense", (ints(4, 8, dtype="int8"), ints(5, 8, dtype="int8")), {"out_dtype": "int32"}, label="int8"),
    Case("add", (ints(2, 3, dtype="int64"), ints(3, dtype="int64")), label="int64"),
    Case("add", (f32(5, 1001), f32(1001)), label="4-per-thread"),  # 4 elements a thread, a partial last block
    # image (appended last, so that the cases above keep their random inputs)
    Case("image.resize", (f32(1, 2, 4, 5),), {"size": (7, 3), "axes": (2, 3), "method": "linear",
                                              "coordinate_transformation_mode": "align_corners"}),
    Case("image.resize", (f32(1, 2, 4, 5),), {"size": (6, 9), "axes": (2, 3), "method": "cubic",
                                              "coordinate_transformation_mode": "tf_crop_and_resize",
                                              "roi": (0.125, -0.25, 0.875, 1.25), "exclude_outside": True,
                                              "extrapolation_value": 0.5}, label="cubic"),
    Case("image.resize", (ints(2, 3, 5),), {"size": (4, 9), "axes": (1, 2), "nearest_mode": "round_prefer_ceil",
                                            "coordinate_transformation_mode": "asymmetric", "scales": (1.5, 1.8)},
         label="nearest"),
    Case("image.resize", (f16(1, 2, 3, 4),), {"size": (5, 7), "axes": (2, 3), "method": "linear"}, **HALF),
    Case("nn.pad", (f32(3, 4), scalar(1.5)), {"pad_width": ((5, 2), (1, 6)), "pad_mode": "wrap"}, label="wrap"),
]
# Rows spread over threads (relay/op/cuda_reduce.py; appended, so the cases above keep their inputs): rows
# shorter than a warp (several cases above too), a warp, not a multiple of 32, past a warp (the warps of a block
# combine through shared memory), several rows a block (6 rows of 8 lanes: 48 threads, the second warp
# partial), a prime number of rows, strided rows, a whole tensor, other dtypes.
ROW_CASES: list[Case] = [
    Case("sum", (f32(4, 32),), {"axis": -1}, **SUMS, label="warp"),
    Case("sum", (f32(2, 3, 70),), {"axis": (1, 2), "keepdims": True}, **SUMS, label="two-axes"),
    Case("sum", (f32(130, 3),), {"axis": 0}, **SUMS, label="strided"),
    Case("sum", (f32(40, 50),), rtol=1e-4, atol=1e-4, label="all"),
    Case("sum", (ints(3, 50),), {"axis": -1}, label="int32"),
    Case("mean", (f32(6, 7),), {"axis": -1}, **SUMS, label="rows"),
    Case("mean", (f16(3, 200),), {"axis": 1, "keepdims": True}, **HALF_SUMS),
    Case("max", (f32(5, 1000),), {"axis": 1}, label="block"),
    Case("max", (f16(4, 40),), {"axis": -1}, **{**HALF, "label": "float16-rows"}),
    Case("max", (bools(3, 40),), {"axis": 1}, label="bool"),
    Case("min", (ints(3, 45, dtype="int8"),), {"axis": 1}, label="int8"),
    Case("prod", (positive(2, 3, 20) ** 0.2,), {"axis": -1}, **SUMS, label="rows"),
    Case("argmax", (f32(2, 1500),), {"axis": -1}, label="block"),
    Case("argmin", (halves(4, 100),), {"axis": 1, "select_last_index": True}, label="rows"),
    Case("argmax", (f32(6, 50),), label="all"),
    Case("nn.softmax", (f32(4, 32) * 3,), {"axis": -1}, **SUMS, label="warp"),
    Case("nn.softmax", (f32(2, 3, 100) * 3,), {"axis": -1}, **SUMS, label="rows"),
    Case("nn.softmax", (f32(2, 1100) * 3,), {"axis": -1}, **SUMS, label="block"),
    Case("nn.log_softmax", (f32(7, 40) * 3,), {"axis": -1}, **SUMS, label="rows"),
    Case("nn.log_softmax", (f16(3, 50),), {"axis": -1}, **HALF_SUMS),
    Case("nn.layer_norm", (f32(2, 3, 96) * 3 + 1, f32(96), f32(96)), {"axis": -1}, rtol=1e-4, atol=1e-4,
         label="rows"),
    Case("nn.layer_norm", (f32(2, 1300) * 3 + 1, f32(1300), f32(1300)), {"axis": -1, "center": False},
         rtol=1e-4, atol=1e-4, label="block"),
    Case("nn.layer_norm", (f16(4, 64), f16(64), f16(64)), {"axis": -1}, **HALF_SUMS),
]
CASES += ROW_CASES


def uniform(lo: float, hi: float, *shape: int) -> np.ndarray:
    """float32 values in [lo, hi): the domain of asin, acosh, ... or positions of a grid."""
    return _RNG.uniform(lo, hi, shape).astype("float32")


def with_specials(x: np.ndarray) -> np.ndarray:
    """`x` with NaN, +inf and -inf in its first three elements (isnan, isinf)."""
    x = x.copy()
    x.reshape(-1)[:3] = [np.nan, np.inf, -np.inf]
    return x


def unit_steps(*shape: int) -> np.ndarray:
    """int32 -1 or 1, with a 2 in every 30th place: running products stay well inside int32."""
    x = np.where(_RNG.random(shape) < 0.5, -1, 1).astype("int32")
    x.reshape(-1)[::30] = 2
    return x


# The ops of ONNX breadth (appended, so that the cases above keep their random inputs): ONNX's further math,
# the scans, the gathers, scatters and topk, the qnn ops, grid_sample, max_pool2d_argmax and roi_align.
ONNX_CASES: list[Case] = [
    Case("tan", (uniform(-1.2, 1.2, 2, 5),)),
    Case("atan", (f32(2, 5) * 10,)),
    *(Case(op, (uniform(-0.95, 0.95, 2, 5),)) for op in ["asin", "acos", "atanh"]),
    *(Case(op, (f32(2, 5) * 3,)) for op in ["sinh", "cosh"]),
    Case("asinh", (f32(2, 5) * 100,)),
    Case("acosh", (uniform(1.0, 6.0, 2, 5),)),
    *(Case(op, (with_specials(f32(2, 5)),)) for op in ["isnan", "isinf"]),
    Case("reinterpret", (with_specials(f32(2, 5)),), {"dtype": "int32"}),
    Case("fmod", (f32(2, 3) * 5, nonzero(3))),
    Case("fmod", (ints(2, 3, lo=-20, hi=20), divisors(3)), label="int32"),
    Case("bitwise_not", (ints(2, 5, dtype="int16"),)),
    Case("bitwise_and", (ints(2, 5, lo=-100, hi=100), ints(5, lo=-100, hi=100))),
    Case("bitwise_or", (ints(9, lo=0, hi=256, dtype="uint8"), ints(9, lo=0, hi=256, dtype="uint8"))),
    Case("bitwise_xor", (ints(7, lo=-(2**40), hi=2**40, dtype="int64"), ints(7, dtype="int64"))),
    # shifts by a negative amount and by the bit width or more are part of the op's definition
    Case("left_shift", (ints(4, 1, lo=-1000, hi=1000), np.array([-1, 0, 1, 31, 32], "int32"))),
    Case("right_shift", (ints(4, 1, lo=-128, hi=128, dtype="int8"), np.array([-1, 0, 1, 7, 8], "int8"))),
    Case("cumsum", (f32(4, 9),), {"axis": 1, "exclusive": True}, **SUMS),
    Case("cumprod", (unit_steps(2, 300),), {"axis": 1, "reverse": True}),
    Case("gather_elements", (f32(3, 5), ints(3, 2, lo=-5, hi=5, dtype="int64")), {"axis": 1}),
    Case("gather_nd", (f32(3, 4, 5), np.array([[[2, -1]], [[0, 3]]], "int64")), {"batch_dims": 0}),
    Case("scatter_elements", (f32(3, 5), ints(3, 2, lo=-5, hi=5, dtype="int64"), f32(3, 2)),
         {"axis": 1, "reduction": "add"}, **SUMS),
    Case("scatter_nd", (f32(4, 5), np.array([[3], [0], [-2]], "int64"), f32(3, 5))),  # unique rows: 3, 0, 2
    Case("topk", (halves(3, 7),), {"k": 3, "axis": 1}),  # ties go to the lower index
    Case("qnn.quantize", (f32(2, 3, 5) * 300, uniform(0.5, 2.5, 3), ints(3, lo=-5, hi=5, dtype="int8")),
         {"axis": 1}),
    Case("qnn.dequantize", (ints(4, 6, lo=0, hi=256, dtype="uint8"), uniform(0.1, 1.0, 2, 6),
                            ints(2, 6, lo=0, hi=256, dtype="uint8")), {"axis": 0, "block_size": 3}),
    Case("qnn.matmul_integer", (ints(2, 3, 7, lo=-128, hi=128, dtype="int8"), ints(7, 5, lo=0, hi=256, dtype="uint8"),
                                ints(3, lo=-128, hi=128, dtype="int8"), ints(5, lo=0, hi=256, dtype="uint8"))),
    Case("qnn.matmul_vnni", (ints(3, 7, lo=0, hi=256, dtype="uint8"),
                             vnni_packed_words(ints(7, 5, lo=-128, hi=128, dtype="int8")),
                             np.array(3, "uint8"), np.array(-2, "int8")), {"units": 5}),
    Case("qnn.conv_integer", (ints(1, 4, 6, 7, lo=0, hi=256, dtype="uint8"),
                              ints(6, 2, 3, 3, lo=-128, hi=128, dtype="int8"), np.array(17, "uint8"),
                              ints(6, lo=-128, hi=128, dtype="int8")),
         {"strides": (2, 1), "padding": (1, 1, 0, 2), "dilation": (1, 1), "groups": 2}),
    Case("image.grid_sample", (f32(1, 2, 4, 5), uniform(-1.2, 1.2, 1, 3, 6, 2)),
         {"method": "linear", "padding_mode": "zeros"}, **SUMS),
    Case("image.grid_sample", (f32(1, 2, 4, 5), uniform(-1.2, 1.2, 1, 3, 6, 2)),
         {"method": "cubic", "padding_mode": "reflection", "align_corners": True}, **SUMS, label="cubic"),
    Case("nn.max_pool2d_argmax", (f32(1, 2, 7, 8),), {"pool_size": 3, "strides": 2, "padding": 1}),
    Case("nn.roi_align", (f32(2, 3, 10, 8), np.array([[0.0, 0.0, 9.0, 9.0], [0.5, 2.0, 4.3, 7.1],
                                                     [-3.0, 6.0, 12.0, 14.0], [5.0, 5.0, 5.5, 5.2]], "float32"),
                          np.array([0, 1, 1, 0], "int64")), {"output_size": (3, 4), "sampling_ratio": 2},
         **SUMS),
]
CASES += ONNX_CASES
# the losses (appended last): labels with an ignored value, class weights, spatial dims, each reduction
LOSS_CASES: list[Case] = [
    Case("nn.softmax_cross_entropy", (f32(6, 5), ints(6, lo=0, hi=5, dtype="int64"), positive(5)),
         {"ignore_index": 2, "reduction": "mean"}, **SUMS),
    Case("nn.softmax_cross_entropy",
         (f32(2, 4, 3, 2), ints(2, 3, 2, lo=0, hi=4, dtype="int64"), np.array(1, "float32")), {"reduction": "none"},
         label="none"),
    Case("nn.nll_loss", (f32(6, 5), ints(6, lo=0, hi=5, dtype="int64"), positive(5)), {"reduction": "sum"}, **SUMS),
]
CASES += LOSS_CASES
BY_ID = {c.id: c for c in CASES}

# run on the CPU through the stand-in: g++ and one OS thread per CUDA thread make each ~0.3 s
HOST_RUN = [
    "exp", "round", "sigmoid", "cast", "nn.gelu",  # elementwise
    "add", "add-4-per-thread", "divide", "floor_mod", "where",  # broadcast
    "transpose", "concatenate", "broadcast_to", "arange", "nn.pad",  # injective
    "take", "split", "strided_slice",  # indexing
    "sum", "max", "argmax",  # reductions
    "nn.softmax", "nn.layer_norm", "nn.batch_norm",  # softmax and normalization
    "nn.dense", "nn.batch_matmul", "nn.dense-tiles", "nn.matmul-tiles", "nn.batch_matmul-tiles",  # products
    "nn.dense-tensorcore", "nn.matmul-tensorcore", "nn.batch_matmul-tensorcore",  # on tensor cores
    "nn.conv2d", "nn.conv2d-tiles", "nn.conv2d-tiles-1x1", "nn.conv2d-tiles-dilated", "nn.conv2d_transpose",
    "nn.conv2d-split", "nn.conv2d-depthwise", "nn.conv2d-depthwise-multiplier", "nn.conv2d-grouped",
    "nn.conv2d-grouped-generic",
    "nn.conv2d-nhwc",
    "nn.conv2d-nhwc-depthwise",
    "nn.max_pool2d", "nn.avg_pool2d", "nn.global_avg_pool2d",  # pooling
    "image.resize", "image.resize-cubic", "nn.pad-wrap",  # image, and pads wider than the axis
    "add-float16", "exp-float16", "sum-float16", "cast-bfloat16", "cast-from-bfloat16", "add-bfloat16",
    "exp-bfloat16", "sum-bfloat16", "max-bfloat16", "nn.softmax-bfloat16", "nn.layer_norm-bfloat16",
    "nn.dense-tensorcore-bfloat16", "nn.batch_matmul-tensorcore-bfloat16-out",
    "nn.dense-int8", "image.resize-float16",  # other dtypes
    "nn.dense-float16-sums", "nn.conv2d-float16-sums", "nn.batch_matmul-bfloat16-sums",
    "prod", "nn.softmax-float16", *(c.id for c in ROW_CASES),  # rows over threads
    # ONNX breadth: the scans, a scatter, topk, an integer product, sampling and pooling with indices
    "cumsum", "cumprod", "scatter_nd", "topk", "qnn.matmul_integer", "qnn.matmul_vnni", "image.grid_sample",
    "nn.roi_align", "nn.max_pool2d_argmax",
    "nn.softmax_cross_entropy", "nn.nll_loss",  # the losses
]


def cases(ids: list[str] | None = None) -> Any:
    """`pytest.param`s of the cases named by `ids` (all by default), each with its id."""
    chosen = CASES if ids is None else [BY_ID[i] for i in ids]
    return [pytest.param(c, id=c.id) for c in chosen]


def cubin_sm(cubin: bytes) -> int:
    """The SM version a CUBIN is for, from its ELF header (e_flags bits 8-15)."""
    assert cubin[:4] == b"\x7fELF" and struct.unpack_from("<H", cubin, 18)[0] == EM_CUDA, "not a CUDA ELF"
    return int(struct.unpack_from("<I", cubin, 48)[0] >> 8 & 0xFF)


def compile_case(case: Case, target: str) -> Any:
    return compile_op(case.op, *case.arrays, target=target, **case.attrs)


def check_case(case: Case, target: str, xp: Any) -> None:
    """Runs `case` on numpy arrays and on device arrays of `xp` (cupy or the stand-in); both match numpy."""
    kernel = compile_case(case, target)
    want = reference_outputs(case.op, *case.arrays, **case.attrs)
    assert_outputs_match(case.id, kernel(*case.arrays), want, case.rtol, case.atol)  # numpy in and out
    outs = run_on_device(kernel, *case.arrays, xp=xp)
    assert all(isinstance(o, xp.ndarray) for o in outs), f"{case.id}: outputs {[type(o) for o in outs]}"
    assert_outputs_match(case.id, [o.get() for o in outs], want, case.rtol, case.atol)


# -- the table covers every op ------------------------------------------------------------------------


def test_every_op_with_a_compute_has_a_case() -> None:
    computes = Op.get_attr_map(attr.FCompute)
    ops = [name for name in Op.list_names() if Op.get(name) in computes]
    missing = [name for name in ops if name not in {c.op for c in CASES}]
    assert not missing, f"ops with an FCompute but no case in CASES of tests/relay/op/test_cuda_ops.py: {missing}"
    assert len(BY_ID) == len(CASES), "two cases share an id: give one a label"
    assert set(HOST_RUN) <= set(BY_ID)


def test_the_cases_off_the_stand_in_match_their_references_on_llvm() -> None:
    """The table is sound where the stand-in does not check it: its calls type-check, and the llvm build
    agrees with the references on its inputs (so a mismatch on a GPU is the GPU's)."""
    for case in CASES:
        if case.id in HOST_RUN or case.label == "float16":
            continue  # checked through the stand-in, or float16 (which the llvm back end lacks)
        got = compile_case(case, "llvm")(*case.arrays)
        assert_outputs_match(case.id, got, reference_outputs(case.op, *case.arrays, **case.attrs),
                             case.rtol, case.atol)


# -- without a GPU: CUDA source to CUBIN for sm_80 and sm_90 ----------------------------------------------


@pytest.mark.parametrize("case", cases())
def test_op_compiles_to_cubin_for_sm80_and_sm90(case: Case) -> None:
    for arch in ARCHS:
        kernel = compile_case(case, f"cuda -arch={arch}")
        module = kernel.module
        assert isinstance(module, CudaModule) and module.arch == arch
        assert module.kernels and all(k.name in module.code.source for k in module.kernels)
        assert cubin_sm(module.cubin) == int(arch[3:]), arch


def test_a_convolution_of_few_tiles_splits_its_input_channels() -> None:
    """Split-K: 4 parts of 32 channels, each a grid of tiled blocks (the window staged in shared memory),
    then one kernel adding the parts up; the tiles of a big image are not split."""
    from kiln.relay.op.cuda_conv import conv_splits

    assert conv_splits(1, 512, 7, 7, 512) > 1 and conv_splits(32, 512, 7, 7, 512) == 1  # ResNet-50's last stage
    assert conv_splits(1, 64, 56, 56, 64) == 1 and conv_splits(1, 24, 5, 5, 128) == 4
    module = compile_case(BY_ID["nn.conv2d-split"], SM90).module
    assert len(module.kernels) == 2 and "pad_shared[" in module.code.source


@pytest.mark.parametrize(("case_id", "tiled"), [
    ("nn.conv2d-tiles", True), ("nn.conv2d-depthwise", True), ("nn.conv2d-depthwise-multiplier", True),
    ("nn.conv2d-grouped", True), ("nn.conv2d-nhwc", True), ("nn.conv2d-nhwc-depthwise", True),
    ("nn.conv2d-grouped-generic", False),
])
def test_convolutions_stage_their_windows_in_shared_memory(case_id: str, tiled: bool) -> None:
    """The tiled convolution schedules (one group, several, depthwise; NCHW and NHWC) copy the input window
    of a block into shared memory; groups that a block of 16 channels would straddle unevenly do not."""
    source = compile_case(BY_ID[case_id], SM90).module.code.source
    assert ("pad_shared[" in source) == tiled, case_id


# -- without a GPU: numerics through the stand-in -------------------------------------------------------


@pytest.fixture
def host_cupy(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Any:
    """CudaModule launches through the host emulator of tests/cuda_standin.py; yields its launches."""
    return cuda_standin.install(monkeypatch, tmp_path)


@needs_gxx
@pytest.mark.parametrize("case", cases(HOST_RUN))
def test_op_matches_numpy_through_the_host_stand_in(host_cupy: Any, case: Case) -> None:
    check_case(case, SM90, FAKE_CUPY)
    assert host_cupy, "no kernel was launched"


@needs_gxx
def test_a_large_elementwise_stage_sweeps_the_tensor_with_a_capped_grid(host_cupy: Any,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Past `_CUDA_GRID` blocks' worth of elements (4096 on a GPU; 3 here, to keep the stand-in small), the
    grid stays at that many blocks and each block strides over the tensor (a grid-stride loop), tail
    included."""
    from kiln.relay.op import _schedule

    monkeypatch.setenv("KILN_CACHE", "0")  # the kernel is not served from, nor left in, the compile cache
    monkeypatch.setattr(_schedule, "_CUDA_GRID", 3)
    case = Case("exp", (f32(5 * 1024 + 8),))
    check_case(case, SM90, FAKE_CUPY)
    assert {grid for _, grid, _, _ in host_cupy} == {(3, 1, 1)}, host_cupy


def small_models() -> list[Any]:
    return [
        pytest.param(models.mlp(batch=2, sizes=(16, 8, 4)), (2, 16), models.mlp_numpy, id="mlp"),
        pytest.param(models.cnn(size=8, channels=(2, 4)), (1, 3, 8, 8), models.cnn_numpy, id="cnn"),
    ]


def run_model(built: Any, x_shape: tuple[int, ...], numpy_model: Any, target: str, xp: Any) -> None:
    """relay.build + the graph executor on `target`: device outputs that match the numpy model."""
    func, params = built
    x = np.random.default_rng(1).standard_normal(x_shape).astype("float32")
    lib = relay.build(func, target=target, params=params)
    ex = lib.create_executor()
    want = numpy_model(x, params)
    for _ in range(2):  # a second run reuses the planned buffers
        out = ex(x=x)
        assert isinstance(out, xp.ndarray), type(out)
        got = out.get()
        assert isinstance(got, np.ndarray) and got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)


@needs_gxx
@pytest.mark.parametrize(("built", "x_shape", "numpy_model"), small_models())
def test_small_demo_model_matches_numpy_through_the_host_stand_in(host_cupy: Any, built: Any,
                                                                   x_shape: tuple[int, ...], numpy_model: Any) -> None:
    run_model(built, x_shape, numpy_model, SM90, FAKE_CUPY)
    assert len({name for name, *_ in host_cupy}) >= 2


@needs_gxx
def test_executor_takes_device_inputs_through_the_host_stand_in(host_cupy: Any) -> None:
    func, params = models.mlp(batch=2, sizes=(16, 8, 4))
    x = np.random.default_rng(1).standard_normal((2, 16)).astype("float32")
    ex = relay.build(func, target=SM90, params=params).create_executor()
    out = ex(x=HostArray(x))
    np.testing.assert_allclose(out.get(), models.mlp_numpy(x, params), rtol=1e-3, atol=1e-4)


FULL_MODELS = {"mlp": (models.mlp, (64, 784), models.mlp_numpy),
               "cnn": (models.cnn, (1, 3, 224, 224), models.cnn_numpy)}


@pytest.mark.parametrize("name", list(FULL_MODELS))
def test_full_size_demo_model_compiles_for_sm80_and_sm90(name: str) -> None:
    func, params = FULL_MODELS[name][0]()
    for arch in ARCHS:
        lib = relay.build(func, target=f"cuda -arch={arch}", params=params)
        assert lib.kernels and lib.graph.launches
        for module in lib.kernels:
            assert isinstance(module, CudaModule) and cubin_sm(module.cubin) == int(arch[3:])
            for spec in module.kernels:  # every launch fits the GPU's limits at these static sizes
                assert all(n > 0 for n in spec.block) and int(np.prod(spec.block)) <= 1024, spec
                for extents, limit in zip(spec.grid, GRID_LIMITS, strict=True):
                    assert max((eval_int(e, {}) for e in extents), default=1) <= limit, spec


# -- on a GPU ------------------------------------------------------------------------------------------


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("case", cases())
def test_gpu_op_matches_numpy(case: Case) -> None:
    import cupy

    check_case(case, GPU_TARGET, cupy)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize(("built", "x_shape", "numpy_model"), small_models())
def test_gpu_small_demo_model_matches_numpy(built: Any, x_shape: tuple[int, ...], numpy_model: Any) -> None:
    import cupy

    run_model(built, x_shape, numpy_model, GPU_TARGET, cupy)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("name", list(FULL_MODELS))
def test_gpu_full_size_demo_model_matches_numpy(name: str) -> None:
    import cupy

    make, x_shape, numpy_model = FULL_MODELS[name]
    run_model(make(), x_shape, numpy_model, GPU_TARGET, cupy)


@pytest.mark.gpu
@gpu
def test_gpu_executor_takes_device_inputs() -> None:
    import cupy

    func, params = models.mlp(batch=2, sizes=(16, 8, 4))
    x = np.random.default_rng(1).standard_normal((2, 16)).astype("float32")
    ex = relay.build(func, target=GPU_TARGET, params=params).create_executor()
    out = ex(x=cupy.asarray(x))
    assert isinstance(out, cupy.ndarray)
    np.testing.assert_allclose(out.get(), models.mlp_numpy(x, params), rtol=1e-3, atol=1e-4)
