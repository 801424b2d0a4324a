"""OnnxRunner and from_onnx(values=): inputs whose values decide shapes, given at run time."""

from __future__ import annotations

import logging

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

from kiln import relay  # noqa: E402
from kiln.relay.frontend import OnnxImportError, OnnxRunner, OnnxValueNeededError, from_onnx  # noqa: E402


def _reshape_model() -> onnx.ModelProto:
    """y = Reshape(x, shape) + 1: the input `shape` decides y's shape."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
         helper.make_node("Add", ["r", "one"], ["y"], name="add")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4]),
         helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _slice_model() -> onnx.ModelProto:
    """Slice with starts and ends given as two graph inputs (the import asks for them one at a time)."""
    graph = helper.make_graph(
        [helper.make_node("Slice", ["x", "starts", "ends"], ["y"], name="slice")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [10]),
         helper.make_tensor_value_info("starts", TensorProto.INT64, [1]),
         helper.make_tensor_value_info("ends", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_import_names_the_node_and_the_inputs_whose_values_decide_shapes() -> None:
    with pytest.raises(OnnxValueNeededError, match=r"Reshape node 'reshape'.*input #1 \(shape\).*'shape'") as info:
        from_onnx(_reshape_model())
    assert info.value.names == ("shape",)
    assert "OnnxRunner" in str(info.value)


def test_values_fix_an_input_as_a_constant() -> None:
    mod, params = from_onnx(_reshape_model(), values={"shape": np.array([4, 6])})
    assert [p.name_hint for p in mod["main"].params] == ["x"]
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    got = relay.build(mod, params=params).create_executor()(x=x)
    np.testing.assert_array_equal(got, x.reshape(4, 6) + 1)


@pytest.mark.parametrize("value, error", [
    (np.array([4, 6], dtype=np.int32), r"values= gives input 'shape' a int32 array of shape \(2,\).*int64"),
    (np.array([2, 3, 4]), r"values= gives input 'shape' a int64 array of shape \(3,\)"),
])
def test_values_that_do_not_fit_the_declared_input_are_refused(value: np.ndarray, error: str) -> None:
    with pytest.raises(OnnxImportError, match=error):
        from_onnx(_reshape_model(), values={"shape": value})


def test_values_for_an_unknown_input_are_refused() -> None:
    with pytest.raises(OnnxImportError, match=r"values= names \['shapes'\], which are not inputs.*'shape'"):
        from_onnx(_reshape_model(), values={"shapes": np.array([4, 6])})


def test_runner_compiles_once_per_distinct_value_and_logs_it_once(caplog: pytest.LogCaptureFixture) -> None:
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    with caplog.at_level(logging.INFO, logger="kiln"):
        runner = OnnxRunner(_reshape_model())
        assert runner.value_inputs == ("shape",) and runner.specializations == 0
        np.testing.assert_array_equal(runner(x=x, shape=np.array([4, 6])), x.reshape(4, 6) + 1)
        np.testing.assert_array_equal(runner(x, np.array([-1, 2])), x.reshape(-1, 2) + 1)
        np.testing.assert_array_equal(runner(x=2 * x, shape=np.array([4, 6])), 2 * x.reshape(4, 6) + 1)
    assert runner.specializations == 2
    said = [r.getMessage() for r in caplog.records if "decide shapes" in r.getMessage()]
    assert said == ["the values of ONNX input(s) 'shape' decide shapes: kiln compiles one kernel set per distinct "
                    "value of them"]


def test_runner_learns_every_input_that_decides_shapes() -> None:
    runner = OnnxRunner(_slice_model())
    x = np.arange(10, dtype=np.float32)
    np.testing.assert_array_equal(runner(x=x, starts=np.array([2]), ends=np.array([7])), x[2:7])
    assert set(runner.value_inputs) == {"starts", "ends"}
    np.testing.assert_array_equal(runner(x=x, starts=np.array([-3]), ends=np.array([100])), x[-3:])


def test_runner_keeps_the_most_recent_specializations() -> None:
    runner = OnnxRunner(_slice_model(), max_specializations=1)
    x = np.arange(10, dtype=np.float32)
    for start in (1, 2, 1):
        np.testing.assert_array_equal(runner(x=x, starts=np.array([start]), ends=np.array([9])), x[start:9])
    assert runner.specializations == 1


def test_runner_refuses_a_missing_input_that_decides_shapes() -> None:
    runner = OnnxRunner(_reshape_model())
    with pytest.raises(OnnxImportError, match=r"input\(s\) \['shape'\] are missing; their values decide shapes"):
        runner(x=np.zeros((2, 3, 4), np.float32))


def test_runner_compiles_a_static_model_at_once() -> None:
    mod_free = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]), opset_imports=[helper.make_opsetid("", 17)])
    runner = OnnxRunner(mod_free)
    assert runner.value_inputs == () and runner.specializations == 1
    np.testing.assert_array_equal(runner(np.array([-1.0, 0.0, 2.0], np.float32)), [0.0, 0.0, 2.0])
