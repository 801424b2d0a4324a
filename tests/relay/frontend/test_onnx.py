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
from kiln.relay.backend import build_module  # noqa: E402
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
    with pytest.raises(OnnxImportError, match=r"Where node 'w' \(opset 17\): input #1 \(X\) is required but given as"):
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
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_io("x", [2], TensorProto.COMPLEX64)],
                   [_io("y", [2], TensorProto.COMPLEX64)])
    with pytest.raises(OnnxImportError, match="input 'x' has ONNX type COMPLEX64"):
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


def test_a_3d_matmul_fuses_with_its_bias_add() -> None:
    """MatMul (1, S, K) x (K, N) becomes nn.dense on the 3-D input, not reshape -> dense -> reshape:
    the bias Add after it (and GELU after that) run in the product's epilogue."""
    mod, params = from_onnx(onnx_models.transformer_encoder())
    _, report = build_module.optimize_explained(mod, params)
    dense_groups = [g.ops for g in report.groups if "nn.dense" in g.ops]
    assert len(dense_groups) == 6
    assert all(ops[:2] == ("nn.dense", "add") for ops in dense_groups), dense_groups
    assert any("erf" in ops for ops in dense_groups)


def test_a_gemm_between_reshapes_is_an_nd_product_with_its_epilogue_fused() -> None:
    """GPT-2 as exported writes Reshape (1, S, K) -> (S, K), Gemm, Reshape (S, N) -> (1, S, N), then GELU:
    the Gemm becomes nn.dense on the 3-D input, the reshapes cancel, and the GELU fuses into it."""
    from kiln.testing import zoo

    model = zoo.build("gpt2_blocks", small=True)
    mod, params = from_onnx(model)
    _, report = build_module.optimize_explained(mod, params)
    assert any({"nn.dense", "tanh", "power"} <= set(g.ops) for g in report.groups), report
    feed = zoo.inputs(model)
    got = relay.build(mod, params=params).create_executor()(**feed)
    np.testing.assert_allclose(np.asarray(got), _ort(model, **feed)[0], rtol=1e-4, atol=1e-4)


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
    assert "kiln bench needs static input shapes: give them with --shape" in capsys.readouterr().err
    assert main(["bench", str(path), "--repeat", "1", "--shape", "x=2,4"]) == 0


def test_initializer_helper_round_trip() -> None:
    w = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "w")
    model = _model([helper.make_node("Add", ["x", "w"], ["y"])], [_io("x", [2, 3])], [_io("y", [2, 3])], [w])
    x = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(_run(model, x=x), x + np.arange(6).reshape(2, 3))


# --- nodes are held to their op's schema, and biases to the shape they add to -------------------------


def _import_error(model: Any) -> str:
    with pytest.raises(OnnxImportError) as info:
        from_onnx(model)
    return str(info.value)


def test_extra_inputs_and_outputs_are_errors_naming_the_node() -> None:
    model = _model([helper.make_node("Relu", ["x", "x"], ["y"], name="r")], [_io("x", [2])], [_io("y", [2])])
    assert _import_error(model) == ("Relu node 'r' (opset 17) takes at most 1 input(s) (X), found 2: ['x', 'x']")
    model = _model([helper.make_node("Relu", ["x"], ["y", "z"], name="r")], [_io("x", [2])], [_io("y", [2])])
    assert _import_error(model) == "Relu node 'r' (opset 17) has 1 output(s) (Y), found 2"
    c = numpy_helper.from_array(np.zeros(3, np.float32), "c")
    model = _model([helper.make_node("Gemm", ["a", "a", "c", "c"], ["y"], name="g")], [_io("a", [3, 3])],
                   [_io("y", [3, 3])], [c])
    assert "Gemm node 'g' (opset 17) takes at most 3 input(s) (A, B, C), found 4" in _import_error(model)
    # trailing "" leave optional inputs out: a valid node
    model = _model([helper.make_node("Clip", ["x", "", ""], ["y"])], [_io("x", [2])], [_io("y", [2])])
    x = np.array([-1, 2], np.float32)
    np.testing.assert_allclose(_run(model, x=x), x)


def test_required_inputs_must_be_given_and_optional_ones_may_be_empty() -> None:
    ins, outs = [_io("x", [2, 4]), _io("b", [4])], [_io("y", [2, 4])]
    model = _model([helper.make_node("LayerNormalization", ["x", "", "b"], ["y"], name="ln")], ins, outs)
    assert _import_error(model) == ("LayerNormalization node 'ln' (opset 17): input #1 (Scale) is required but "
                                    'given as ""')
    model = _model([helper.make_node("LayerNormalization", ["x"], ["y"], name="ln")], ins[:1], outs)
    assert _import_error(model) == "LayerNormalization node 'ln' (opset 17): input #1 (Scale) is required but missing"
    model = _model([helper.make_node("Concat", ["x", "", "x"], ["y"], name="cat", axis=0)], ins[:1], outs)
    assert 'input #1 (one of the variadic inputs) is given as ""' in _import_error(model)
    # the optional bias given as "" (numpy, not onnxruntime, which crashes on this node)
    model = _model([helper.make_node("LayerNormalization", ["x", "b", ""], ["y"], name="ln")], ins, outs)
    x, b = np.random.default_rng(4).standard_normal((2, 4)).astype(np.float32), np.arange(4, dtype=np.float32)
    want = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * b
    np.testing.assert_allclose(_run(model, x=x, b=b), want, rtol=1e-5, atol=1e-5)


def test_attributes_must_be_known_of_their_kind_and_present_when_required() -> None:
    ins, outs = [_io("x", [2])], [_io("y", [2])]
    model = _model([helper.make_node("LeakyRelu", ["x"], ["y"], name="lr", alpah=0.2)], ins, outs)
    assert _import_error(model) == "LeakyRelu node 'lr' (opset 17) has no attribute 'alpah' (its attributes: alpha)"
    model = _model([helper.make_node("LeakyRelu", ["x"], ["y"], name="lr", alpha=[1, 2])], ins, outs)
    assert _import_error(model) == "LeakyRelu node 'lr' (opset 17): attribute 'alpha' must be FLOAT, found INTS"
    model = _model([helper.make_node("Cast", ["x"], ["y"], name="c")], ins, outs)
    assert _import_error(model) == "Cast node 'c' (opset 17): the required attribute(s) ['to'] are missing"


def test_a_gemm_bias_must_broadcast_to_the_output_without_changing_it() -> None:
    def gemm(c_shape: tuple[int, ...]) -> Any:
        c = numpy_helper.from_array(np.arange(np.prod(c_shape), dtype=np.float32).reshape(c_shape), "c")
        return _model([helper.make_node("Gemm", ["a", "b", "c"], ["y"], name="g", beta=0.5)],
                      [_io("a", [1, 8]), _io("b", [8, 10])], [_io("y", [1, 10])], [c])

    # (64, 1) used to broadcast the (1, 10) product to a (64, 10) output
    text = _import_error(gemm((64, 1)))
    assert text == "Gemm node 'g': the bias C has shape (64, 1), which does not broadcast to (1, 10)"
    assert "has shape (3, 1, 10)" in _import_error(gemm((3, 1, 10)))
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((1, 8)).astype(np.float32), rng.standard_normal((8, 10)).astype(np.float32)
    for shape in [(), (1,), (10,), (1, 1), (1, 10)]:
        model = gemm(shape)
        got = _run(model, a=a, b=b)
        assert got.shape == (1, 10)
        np.testing.assert_allclose(got, _ort(model, a=a, b=b)[0], rtol=1e-5, atol=1e-5)


def test_norm_scales_biases_and_slopes_must_match_the_channels_or_normalized_dims() -> None:
    x_info, x = _io("x", [1, 3, 4, 4]), np.random.default_rng(6).standard_normal((1, 3, 4, 4)).astype(np.float32)

    def norm(op: str, shapes: dict[str, tuple[int, ...]], **attrs: Any) -> Any:
        inits = [numpy_helper.from_array(np.ones(s, np.float32), k) for k, s in shapes.items()]
        return _model([helper.make_node(op, ["x", *shapes], ["y"], name="n", **attrs)], [x_info],
                      [_io("y", [1, 3, 4, 4])], inits)

    # InstanceNormalization's (3, 1) scale used to broadcast the output to (3, 3, 4, 4)
    text = _import_error(norm("InstanceNormalization", {"s": (3, 1), "b": (3,)}))
    assert text == ("InstanceNormalization node 'n': input #1 (scale) has shape (3, 1): expected (3,), one value "
                    "per channel of X (1, 3, 4, 4)")
    assert "input #2 (B) has shape (1,)" in _import_error(norm("InstanceNormalization", {"s": (3,), "b": (1,)}))
    bn = {"s": (3,), "b": (3,), "m": (3,), "v": (3,)}
    assert "input #3 (mean) has shape (3, 1)" in _import_error(norm("BatchNormalization", {**bn, "m": (3, 1)}))
    assert "input #1 (scale) has shape (1,)" in _import_error(norm("BatchNormalization", {**bn, "s": (1,)}))
    text = _import_error(norm("Conv", {"w": (3, 3, 1, 1), "b": (3, 1, 1)}))
    assert text.startswith("Conv node 'n': 1 type error") and "expected bias of shape (3,)" in text
    # LayerNormalization: Scale and B broadcast to the normalized dims (here the last one, 4)
    text = _import_error(norm("LayerNormalization", {"s": (2, 4)}))
    assert text == "LayerNormalization node 'n': the Scale has shape (2, 4), which does not broadcast to (4,)"
    stats = _model([helper.make_node("LayerNormalization", ["x", "s", "b"], ["y", "mean"], name="n")], [x_info],
                   [_io("y", [1, 3, 4, 4])], [numpy_helper.from_array(np.ones(4, np.float32), "s"),
                                              numpy_helper.from_array(np.ones((4, 4, 4), np.float32), "b")])
    assert "the bias B has shape (4, 4, 4), which does not broadcast to (4,)" in _import_error(stats)
    # PRelu's slope broadcasts to X one way only
    text = _import_error(norm("PRelu", {"slope": (2, 1, 1, 1, 1)}))
    assert text == "PRelu node 'n': the slope has shape (2, 1, 1, 1, 1), which does not broadcast to (1, 3, 4, 4)"
    model = norm("PRelu", {"slope": (3, 1, 1)})
    np.testing.assert_allclose(_run(model, x=x), _ort(model, x=x)[0], rtol=1e-6)


def test_clip_bounds_are_scalars() -> None:
    lo = numpy_helper.from_array(np.full(3, -0.5, np.float32), "lo")
    model = _model([helper.make_node("Clip", ["x", "lo"], ["y"], name="c")], [_io("x", [])], [_io("y", [])], [lo])
    assert _import_error(model) == "Clip node 'c': min must be a scalar, found shape (3,)"
    model = _model([helper.make_node("Clip", ["x", "", "hi"], ["y"], name="c")], [_io("x", []), _io("hi", [2])],
                   [_io("y", [])])
    assert _import_error(model) == "Clip node 'c': input #2 (max) must be a scalar, found shape (2,)"
    # a (1,) bound on a scalar input: a scalar result, as onnxruntime gives
    lo = numpy_helper.from_array(np.full(1, -0.5, np.float32), "lo")
    model = _model([helper.make_node("Clip", ["x", "lo"], ["y"], name="c")], [_io("x", [])], [_io("y", [])], [lo])
    x = np.array(-2.0, np.float32)
    got, want = _run(model, x=x), _ort(model, x=x)[0]
    assert got.shape == want.shape == ()
    np.testing.assert_allclose(got, want)


# --- names that are not UTF-8 -------------------------------------------------------------------------------


def _with_raw_names(model: Any, names: dict[str, bytes]) -> bytes:
    """The serialized model with each placeholder name replaced by raw bytes of the same length."""
    data = model.SerializeToString()
    for old, new in names.items():
        assert len(old) == len(new) and data.count(old.encode()) >= 1
        data = data.replace(old.encode(), new)
    return data


def test_names_that_are_not_utf8_import_build_and_run() -> None:
    w = numpy_helper.from_array(np.arange(3, dtype=np.float32), "WWWW")
    model = _model([helper.make_node("Add", ["XXXX", "WWWW"], ["TTTT"], name="NNNN"),
                    helper.make_node("Relu", ["TTTT"], ["YYYY"], name="MMMM")],
                   [_io("XXXX", [3])], [_io("YYYY", [3])], [w])
    data = _with_raw_names(model, {"XXXX": b"x\xff\xfe1", "WWWW": b"w\xc3(2", "TTTT": b"t\xa0\xa13",
                                   "NNNN": b"n\xf0\x284", "MMMM": b"m\x80\x805"})
    assert onnx.load_from_string(data).graph.node[0].name == b"n\xf0\x284"  # protobuf hands back bytes
    for freeze in (True, False):
        mod, params = from_onnx(data, freeze_params=freeze)
        assert mod["main"].params[0].name_hint == "x\\xff\\xfe1"
        assert sorted(params) == ([] if freeze else ["w\\xc3(2"])
        spans = {str(n.span) for n in relay.analysis.post_order(mod["main"]) if isinstance(n, relay.Call)}
        assert spans == {"n\\xf0(4", "m\\x80\\x805"}
        x = np.array([-5, 0, 1], np.float32)
        want = np.maximum(x + np.arange(3), 0)
        np.testing.assert_allclose(relay.build(mod, params=params).create_executor()(**{"x\\xff\\xfe1": x}), want)
        debug = relay.create_executor("debug", mod, params=params)
        np.testing.assert_allclose(debug(**{"x\\xff\\xfe1": x}), want)
        assert '%"x\\\\xff\\\\xfe1": Tensor[(3,), float32]' in str(mod)  # the printer escapes the backslash


def test_errors_show_names_that_are_not_utf8_escaped() -> None:
    model = _model([helper.make_node("Add", ["XXXX", "ZZZZ"], ["YYYY"], name="NNNN")],
                   [_io("XXXX", [3]), _io("ZZZZ", [4])], [_io("YYYY", [3])])
    data = _with_raw_names(model, {"NNNN": b"n\xff\xfe4"})
    text = _import_error(data)
    assert text.startswith("Add node 'n\\xff\\xfe4': 1 type error") and "--> n\\xff\\xfe4" in text
    # the bytes b"\xff" and the text "\\xff" are distinct names; shown alike, they are an error, not a mix-up
    model = _model([helper.make_node("Add", ["\\xffAB", "QQQ"], ["YYYY"])],
                   [_io("\\xffAB", [3]), _io("QQQ", [3])], [_io("YYYY", [3])])
    text = _import_error(_with_raw_names(model, {"QQQ": b"\xffAB"}))
    assert text == ("inputs or initializers ['\\\\xffAB'] are distinct names that read the same once their "
                    "bytes that are not UTF-8 are shown as \\xNN; rename them")


# --- found by the mutation fuzzer (tests/relay/frontend/test_onnx_fuzz.py) ------------------------------


def test_flag_attributes_are_0_or_1() -> None:
    # keepdims=7 kept the dims in kiln and dropped them in onnxruntime (which reads only 1 as true)
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    model = _model([helper.make_node("ReduceSum", ["x", "axes"], ["y"], name="sum", keepdims=7)],
                   [_io("x", [2, 3])], [_io("y", [2])], [axes])
    assert _import_error(model) == "ReduceSum node 'sum': attribute 'keepdims' is 7: expected 0 or 1"
    model = _model([helper.make_node("Gemm", ["a", "a"], ["y"], name="g", transB=-1)], [_io("a", [2, 2])],
                   [_io("y", [2, 2])])
    assert _import_error(model) == "Gemm node 'g': attribute 'transB' is -1: expected 0 or 1"


def test_list_inputs_must_be_1d() -> None:
    # a (2, 1) axes was flattened and read as a list; onnxruntime refuses it
    def squeeze(axes: np.ndarray) -> Any:
        return _model([helper.make_node("Squeeze", ["x", "axes"], ["y"], name="sq")], [_io("x", [1, 3, 1])],
                      [_io("y", [3])], [numpy_helper.from_array(axes, "axes")])

    assert _import_error(squeeze(np.array([[0], [2]], np.int64))) == \
        "Squeeze node 'sq': input #1 (axes) must be a 1-D tensor, found shape (2, 1)"
    x = np.ones((1, 3, 1), np.float32)
    np.testing.assert_allclose(_run(squeeze(np.array([0, 2], np.int64)), x=x), np.ones(3))
    model = _model([helper.make_node("ReduceMax", ["x", "axes"], ["y"], name="mx")], [_io("x", [2, 3])],
                   [_io("y", [2, 1])], [numpy_helper.from_array(np.array([[1]], np.int64), "axes")], opset=18)
    assert _import_error(model) == \
        "ReduceMax node 'mx': input #1 (axes) must be a 1-D tensor of integers, found int64 of shape (1, 1)"


def test_a_gemm_with_an_infinite_alpha_matches_onnxruntime() -> None:
    # FoldScaleAxis folded alpha=inf into the weights: inf * w summed over K is nan where inf * (x @ w) is not
    w = numpy_helper.from_array(np.random.default_rng(7).standard_normal((6, 8)).astype(np.float32), "w")
    model = _model([helper.make_node("Gemm", ["x", "w"], ["h"], transB=1, alpha=float("inf")),
                    helper.make_node("Relu", ["h"], ["y"])], [_io("x", [2, 8])], [_io("y", [2, 6])], [w])
    x = np.random.default_rng(8).standard_normal((2, 8)).astype(np.float32)
    want = _ort(model, x=x)[0]
    assert not np.isnan(want).any()
    np.testing.assert_array_equal(_run(model, x=x), want)


def test_inputs_and_initializers_without_names_are_named_by_position() -> None:
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_io("x", [2]), _io("", [2])], [_io("y", [2])])
    assert _import_error(model) == "graph input #1 has no name"
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_io("x", [2])], [_io("y", [2])],
                   [numpy_helper.from_array(np.zeros(2, np.float32), "")])
    assert _import_error(model) == "initializer #0 has no name"


def test_clip_by_an_infinite_bound_that_binds() -> None:
    # max=-inf was skipped as if it bound nothing
    x = np.array([-2, 0, 3], np.float32)
    for lo, hi in [(-np.inf, -np.inf), (np.inf, np.inf), (-np.inf, np.inf), (-1.0, np.inf)]:
        bounds = [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in (("lo", lo), ("hi", hi))]
        model = _model([helper.make_node("Clip", ["x", "lo", "hi"], ["y"])], [_io("x", [3])], [_io("y", [3])],
                       bounds)
        np.testing.assert_array_equal(_run(model, x=x), _ort(model, x=x)[0])


def test_graph_outputs_must_have_the_declared_dtype() -> None:
    # the declaration used to be ignored; onnxruntime refuses the model
    cast = helper.make_node("Cast", ["x"], ["y"], to=TensorProto.DOUBLE)
    model = _model([cast], [_io("x", [2, 3])], [_io("y", [2, 3])])
    assert _import_error(model) == ("graph output 'y' is declared float32 but the graph computes "
                                    "Tensor[(2, 3), float64]")
    # a declared shape is not checked (onnxruntime warns and runs the graph): the graph's shape comes out
    for declared in ([3, 2], ["n", 3], [None, None], None):
        model = _model([helper.make_node("Relu", ["x"], ["y"])], [_io("x", [2, 3])], [_io("y", declared)])
        assert _run(model, x=np.ones((2, 3), np.float32)).shape == (2, 3)


def test_static_shapes_with_empty_dims_flatten_and_reshape() -> None:
    # Flatten of (1, 0, 4) at axis 2 passed (0, 4) to reshape, whose 0 means "copy the input's dim"
    x = np.zeros((1, 0, 4), np.float32)
    for axis in (0, 1, 2, 3):
        model = _model([helper.make_node("Flatten", ["x"], ["y"], axis=axis)], [_io("x", [1, 0, 4])],
                       [_io("y", None)])
        got, want = _run(model, x=x), _ort(model, x=x)[0]
        assert got.shape == want.shape
    model = _model([helper.make_node("Softmax", ["x"], ["y"], axis=1)], [_io("x", [2, 0, 3])], [_io("y", None)],
                   opset=11)
    x = np.zeros((2, 0, 3), np.float32)
    assert _run(model, x=x).shape == _ort(model, x=x)[0].shape == (2, 0, 3)


def test_pads_given_empty_and_storage_order_out_of_range_are_errors() -> None:
    # pads=[] was read as "no padding"; onnxruntime refuses it
    w = numpy_helper.from_array(np.ones((1, 1, 3, 3), np.float32), "w")
    conv = helper.make_node("Conv", ["x", "w"], ["y"], name="c")
    conv.attribute.append(helper.make_attribute("pads", [], attr_type=onnx.AttributeProto.INTS))
    model = _model([conv], [_io("x", [1, 1, 4, 4])], [_io("y", [1, 1, 2, 2])], [w])
    assert _import_error(model) == ("Conv node 'c': attribute 'pads' is []: expected 4 values >= 0 (the begins of "
                                    "the spatial dims, then their ends)")
    model = _model([helper.make_node("MaxPool", ["x"], ["y"], name="p", kernel_shape=[2, 2], storage_order=-1)],
                   [_io("x", [1, 1, 4, 4])], [_io("y", [1, 1, 3, 3])])
    assert _import_error(model) == "MaxPool node 'p': attribute 'storage_order' is -1: expected 0 or 1"


def test_an_integer_to_a_fractional_power_truncates_the_result_not_the_exponent() -> None:
    # the float exponent was cast to int64 first: 6 ** 0.9 came out 1 where onnxruntime gives 5
    model = _model([helper.make_node("Pow", ["b", "e"], ["y"])], [_io("b", [4], TensorProto.INT64), _io("e", [4])],
                   [_io("y", [4], TensorProto.INT64)], opset=15)
    b, e = np.array([6, 6, 2, 9], np.int64), np.array([0.9, -0.5, 2.5, 0.5], np.float32)
    np.testing.assert_array_equal(_run(model, b=b, e=e), _ort(model, b=b, e=e)[0])
    np.testing.assert_array_equal(_run(model, b=b, e=e), [5, 0, 5, 3])


def test_a_trailing_empty_input_past_the_schema_is_an_error() -> None:
    model = _model([helper.make_node("Relu", ["x", ""], ["y"], name="r")], [_io("x", [2])], [_io("y", [2])])
    assert _import_error(model) == "Relu node 'r' (opset 17) takes at most 1 input(s) (X), found 2: ['x', '']"


def test_input_dtypes_follow_the_schemas_type_constraints() -> None:
    # HardSigmoid of int64 ran with alpha and beta rounded to 0; onnxruntime has no such kernel
    model = _model([helper.make_node("HardSigmoid", ["x"], ["y"], name="hs")], [_io("x", [3], TensorProto.INT64)],
                   [_io("y", [3], TensorProto.INT64)])
    assert _import_error(model) == ("HardSigmoid node 'hs' (opset 17): input #0 (X) is int64, which HardSigmoid "
                                    "does not take (it takes double, float, float16)")
    model = _model([helper.make_node("Add", ["a", "b"], ["y"], name="add")],
                   [_io("a", [3]), _io("b", [3], TensorProto.DOUBLE)], [_io("y", [3])])
    assert _import_error(model) == ("Add node 'add' (opset 17): input #1 (B) is double but input #0 is float; "
                                    "both are of type T")
    model = _model([helper.make_node("Reshape", ["x", "s"], ["y"], name="r")],
                   [_io("x", [2, 3]), _io("s", [2], TensorProto.INT32)], [_io("y", [3, 2])])
    assert "input #1 (shape) is int32, which Reshape does not take (it takes int64)" in _import_error(model)


def test_an_unnamed_graph_output_is_named_by_position() -> None:
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_io("x", [2])], [_io("y", [2]), _io("", [2])])
    assert _import_error(model) == "graph output #1 has no name"


def test_an_op_before_its_first_opset_pads_that_remove_too_much_and_dropout_ratios_that_are_not_scalars() -> None:
    # all three imported: Erf at opset 7 (defined from 9), a crop past the axis clamped to empty, a (4,) ratio
    model = _model([helper.make_node("Erf", ["x"], ["y"], name="e")], [_io("x", [2])], [_io("y", [2])], opset=7)
    assert _import_error(model) == "Erf node 'e': Erf exists from opset 9, but the model imports opset 7"
    pads = numpy_helper.from_array(np.array([0, -2, 0, -1], np.int64), "pads")
    model = _model([helper.make_node("Pad", ["x", "pads"], ["y"], name="p")], [_io("x", [2, 2])], [_io("y", None)],
                   [pads])
    assert _import_error(model) == "Pad node 'p': pads [0, -2, 0, -1] remove 3 elements from axis 1, which has 2"
    pads = numpy_helper.from_array(np.array([0, -2, 0, 3], np.int64), "pads")  # a crop of the whole axis is fine
    model = _model([helper.make_node("Pad", ["x", "pads"], ["y"])], [_io("x", [2, 2])], [_io("y", None)], [pads])
    x = np.ones((2, 2), np.float32)
    # all 3 columns padding (onnxruntime 1.23, the newest for Python 3.10, fills them with whatever memory held)
    np.testing.assert_array_equal(_run(model, x=x), np.zeros((2, 3), np.float32))
    ratio = numpy_helper.from_array(np.full(4, 0.5, np.float32), "r")
    model = _model([helper.make_node("Dropout", ["x", "r"], ["y"], name="d")], [_io("x", [2])], [_io("y", [2])],
                   [ratio])
    assert _import_error(model) == "Dropout node 'd': input #1 (ratio) must be a scalar, found shape (4,)"


def test_pool_pads_as_large_as_the_kernel_and_softmax_axes_out_of_range_are_errors() -> None:
    # a window wholly in the padding gave -inf (max) or 0 (average); onnxruntime refuses the node
    for op in ("MaxPool", "AveragePool"):
        model = _model([helper.make_node(op, ["x"], ["y"], name="p", kernel_shape=[2, 2], pads=[2, 0, 0, 0])],
                       [_io("x", [1, 1, 4, 4])], [_io("y", None)])
        assert _import_error(model) == f"{op} node 'p': pads [2, 0, 0, 0] must be smaller than the kernel [2, 2]"
    # Softmax before opset 13 with axis 3 of a rank-3 input was a softmax over nothing: all ones
    model = _model([helper.make_node("Softmax", ["x"], ["y"], name="s", axis=3)], [_io("x", [2, 3, 4])],
                   [_io("y", [2, 3, 4])], opset=12)
    assert _import_error(model) == "Softmax node 's': axis 3 is out of range for a tensor of rank 3 (allowed: -3 to 2)"
