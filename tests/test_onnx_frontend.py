"""relay.frontend.from_onnx: the converter table, errors, spans, symbolic dims, params, real models, the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from kiln import relay  # noqa: E402
from kiln.cli import main  # noqa: E402
from kiln.ir.types import SizeVar  # noqa: E402
from kiln.relay.frontend import OnnxImportError, OnnxUnsupportedError, from_onnx, onnx_converter  # noqa: E402
from kiln.relay.frontend.onnx import find_converter  # noqa: E402
from kiln.testing import onnx_models  # noqa: E402

F = TensorProto.FLOAT


def _model(nodes: list[Any], inputs: list[Any], outputs: list[Any], inits: list[Any] = (),  # type: ignore[assignment]
           opset: int = 17, extra_opsets: dict[str, int] | None = None) -> Any:
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model


def _io(name: str, shape: list[Any], dtype: int = F) -> Any:
    return helper.make_tensor_value_info(name, dtype, shape)


def _run(model: Any, **inputs: np.ndarray) -> Any:
    mod, params = from_onnx(model)
    return relay.build(mod, params=params).create_executor()(**inputs)


def _ort(model: Any, **inputs: np.ndarray) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return list(sess.run(None, inputs))


# --- the converter table ----------------------------------------------------------------------------


def test_every_unsupported_op_is_listed_once_with_its_nodes() -> None:
    nodes = [
        helper.make_node("Frobnicate", ["x"], ["a"], name="frob1"),
        helper.make_node("Relu", ["a"], ["b"], name="ok"),
        helper.make_node("Frobnicate", ["b"], ["c"], name="frob2"),
        helper.make_node("Twiddle", ["c"], ["y"], name="tw", domain="my.ops"),
    ]
    model = _model(nodes, [_io("x", [2])], [_io("y", [2])], extra_opsets={"my.ops": 3})
    with pytest.raises(OnnxUnsupportedError) as info:
        from_onnx(model)
    text = str(info.value)
    assert "2 op(s)" in text
    assert "Frobnicate (opset 17): 'frob1', 'frob2'" in text
    assert "my.ops.Twiddle (opset 3): 'tw'" in text
    assert set(info.value.unsupported) == {("", "Frobnicate", 17), ("my.ops", "Twiddle", 3)}


def test_a_user_converter_for_a_custom_domain_and_its_opset_ranges() -> None:
    @onnx_converter("Scale", domain="test.kiln", since=1)
    def scale_v1(node: Any) -> Any:
        return relay.multiply(node.input(0), relay.const(np.float32(node.attr("factor", 2.0))))

    @onnx_converter("Scale", domain="test.kiln", since=5)
    def scale_v5(node: Any) -> Any:  # since 5 the factor is an input
        return relay.multiply(node.input(0), node.input(1))

    assert find_converter("Scale", 3, "test.kiln").fn is scale_v1  # type: ignore[union-attr]
    assert find_converter("Scale", 9, "test.kiln").fn is scale_v5  # type: ignore[union-attr]
    x = np.arange(4, dtype=np.float32)
    old = _model([helper.make_node("Scale", ["x"], ["y"], domain="test.kiln", factor=3.0)],
                 [_io("x", [4])], [_io("y", [4])], extra_opsets={"test.kiln": 2})
    np.testing.assert_allclose(_run(old, x=x), 3 * x)
    new = _model([helper.make_node("Scale", ["x", "f"], ["y"], domain="test.kiln")],
                 [_io("x", [4]), _io("f", [4])], [_io("y", [4])], extra_opsets={"test.kiln": 5})
    np.testing.assert_allclose(_run(new, x=x, f=x), x * x)

    with pytest.raises(OnnxImportError, match="registered twice.*override=True"):
        onnx_converter("Scale", domain="test.kiln", since=5)(scale_v1)
    onnx_converter("Scale", domain="test.kiln", since=5, override=True)(scale_v1)
    assert find_converter("Scale", 9, "test.kiln").fn is scale_v1  # type: ignore[union-attr]


def test_until_bounds_an_opset_range() -> None:
    onnx_converter("Bounded", domain="test.until", since=2, until=4)(lambda node: node.input(0))
    assert find_converter("Bounded", 1, "test.until") is None
    assert find_converter("Bounded", 4, "test.until") is not None
    assert find_converter("Bounded", 5, "test.until") is None
    model = _model([helper.make_node("Bounded", ["x"], ["y"], domain="test.until", name="b")],
                   [_io("x", [1])], [_io("y", [1])], extra_opsets={"test.until": 6})
    with pytest.raises(OnnxUnsupportedError, match=r"test.until.Bounded \(opset 6\): 'b' \(kiln converts opsets 2-4\)"):
        from_onnx(model)


# --- malformed models -------------------------------------------------------------------------------


def test_a_dangling_input_names_the_node() -> None:
    model = _model([helper.make_node("Add", ["x", "ghost"], ["y"], name="adder")], [_io("x", [2])], [_io("y", [2])])
    with pytest.raises(OnnxImportError, match="Add node 'adder' reads 'ghost', which no node, graph input or init"):
        from_onnx(model)


def test_a_cycle_is_an_error_and_unsorted_nodes_are_sorted() -> None:
    cyc = _model([helper.make_node("Relu", ["b"], ["a"], name="r1"), helper.make_node("Relu", ["a"], ["b"], name="r2")],
                 [_io("x", [2])], [_io("b", [2])])
    with pytest.raises(OnnxImportError, match="cycle through Relu node"):
        from_onnx(cyc)
    unsorted = _model([helper.make_node("Neg", ["a"], ["y"], name="second"),
                       helper.make_node("Relu", ["x"], ["a"], name="first")], [_io("x", [3])], [_io("y", [3])])
    x = np.array([-1, 0, 2], np.float32)
    np.testing.assert_allclose(_run(unsorted, x=x), -np.maximum(x, 0))


def test_an_initializer_whose_data_does_not_fit_its_dims() -> None:
    w = numpy_helper.from_array(np.zeros((2, 3), np.float32), "w")
    w.raw_data = np.zeros(5, np.float32).tobytes()  # a truncated file
    model = _model([helper.make_node("Add", ["x", "w"], ["y"])], [_io("x", [2, 3])], [_io("y", [2, 3])], [w])
    with pytest.raises(OnnxImportError, match=r"initializer 'w'.*dims \(2, 3\)"):
        from_onnx(model)


def test_bad_attributes_and_missing_inputs_name_the_node() -> None:
    model = _model([helper.make_node("LeakyRelu", ["x"], ["y"], name="lr", alpha="much")],
                   [_io("x", [2])], [_io("y", [2])])
    with pytest.raises(OnnxImportError, match="LeakyRelu node 'lr'"):
        from_onnx(model)
    model = _model([helper.make_node("Where", ["x", "", "x"], ["y"], name="w")], [_io("x", [2])], [_io("y", [2])])
    with pytest.raises(OnnxImportError, match="Where node 'w': input #1 is required but missing"):
        from_onnx(model)


def test_unreadable_files_are_kiln_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage that is not a protobuf \xff\xff\xff")
    with pytest.raises(OnnxImportError, match="not a readable ONNX model"):
        from_onnx(bad)
    with pytest.raises(OnnxImportError, match="cannot read the ONNX model"):
        from_onnx(tmp_path / "missing.onnx")
    with pytest.raises(OnnxImportError, match="expects a path, bytes or an onnx.ModelProto"):
        from_onnx(42)


def test_unsupported_dtypes_and_shape_overrides_name_the_input() -> None:
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_io("x", [2], TensorProto.UINT16)],
                   [_io("y", [2], TensorProto.UINT16)])
    with pytest.raises(OnnxImportError, match="input 'x' has ONNX type UINT16"):
        from_onnx(model)
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_io("x", [2])], [_io("y", [2])])
    with pytest.raises(OnnxImportError, match=r"shape= names \['z'\].*inputs are \['x'\]"):
        from_onnx(model, shape={"z": (1,)})


# --- spans, symbolic dims, params ----------------------------------------------------------------------


def test_a_type_error_names_the_onnx_node() -> None:
    model = _model([helper.make_node("Relu", ["x"], ["r"], name="act"),
                    helper.make_node("Add", ["r", "z"], ["y"], name="the_bad_add")],
                   [_io("x", [2, 3]), _io("z", [4])], [_io("y", [2, 3])])
    with pytest.raises(OnnxImportError) as info:
        from_onnx(model)
    assert "Add node 'the_bad_add'" in str(info.value)
    assert "--> the_bad_add" in str(info.value)


def test_spans_point_back_to_onnx_nodes() -> None:
    mod, _ = from_onnx(onnx_models.cnn())
    spans = {str(n.span) for n in relay.analysis.post_order(mod["main"]) if isinstance(n, relay.Call)}
    assert {"/Conv_1", "/BatchNormalization_2", "/Gemm_11"} <= spans


def test_symbolic_dims_become_size_vars_and_shape_fixes_them() -> None:
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_io("x", ["batch", 8])], [_io("y", ["batch", 8])])
    mod, _ = from_onnx(model)
    assert mod["main"].params[0].type_annotation.shape == (SizeVar("batch"), 8)
    mod, _ = from_onnx(model, shape={"x": (3, 8)})
    assert mod["main"].params[0].type_annotation.shape == (3, 8)
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    np.testing.assert_allclose(relay.build(mod).create_executor()(x=x), np.maximum(x, 0))


def test_unfrozen_initializers_are_params() -> None:
    model = onnx_models.cnn()
    mod, params = from_onnx(model, freeze_params=False)
    names = [p.name_hint for p in mod["main"].params]
    assert names[0] == "input" and "conv1.weight" in names and set(params) == set(names[1:])
    x = np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype(np.float32)
    got = relay.build(mod, params=params).create_executor()(input=x)
    np.testing.assert_allclose(got, _ort(model, input=x)[0], rtol=1e-4, atol=1e-4)


# --- real models against onnxruntime ---------------------------------------------------------------------


@pytest.mark.parametrize("make", [onnx_models.cnn, onnx_models.transformer_encoder], ids=["cnn", "transformer"])
def test_models_match_onnxruntime(make: Any) -> None:
    model = make()
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    want = _ort(model, input=x)[0]
    got = _run(model, input=x)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_the_transformers_shape_arithmetic_folds_away() -> None:
    mod, _ = from_onnx(onnx_models.transformer_encoder())
    ops = {n.op.name for n in relay.analysis.post_order(mod["main"]) if isinstance(n, relay.Call)}
    assert "shape_of" not in ops and "concatenate" not in ops and "take" not in ops
    assert "nn.dense" in ops  # MatMul against a weight matrix becomes nn.dense


# --- the command line -------------------------------------------------------------------------------------


def test_cli_show_compile_run_and_bench(tmp_path: Path, capsys: Any) -> None:
    model = onnx_models.cnn()
    path = tmp_path / "cnn.onnx"
    onnx.save(model, path)
    assert main(["show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "nn.conv2d" in out and "fusion" in out.lower()

    lib = tmp_path / "cnn.kiln"
    assert main(["compile", str(path), "--target", "llvm", "-o", str(lib)]) == 0
    x = np.random.default_rng(3).standard_normal((1, 3, 32, 32)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(lib), "--input", f"input={tmp_path / 'x.npy'}", "--output", str(tmp_path / "y.npy")]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), _ort(model, input=x)[0], rtol=1e-4, atol=1e-4)

    capsys.readouterr()
    assert main(["bench", str(path), "--repeat", "3"]) == 0
    out = capsys.readouterr().out
    assert "kiln " in out and "onnxruntime " in out and "kiln speed vs onnxruntime:" in out
    diff = float(out.split("max |kiln - onnxruntime| over the outputs:")[1].split()[0])
    assert diff < 1e-4


def test_cli_lists_the_onnx_converters(capsys: Any) -> None:
    assert main(["ops", "--onnx"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.split()[:2] == ["ai.onnx", "Conv"] for line in lines)
    squeeze = [line.split()[3] for line in lines if line.split()[1] == "Squeeze"]
    assert squeeze == ["1+", "13+"]  # axes became an input at opset 13
    assert main(["ops", "Resize", "--onnx", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["op_type"] == "Resize"
    assert main(["ops", "Frobnicate", "--onnx"]) == 2


def test_cli_errors_for_onnx_models(tmp_path: Path, capsys: Any) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    assert main(["show", str(bad)]) == 2
    assert "kiln: error:" in capsys.readouterr().err
    assert main(["compile", str(tmp_path / "none.onnx"), "-o", str(tmp_path / "o.kiln")]) == 2
    assert "no such file" in capsys.readouterr().err
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_io("x", ["n", 4])], [_io("y", ["n", 4])])
    path = tmp_path / "sym.onnx"
    onnx.save(model, path)
    assert main(["bench", str(path), "--repeat", "1", "--shape", "x=oops=1"]) == 2
    assert main(["bench", str(path), "--repeat", "1"]) == 2
    assert "x has type Tensor[(n, 4), float32]: give its dims" in capsys.readouterr().err
    assert main(["bench", str(path), "--repeat", "1", "--shape", "x=2,4"]) == 0


def test_initializer_helper_round_trip() -> None:
    w = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "w")
    model = _model([helper.make_node("Add", ["x", "w"], ["y"])], [_io("x", [2, 3])], [_io("y", [2, 3])], [w])
    x = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(_run(model, x=x), x + np.arange(6).reshape(2, 3))
