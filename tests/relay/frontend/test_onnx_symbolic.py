"""ONNX models with dynamic axes, imported with their dims symbolic (`_onnx_symbolic`): the shape arithmetic
exporters write (Shape -> Gather -> Unsqueeze -> Concat -> Reshape, Mul of dims) is evaluated on symbolic dims,
so the model compiles once and runs at any size, matching onnxruntime."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kiln import relay
from kiln.runtime import ExecutorError

RNG = np.random.default_rng(0)


def const(name: str, value: Any) -> Any:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name))


def model(nodes: list[Any], out: str, out_dims: list[Any]) -> Any:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "s", 32])],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, out_dims)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def heads_model() -> Any:
    """x (n, s, 32): split into 4 heads of 8 with x.size(0), x.size(1) (as torch.onnx.export writes
    `x.view(b, s, 4, 8)`), softmax per head, merged back with Shape[:-2] ++ [32], then flattened to
    (n, s * 32) with a Mul of dims."""
    return model([
        const("i0", np.array(0, np.int64)), const("i1", np.array(1, np.int64)), const("ax", np.array([0], np.int64)),
        const("heads", np.array([4, 8], np.int64)), const("w", np.array([32], np.int64)),
        const("w0", np.array(32, np.int64)), const("s0", np.array([0], np.int64)),
        const("e2", np.array([-2], np.int64)),
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "i0"], ["n"], axis=0),
        helper.make_node("Gather", ["shape", "i1"], ["s"], axis=0),
        helper.make_node("Unsqueeze", ["n", "ax"], ["n1"]),
        helper.make_node("Unsqueeze", ["s", "ax"], ["s1"]),
        helper.make_node("Concat", ["n1", "s1", "heads"], ["split"], axis=0),
        helper.make_node("Reshape", ["x", "split"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3]),
        helper.make_node("Softmax", ["t"], ["p"], axis=-1),
        helper.make_node("Transpose", ["p"], ["t2"], perm=[0, 2, 1, 3]),
        helper.make_node("Shape", ["t2"], ["shape2"]),
        helper.make_node("Slice", ["shape2", "s0", "e2", "s0"], ["lead"]),
        helper.make_node("Concat", ["lead", "w"], ["merge"], axis=0),
        helper.make_node("Reshape", ["t2", "merge"], ["y"]),
        helper.make_node("Mul", ["s", "w0"], ["flat"]),
        helper.make_node("Unsqueeze", ["flat", "ax"], ["flat1"]),
        helper.make_node("Concat", ["n1", "flat1"], ["fshape"], axis=0),
        helper.make_node("Reshape", ["y", "fshape"], ["z"]),
    ], "z", ["n", "f"])


def test_shape_arithmetic_on_dynamic_axes_compiles_once_and_matches_onnxruntime() -> None:
    ort = pytest.importorskip("onnxruntime")
    m = heads_model()
    mod, params = relay.frontend.from_onnx(m)
    assert str(mod["main"].checked_type) == "fn (Tensor[(n, s, 32), float32]) -> Tensor[(n, 32*s), float32]"
    ex = relay.build(mod, params=params).create_executor()
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for n, s in [(1, 1), (3, 17), (2, 128)]:
        x = RNG.standard_normal((n, s, 32)).astype("float32")
        np.testing.assert_allclose(ex(x=x), session.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_a_static_part_of_a_dynamic_shape_folds_to_a_constant() -> None:
    m = model([const("i2", np.array(2, np.int64)), const("ax", np.array([0], np.int64)),
               const("minus", np.array([-1], np.int64)),
               helper.make_node("Shape", ["x"], ["shape"]),
               helper.make_node("Gather", ["shape", "i2"], ["w"], axis=0),  # 32, known at import
               helper.make_node("Unsqueeze", ["w", "ax"], ["w1"]),
               helper.make_node("Concat", ["minus", "w1"], ["rows"], axis=0),
               helper.make_node("Reshape", ["x", "rows"], ["y"])], "y", ["r", 32])
    mod, _ = relay.frontend.from_onnx(m)
    assert str(mod["main"].checked_type) == "fn (Tensor[(n, s, 32), float32]) -> Tensor[(n*s, 32), float32]"
    assert "shape_of" not in str(mod)


def test_a_quotient_of_a_dynamic_dim_imports_and_its_divisibility_is_checked_at_run_time() -> None:
    """x.view(x.size(0), x.size(1) // 2, 64): s // 2 is a dim (the sizes it fits are those 2 divides)."""
    ort = pytest.importorskip("onnxruntime")
    m = model([const("i0", np.array(0, np.int64)), const("i1", np.array(1, np.int64)),
               const("two", np.array(2, np.int64)), const("ax", np.array([0], np.int64)),
               const("w", np.array([64], np.int64)),
               helper.make_node("Shape", ["x"], ["shape"]),
               helper.make_node("Gather", ["shape", "i0"], ["n"], axis=0),
               helper.make_node("Gather", ["shape", "i1"], ["s"], axis=0),
               helper.make_node("Div", ["s", "two"], ["s1"]),
               helper.make_node("Unsqueeze", ["n", "ax"], ["n1"]),
               helper.make_node("Unsqueeze", ["s1", "ax"], ["s2"]),
               helper.make_node("Concat", ["n1", "s2", "w"], ["target"], axis=0),
               helper.make_node("Reshape", ["x", "target"], ["y"])], "y", ["n", "h", 64])
    mod, params = relay.frontend.from_onnx(m)
    assert str(mod["main"].checked_type.ret_type) == "Tensor[(n, floordiv(s, 2), 64), float32]"
    ex = relay.build(mod, params=params).create_executor()
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for n, s in [(1, 2), (3, 18)]:
        x = RNG.standard_normal((n, s, 32)).astype("float32")
        np.testing.assert_array_equal(ex(x=x), session.run(None, {"x": x})[0])
    with pytest.raises(ExecutorError, match=r"reshape .*\(its 32\*n\*s elements\) needs 32\*n\*s <= "
                                            r"64\*n\*floordiv\(s, 2\), which the sizes n = 2, s = 5 break"):
        ex(x=RNG.standard_normal((2, 5, 32)).astype("float32"))


def test_view_of_the_batch_and_minus_one_flattens_a_dynamic_batch() -> None:
    ort = pytest.importorskip("onnxruntime")
    m = model([const("i0", np.array(0, np.int64)), const("ax", np.array([0], np.int64)),
               const("minus", np.array([-1], np.int64)),
               helper.make_node("Shape", ["x"], ["shape"]),
               helper.make_node("Gather", ["shape", "i0"], ["n"], axis=0),
               helper.make_node("Unsqueeze", ["n", "ax"], ["n1"]),
               helper.make_node("Concat", ["n1", "minus"], ["target"], axis=0),  # x.view(x.size(0), -1)
               helper.make_node("Reshape", ["x", "target"], ["y"])], "y", ["n", "f"])
    mod, params = relay.frontend.from_onnx(m)
    assert str(mod["main"].checked_type) == "fn (Tensor[(n, s, 32), float32]) -> Tensor[(n, 32*s), float32]"
    x = RNG.standard_normal((3, 5, 32)).astype("float32")
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(relay.build(mod, params=params).create_executor()(x=x),
                               session.run(None, {"x": x})[0])
