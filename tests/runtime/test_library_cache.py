"""relay.build's library cache: a second build of the same model loads the stored library; anything
that changes the build misses; altered, renamed or foreign entries are refused; code registered outside
kiln turns it off. Each scenario runs in a fresh process (tests here register ops, which turns it off)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# what both scripts start with: count the kernels a build compiles (none when it loads from the cache)
_COUNTING = textwrap.dedent("""
    import hashlib, json, sys
    import numpy as np
    from kiln import relay, registry
    from kiln.relay.backend import build_module, te_compiler
    from kiln.runtime import library_cache

    compiled = []
    original = te_compiler.compile_primitive
    def counting(*a, **k):
        compiled.append(1)
        return original(*a, **k)
    te_compiler.compile_primitive = build_module.compile_primitive = counting
""")

_SCRIPT = _COUNTING + textwrap.dedent("""
    scale = float(sys.argv[1])
    if sys.argv[2] == "register":
        registry.register_op("test.user_op").describe("user code registers something")
    x = relay.var("x", shape=(4, 8))
    w = relay.const(np.full((16, 8), scale, np.float32))
    f = relay.Function([x], relay.nn.relu(relay.nn.dense(x, w)))
    lib = relay.build(f)
    out = lib.create_executor()(x=np.ones((4, 8), np.float32))
    key = build_module.library_key(f, None, lib.target)
    print(json.dumps({"compiled": len(compiled), "out": float(np.asarray(out)[0, 0]), "key": key,
                      "from_cache": lib.cache_key is not None}))
""")


def _run(tmp_path: Path, script: str, *args: str) -> dict[str, object]:
    """`script` run with `args` in a fresh process on the cache in `tmp_path`; the JSON it prints last."""
    env = {**os.environ, "KILN_CACHE_DIR": str(tmp_path / "cache"), "KILN_CACHE": "1"}
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _build(tmp_path: Path, scale: float = 1.0, mode: str = "plain") -> dict[str, object]:
    return _run(tmp_path, _SCRIPT, str(scale), mode)


def _entries(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "cache" / "libraries").glob("*.kiln"))


def test_a_second_build_loads_the_stored_library_and_a_change_misses(tmp_path: Path) -> None:
    first = _build(tmp_path)
    assert first["compiled"] and not first["from_cache"] and first["out"] == 8.0
    second = _build(tmp_path)
    assert second == {**first, "compiled": 0, "from_cache": True}  # no kernel compiled, same numbers
    other = _build(tmp_path, scale=2.0)  # another constant: another key
    assert other["compiled"] and other["key"] != first["key"] and other["out"] == 16.0
    assert len(_entries(tmp_path)) == 2


@pytest.mark.parametrize("damage", ["flip", "truncate", "rename"])
def test_an_altered_or_renamed_entry_is_refused_deleted_and_rebuilt(tmp_path: Path, damage: str) -> None:
    first = _build(tmp_path)
    (entry,) = _entries(tmp_path)
    if damage == "rename":  # a valid library of another model, under this model's key
        _build(tmp_path, scale=3.0)
        other = next(p for p in _entries(tmp_path) if p != entry)
        os.replace(other, entry)
    else:
        data = bytearray(entry.read_bytes())
        entry.write_bytes(bytes(data[:-100]) if damage == "truncate" else bytes(data[:-50] + b"x" + data[-49:]))
    again = _build(tmp_path)
    assert again["compiled"] and not again["from_cache"] and again["out"] == first["out"]
    assert _build(tmp_path)["from_cache"]  # stored afresh


def test_a_registration_from_user_code_turns_the_cache_off(tmp_path: Path) -> None:
    assert _build(tmp_path, mode="register")["key"] is None
    assert _build(tmp_path, mode="register")["compiled"]
    assert not _entries(tmp_path)


_CUDA_SCRIPT = _COUNTING + textwrap.dedent("""
    x = relay.var("x", shape=(4, 8))
    w = relay.const(np.full((16, 8), 1.0, np.float32))
    f = relay.Function([x], relay.nn.relu(relay.nn.dense(x, w)))
    lib = relay.build(f, target=sys.argv[1])
    print(json.dumps({"compiled": len(compiled), "from_cache": lib.cache_key is not None,
                      "kernels": [type(k).__name__ for k in lib.kernels],
                      "cubins": [hashlib.sha256(k.cubin).hexdigest() for k in lib.kernels]}))
""")


def _build_cuda(tmp_path: Path, target: str) -> dict[str, object]:
    return _run(tmp_path, _CUDA_SCRIPT, target)


def test_cuda_libraries_are_stored_and_loaded_per_architecture(tmp_path: Path) -> None:
    first = _build_cuda(tmp_path, "cuda -arch=sm_90")
    assert first["compiled"] and not first["from_cache"] and first["kernels"] == ["CudaModule"]
    second = _build_cuda(tmp_path, "cuda -arch=sm_90")
    assert second == {**first, "compiled": 0, "from_cache": True}  # the same CUBINs, nothing compiled
    other = _build_cuda(tmp_path, "cuda -arch=sm_80")  # another arch: another key
    assert other["compiled"] and not other["from_cache"] and other["cubins"] != first["cubins"]
    assert len(_entries(tmp_path)) == 2
