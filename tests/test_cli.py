"""The `kiln` command line: the registry export behind `kiln ops`, and `kiln show/compile/run` round trips."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import attrs
import cuda_standin
import numpy as np
import pytest

from kiln import registry, relay, runtime
from kiln.cli import load_model, main
from kiln.progress import ProgressBar
from kiln.registry import OpPattern, attr, register_op


@attrs.frozen
class PadAttrs:
    pad_width: tuple[int, ...] = attrs.field(metadata={"doc": "padding per axis"})
    pad_value: float = 0.0


def _register_two_ops() -> None:
    (
        register_op("test.pad")
        .describe("pads a tensor")
        .set_num_inputs(1)
        .add_argument("data", "Tensor", "input")
        .set_attrs_type(PadAttrs)
        .set_support_level(2)
        .set_attr(attr.TOpPattern, OpPattern.INJECTIVE)
    )
    register_op("test.plain").describe("no attrs").add_argument("x", "Tensor")


def test_ops_json_lists_each_op_once_with_its_schema(capsys: pytest.CaptureFixture[str]) -> None:
    _register_two_ops()
    registry.Op.get("test.pad").set_attr(attr.TOpPattern, OpPattern.OPAQUE, plevel=20)  # a second registration
    assert main(["ops", "--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    names = [r["name"] for r in records]
    assert len(names) == len(set(names)) == len(registry.Op.list_names())
    pad = next(r for r in records if r["name"] == "test.pad")
    assert pad["description"] == "pads a tensor"
    assert pad["num_inputs"] == 1
    assert pad["arguments"] == [{"name": "data", "type": "Tensor", "description": "input"}]
    assert pad["support_level"] == 2
    assert pad["attr_keys"] == ["TOpPattern"]
    assert pad["gradient"] == "missing"
    equal = next(r for r in records if r["name"] == "equal")
    assert equal["gradient"].startswith("none: ")  # why, from its TNonDifferentiable
    assert next(r for r in records if r["name"] == "exp")["gradient"] == "registered"
    assert pad["attrs_type"] == "PadAttrs"
    assert pad["attrs"] == [
        {"name": "pad_width", "type": "tuple[int, ...]", "required": True, "default": None,
         "doc": "padding per axis"},
        {"name": "pad_value", "type": "float", "required": False, "default": 0.0, "doc": ""},
    ]


def test_ops_table_and_one_op_in_full(capsys: pytest.CaptureFixture[str]) -> None:
    _register_two_ops()
    assert main(["ops"]) == 0
    table = capsys.readouterr().out
    assert "test.pad" in table and "test.plain" in table
    assert f"{len(registry.Op.list_names())} ops" in table
    assert main(["ops", "test.pad"]) == 0
    full = capsys.readouterr().out
    assert "pads a tensor" in full
    assert "pad_width: tuple[int, ...] (required) -- padding per axis" in full
    assert "TOpPattern: OpPattern.INJECTIVE (plevel 10, set at" in full
    assert "test_cli.py:" in full


def test_unknown_op_is_an_error_with_suggestions(capsys: pytest.CaptureFixture[str]) -> None:
    _register_two_ops()
    assert main(["ops", "test.pda"]) == 2
    assert "kiln: error: unknown op 'test.pda' (did you mean 'test.pad'" in capsys.readouterr().err


def test_targets_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["targets", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [k["name"] for k in data["kinds"]] == ["llvm", "cuda"]
    h100 = next(t for t in data["tags"] if t["name"] == "nvidia/h100")
    assert h100["options"]["arch"] == "sm_90"


def test_target_command_shows_and_exports(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["target", "nvidia/a100"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "nvidia/a100"
    assert "arch" in out and "sm_80" in out
    assert main(["target", "llvm -mcpu=znver4 -num-cores=2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["num-cores"] == 2
    assert main(["target", "cuda -arch=90"]) == 2
    assert "expects a string (sm_XY" in capsys.readouterr().err


def test_ops_lists_the_op_library(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ops", "--json"]) == 0
    names = [r["name"] for r in json.loads(capsys.readouterr().out)]
    for name in ("add", "nn.conv2d", "reshape", "sum", "nn.batch_norm"):
        assert names.count(name) == 1
    assert main(["ops", "nn.conv2d"]) == 0
    full = capsys.readouterr().out
    assert "data_layout" in full and "TOpPattern: OpPattern.OUT_ELEMWISE_FUSABLE" in full


def test_the_installed_entry_point_runs() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kiln", "ops", "--json"], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    records = json.loads(done.stdout)
    assert len({r["name"] for r in records}) == len(records)


# ---------------------------------------------------------------------------
# kiln show / compile / run
# ---------------------------------------------------------------------------

MODEL = """\
def @main(%x: Tensor[(4, 8), float32], %w: Tensor[(3, 8), float32], %b: Tensor[(3,), float32]) {
  %0 = nn.dense(%x, %w);
  %1 = nn.bias_add(%0, %b);
  nn.relu(%1)
}
"""

TWO_OUTPUTS = """\
def @main(%x: Tensor[(2, 3), float32]) {
  %0 = nn.relu(%x);
  %1 = negative(%x);
  (%0, %1)
}
"""

RNG = np.random.default_rng(0)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """The dense-bias-relu model as text, its weights as .npz, an input as .npy."""
    model = tmp_path / "model.txt"
    model.write_text(MODEL)
    params = {"w": RNG.standard_normal((3, 8)).astype("float32"), "b": RNG.standard_normal(3).astype("float32")}
    np.savez(tmp_path / "params.npz", **params)
    np.save(tmp_path / "x.npy", RNG.standard_normal((4, 8)).astype("float32"))
    return {"model": model, "params": tmp_path / "params.npz", "x": tmp_path / "x.npy", "dir": tmp_path}


def _expected(files: dict[str, Path]) -> np.ndarray:
    x, p = np.load(files["x"]), np.load(files["params"])
    return np.maximum(x @ p["w"].T + p["b"], 0)


def _compile(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> Path:
    lib = files["dir"] / "model.kiln"
    assert main(["compile", str(files["model"]), "--params", str(files["params"]), "-o", str(lib)]) == 0
    err = capsys.readouterr().err
    assert "kiln: compiled 1 kernel in" in err and "(inputs: x float32[4, 8]; 1 output)" in err
    return lib


def test_show_prints_the_typed_ir_which_parses_back(files: dict[str, Path],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", str(files["model"])]) == 0
    out = capsys.readouterr().out
    assert "%2 = nn.relu(%1) /* ty=Tensor[(4, 3), float32] */;" in out
    assert "Primitive" not in out and "fusion of" not in out
    assert relay.structural_equal(relay.parse(out), load_model(files["model"]))


def test_show_fusion_prints_the_fused_ir_and_the_report(files: dict[str, Path],
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", str(files["model"]), "--fusion"]) == 0
    out = capsys.readouterr().out
    fused = out.split("// after relay.build's passes")[1]
    assert "Primitive=1" in fused and "nn.dense(%p0, %p1)" in fused
    assert "fusion of @main: 1 group (max" in fused
    assert "group 0 [out-elemwise-fusable]: nn.dense, nn.bias_add, nn.relu" in fused
    assert main(["show", str(files["model"]), "--fusion", "--params", str(files["params"])]) == 0
    bound = capsys.readouterr().out.split("// after relay.build's passes")[1]
    assert "def @main(%x: Tensor[(4, 8), float32]) {" in bound  # the weights are constants now
    assert "meta[relay.Constant][0]" in bound


def test_compile_with_params_then_run_matches_numpy(files: dict[str, Path],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    lib = _compile(files, capsys)
    out = files["dir"] / "y.npy"
    assert main(["run", str(lib), "--input", f"x={files['x']}", "--output", str(out)]) == 0
    assert capsys.readouterr().out == f"wrote {out}: float32[4, 3]\n"
    np.testing.assert_allclose(np.load(out), _expected(files), rtol=1e-5, atol=1e-6)
    assert main(["run", str(lib), "-i", f"x={files['x']}"]) == 0
    summary = capsys.readouterr().out.splitlines()
    assert summary[0].startswith("output_0: float32[4, 3]  min 0  max ")
    assert summary[1].startswith("  first values: ") and summary[1].endswith(", ...")


@cuda_standin.needs_gxx
def test_compile_for_cuda_then_run_through_the_host_stand_in(files: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    lib = files["dir"] / "gpu.kiln"
    assert main(["compile", str(files["model"]), "--params", str(files["params"]), "--target", "cuda -arch=sm_90",
                 "-o", str(lib)]) == 0
    assert "kiln: compiled 1 kernel in" in capsys.readouterr().err
    launches = cuda_standin.install(monkeypatch, files["dir"])
    out = files["dir"] / "y.npy"
    assert main(["run", str(lib), "--input", f"x={files['x']}", "--output", str(out)]) == 0
    assert capsys.readouterr().out == f"wrote {out}: float32[4, 3]\n"
    np.testing.assert_allclose(np.load(out), _expected(files), rtol=1e-5, atol=1e-6)  # copied from the device
    assert len(launches) == 1


def test_compile_without_params_leaves_the_weights_as_inputs(files: dict[str, Path],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    lib = files["dir"] / "open.kiln"
    assert main(["compile", str(files["model"]), "-o", str(lib)]) == 0
    assert "(inputs: x float32[4, 8], w float32[3, 8], b float32[3]; 1 output)" in capsys.readouterr().err
    out = files["dir"] / "y.npz"
    assert main(["run", str(lib), "-i", f"x={files['x']}", "-i", str(files["params"]), "-o", str(out)]) == 0
    with np.load(out) as saved:
        assert saved.files == ["output_0"]
        np.testing.assert_allclose(saved["output_0"], _expected(files), rtol=1e-5, atol=1e-6)


def test_several_outputs_go_to_numbered_npy_files_or_one_npz(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "two.txt").write_text(TWO_OUTPUTS)
    x = np.arange(6, dtype="float32").reshape(2, 3) - 3
    np.save(tmp_path / "x.npy", x)
    lib = str(tmp_path / "two.kiln")
    assert main(["compile", str(tmp_path / "two.txt"), "-o", lib]) == 0
    assert main(["run", lib, "-i", f"x={tmp_path / 'x.npy'}", "-o", str(tmp_path / "y.npy")]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "y_0.npy"), np.maximum(x, 0))
    np.testing.assert_array_equal(np.load(tmp_path / "y_1.npy"), -x)
    assert not (tmp_path / "y.npy").exists()
    assert main(["run", lib, "-i", f"x={tmp_path / 'x.npy'}", "-o", str(tmp_path / "y.npz")]) == 0
    with np.load(tmp_path / "y.npz") as saved:
        assert saved.files == ["output_0", "output_1"]
        np.testing.assert_array_equal(saved["output_1"], -x)
    assert "wrote" in capsys.readouterr().out


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    assert captured.err.startswith("kiln: error: ")
    return captured.err


def test_run_refuses_missing_extra_and_misshapen_inputs(files: dict[str, Path],
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    lib = str(_compile(files, capsys))
    assert "missing input(s) x (float32[4, 8]); give each as --input NAME=FILE.npy" in _fails(["run", lib], capsys)
    np.save(files["dir"] / "short.npy", np.zeros((4, 7), "float32"))
    err = _fails(["run", lib, "-i", f"x={files['dir'] / 'short.npy'}"], capsys)
    assert "input 'x': expected shape (4, 8), got (4, 7)" in err
    np.save(files["dir"] / "wide.npy", np.zeros((4, 8)))
    assert "expected dtype float32, got float64" in _fails(["run", lib, "-i", f"x={files['dir'] / 'wide.npy'}"],
                                                           capsys)
    err = _fails(["run", lib, "-i", f"x={files['x']}", "-i", f"y={files['x']}"], capsys)
    assert "the library has no input 'y'; its inputs: x (float32[4, 8])" in err
    err = _fails(["run", lib, "-i", "xx=nope.npy"], capsys)  # the name is checked before the file is read
    assert "the library has no input 'xx' (did you mean 'x'?); its inputs: x (float32[4, 8])" in err
    assert "No such file or directory: 'nope.npy'" in _fails(["run", lib, "-i", "x=nope.npy"], capsys)
    assert "is not a numpy .npy or .npz file" in _fails(["run", lib, "-i", f"x={files['model']}"], capsys)
    assert "expected NAME=FILE.npy or FILE.npz" in _fails(["run", lib, "-i", str(files["x"])], capsys)


def test_corrupt_and_missing_library_files_are_clean_errors(files: dict[str, Path],
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    lib = _compile(files, capsys)
    data = bytearray(lib.read_bytes())
    data[-3] ^= 0xFF
    lib.write_bytes(bytes(data))
    assert "checksum mismatch" in _fails(["run", str(lib), "-i", f"x={files['x']}"], capsys)
    err = _fails(["run", str(files["model"]), "-i", f"x={files['x']}"], capsys)
    assert f"{str(files['model'])!r} is not a kiln library: `kiln run` runs what `kiln compile` writes. " in err
    assert f"or time the model with `kiln bench {files['model']}`" in err
    for command in (["bench", str(lib)], ["compile", str(lib), "-o", str(files["dir"] / "again.kiln")]):
        assert f"{str(lib)!r} is a compiled kiln library, not a model (ONNX or Relay text): run it with `kiln run " \
            f"{lib}`" in _fails(command, capsys)
    err = _fails(["run", str(files["dir"] / "none.kiln")], capsys)
    assert "cannot read the library: No such file or directory" in err


def test_bad_models_and_params_are_clean_errors(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    bad = files["dir"] / "bad.txt"
    bad.write_text(MODEL.replace("nn.relu", "nn.rellu"))
    err = _fails(["show", str(bad)], capsys)
    assert f"{bad}:4:3: unknown op 'nn.rellu' (did you mean 'nn.relu'" in err
    assert "^^^^^^^^" in err  # the caret under the fault
    assert "unknown op 'nn.rellu'" in _fails(["compile", str(bad), "-o", str(files["dir"] / "b.kiln")], capsys)
    mistyped = files["dir"] / "mistyped.txt"
    mistyped.write_text(MODEL.replace("%w: Tensor[(3, 8)", "%w: Tensor[(3, 9)"))
    assert "op nn.dense, argument weight" in _fails(["show", str(mistyped)], capsys)
    assert "cannot read the model: No such file or directory" in _fails(["show", "missing.txt"], capsys)
    out = str(files["dir"] / "m.kiln")
    np.savez(files["dir"] / "wrong.npz", w=np.zeros((3, 9), "float32"))
    err = _fails(["compile", str(files["model"]), "--params", str(files["dir"] / "wrong.npz"), "-o", out], capsys)
    assert "param 'w': expected Tensor[(3, 8), float32]" in err
    np.savez(files["dir"] / "extra.npz", v=np.zeros(3, "float32"))
    err = _fails(["compile", str(files["model"]), "--params", str(files["dir"] / "extra.npz"), "-o", out], capsys)
    assert "params ['v'] are not parameters of main" in err
    assert "must be an .npz archive" in _fails(["compile", str(files["model"]), "--params", str(files["x"]),
                                                 "-o", out], capsys)
    assert "cannot write the library" in _fails(["compile", str(files["model"]), "-o",
                                                 str(files["dir"] / "no" / "m.kiln")], capsys)


def test_progress_bar_animates_only_on_a_terminal() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    term = Terminal()
    bar = ProgressBar("compiling", term, width=10)
    for done in range(1, 4):
        bar(done, 3)
    bar.finish()
    assert term.getvalue().split("\r")[1:] == [
        "compiling [###.......] 1/3 kernels", "compiling [######....] 2/3 kernels",
        "compiling [##########] 3/3 kernels\n"]
    pipe = io.StringIO()
    quiet = ProgressBar("compiling", pipe)
    quiet(1, 3)
    quiet.finish()
    assert pipe.getvalue() == ""


def test_compile_and_run_as_a_process_print_no_bar_and_no_traceback(files: dict[str, Path]) -> None:
    lib = files["dir"] / "p.kiln"
    done = subprocess.run(
        [sys.executable, "-m", "kiln", "compile", str(files["model"]), "--params", str(files["params"]),
         "-o", str(lib)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stderr and done.stderr.startswith("kiln: compiled 1 kernel in")
    lib.write_bytes(lib.read_bytes()[:-10])
    done = subprocess.run([sys.executable, "-m", "kiln", "run", str(lib), "-i", f"x={files['x']}"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert done.stderr.startswith(f"kiln: error: kiln library {str(lib)!r}: truncated")
    assert "Traceback" not in done.stderr


def test_run_help_documents_the_output_files(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "output_0" in text and "OUT_0.npy" in text and "FILE.npz" in text


def test_bench_per_kernel_prints_the_kernels_by_time_after_the_times(files: dict[str, Path],
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", str(files["model"]), "--params", str(files["params"]), "--repeat", "2", "--no-onnxruntime"]
    assert main(args) == 0
    assert "per-kernel profile" not in capsys.readouterr().out
    assert main([*args, "--per-kernel"]) == 0
    out = capsys.readouterr().out
    times, profile = out.split("\nper-kernel profile: ")
    assert "kiln " in times and "(median of 2; min " in times and ", p90 " in times
    assert profile.startswith("1 kernel, 1 launch, median of 2 runs\n")
    (row,) = [line for line in profile.splitlines() if "nn.dense+nn.bias_add+nn.relu" in line]
    assert row.split()[1:2] == ["1"] and "100.0%" in row and "float32[4, 3]" in row
    assert "a whole run:" in profile


def test_a_model_with_dynamic_dims_compiles_once_and_runs_any_size(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    model, lib = tmp_path / "dyn.txt", tmp_path / "dyn.kiln"
    model.write_text("def @main(%x: Tensor[(n, 3), float32]) {\n  exp(%x)\n}\n")
    assert main(["compile", str(model), "-o", str(lib)]) == 0
    err = capsys.readouterr().err
    assert "(inputs: x float32[n, 3]; 1 output)" in err and "the dynamic dims stay symbolic (n)" in err
    for n in (2, 5):
        x, out = tmp_path / f"x{n}.npy", tmp_path / f"y{n}.npy"
        np.save(x, RNG.standard_normal((n, 3)).astype("float32"))
        assert main(["run", str(lib), "--input", f"x={x}", "--output", str(out)]) == 0
        np.testing.assert_allclose(np.load(out), np.exp(np.load(x)), rtol=1e-6)


def test_an_onnx_models_output_names_name_the_outputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["logits"]), helper.make_node("Softmax", ["logits"], ["probs"], axis=-1)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 5]) for n in ("logits", "probs")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "m.onnx")
    lib, x, out = tmp_path / "m.kiln", tmp_path / "x.npy", tmp_path / "out.npz"
    np.save(x, RNG.standard_normal((2, 5)).astype("float32"))
    assert main(["compile", str(tmp_path / "m.onnx"), "-o", str(lib)]) == 0
    assert main(["run", str(lib), "-i", f"x={x}"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("logits: float32[2, 5]") and "\nprobs: float32[2, 5]" in printed
    assert main(["run", str(lib), "-i", f"x={x}", "-o", str(out)]) == 0
    with np.load(out) as saved:
        assert sorted(saved.files) == ["logits", "probs"]
        np.testing.assert_allclose(saved["logits"], np.maximum(np.load(x), 0))
    err = _fails(["run", str(tmp_path / "m.onnx")], capsys)
    assert f"{str(tmp_path / 'm.onnx')!r} is an ONNX model: `kiln run` runs what `kiln compile` writes." in err


def test_compile_dumps_the_ir_of_every_pass_and_emits_the_kernels_code(files: dict[str, Path],
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    lib = _compile(files, capsys)  # the library cache now holds it: --emit must build afresh to have the text
    dump, out = files["dir"] / "ir", files["dir"] / "emitted.kiln"
    assert main(["compile", str(files["model"]), "--params", str(files["params"]), "-o", str(out),
                 "--dump-ir", str(dump), "--emit", "tir,ll,asm"]) == 0
    err = capsys.readouterr().err
    assert f"kiln: wrote {out.with_suffix('.s')} (the asm of the 1 kernels)" in err
    passes = sorted(p.name for p in dump.iterdir())
    assert passes[0] == "001_InferType.txt" and any(p.endswith("_FuseOps.txt") for p in passes)
    assert "nn.dense" in (dump / passes[0]).read_text()
    assert out.with_suffix(".tir").read_text().startswith("# kernel fused_0\n")
    assert "define" in out.with_suffix(".ll").read_text() and "kiln_fused_0:" in out.with_suffix(".s").read_text()
    assert runtime.load(lib).get_source("tir").startswith("# kernel fused_0")
    assert "--emit 'cuda': a llvm library's kernels have tir, ll, asm" in _fails(
        ["compile", str(files["model"]), "--params", str(files["params"]), "-o", str(out), "--emit", "cuda"], capsys)


def test_cache_info_and_clear(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("KILN_CACHE_DIR", str(cache))
    for name, size in [("ab/ab12.kobj", 3000), ("cd/cd34.kobj", 1000), ("libraries/ef56.kiln", 2**20)]:
        (cache / name).parent.mkdir(parents=True, exist_ok=True)
        (cache / name).write_bytes(b"\0" * size)
    (cache / "secret.key").write_bytes(b"not a cache entry")
    assert main(["cache"]) == 0
    info = capsys.readouterr().out.splitlines()
    assert info[0] == f"kiln cache: {cache} (on)"
    assert info[1].split()[:5] == ["kernels", "2", "files,", "0.0", "MiB"]
    assert info[2].split()[:5] == ["libraries", "1", "files,", "1.0", "MiB"]
    assert main(["cache", "clear"]) == 0
    assert capsys.readouterr().out == f"kiln cache: removed 3 files from {cache}\n"
    assert sorted(p.name for p in cache.rglob("*") if p.is_file()) == ["secret.key"]


def test_the_cache_folder_follows_xdg_and_keeps_the_most_recently_used(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from kiln.runtime import library_cache

    monkeypatch.delenv("KILN_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert library_cache.cache_directory() == tmp_path / "xdg" / "kiln"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")  # not absolute: ignored, as the XDG spec says
    assert library_cache.cache_directory() == Path.home() / ".cache" / "kiln"
    entries = []
    for i in range(5):
        f = tmp_path / f"{i}.kobj"
        f.write_bytes(b"x" * 100)
        os.utime(f, (1000 + i, 1000 + i))
        entries.append(f)
    library_cache.trim(entries, max_files=3, max_bytes=10_000)
    assert sorted(f.name for f in tmp_path.glob("*.kobj")) == ["2.kobj", "3.kobj", "4.kobj"]
    library_cache.trim(tmp_path.glob("*.kobj"), max_files=3, max_bytes=250)
    assert sorted(f.name for f in tmp_path.glob("*.kobj")) == ["3.kobj", "4.kobj"]


def test_show_draws_the_fused_graph_and_bench_writes_an_html_profile(files: dict[str, Path],
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    import xml.etree.ElementTree as ET

    svg, html = files["dir"] / "g.svg", files["dir"] / "p.html"
    assert main(["show", str(files["model"]), "--params", str(files["params"]), "--fusion", "--svg", str(svg)]) == 0
    assert f"wrote the fused graph (1 launches) to {svg}" in capsys.readouterr().out
    assert "nn.dense" in "".join(ET.parse(svg).getroot().itertext())
    assert main(["bench", str(files["model"]), "--params", str(files["params"]), "--repeat", "2",
                 "--no-onnxruntime", "--html", str(html)]) == 0
    assert f"wrote the per-kernel profile to {html}" in capsys.readouterr().out
    assert html.read_text().startswith("<!DOCTYPE html>") and "nn.dense+nn.bias_add+nn.relu" in html.read_text()
