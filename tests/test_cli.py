"""The `kiln` command line and the registry export behind `kiln ops`."""

from __future__ import annotations

import json
import subprocess
import sys

import attrs
import pytest

from kiln import registry
from kiln.cli import main
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
    register_op("test.pad").set_attr(attr.TOpPattern, OpPattern.OPAQUE, plevel=20)  # a second registration
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


def test_demo_runs_and_leaves_the_registry_as_it_was(capsys: pytest.CaptureFixture[str]) -> None:
    before = registry.Op.list_names()
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "parses back equal: True" in out
    assert "set twice at plevel 20" in out
    assert "after the rollback, 'demo.half' registered: False" in out
    assert "/* ty=Tensor[(n, 10), float32] */" in out
    assert "parse(str(mod)) is structurally equal to mod: True" in out
    assert "op nn.dense, argument weight" in out and "--> kiln/demo.py:" in out
    assert registry.Op.list_names() == before


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
