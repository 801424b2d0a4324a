"""The examples the README and docs/architecture.md show run as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_a_custom_op_in_one_file_of_40_lines_builds_runs_and_makes_cuda_c(tmp_path: Path) -> None:
    example = ROOT / "examples" / "custom_op.py"
    assert len(example.read_text().splitlines()) <= 40
    done = subprocess.run([sys.executable, str(example)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "KILN_CACHE_DIR": str(tmp_path)}, check=False)
    assert done.returncode == 0, done.stderr[-3000:]  # the CPU result matched numpy (its assert)
    source = done.stdout
    assert 'extern "C" __global__' in source and "blockIdx.x" in source and "threadIdx.x" in source
    assert "kiln_max<float>(p0[" in source and "* 3.0f" in source  # the relu fused into the op's kernel


def test_the_readme_and_the_docs_show_the_example_as_it_is() -> None:
    example = (ROOT / "examples" / "custom_op.py").read_text()
    body = example.split("\n", 1)[1]  # shown without its docstring line
    assert body.strip() in (ROOT / "docs" / "architecture.md").read_text()
    assert body.strip() in (ROOT / "README.md").read_text()


_README = (ROOT / "README.md").read_text()
_BLOCKS = re.findall(r"```(python|sh)\n(.*?)```", _README, re.S)  # (blocks without a language are output)
_EXAMPLE = (ROOT / "examples" / "custom_op.py").read_text().split("\n", 1)[1].strip()
# make demo / make test: CI itself runs them; the custom op: the example file above, run by its own test
_RUN = [(lang, body) for lang, body in _BLOCKS if not body.lstrip().startswith("make ") and body.strip() != _EXAMPLE]


def test_the_readme_blocks_that_are_not_run_here_are_the_set_up_and_the_example() -> None:
    assert len(_BLOCKS) - len(_RUN) == 2 and len(_RUN) >= 6


@pytest.mark.parametrize("index", range(len(_RUN)))
def test_every_readme_code_block_runs_as_written(index: int, tmp_path: Path) -> None:
    lang, body = _RUN[index]
    env = {**os.environ, "KILN_CACHE_DIR": str(tmp_path / "cache"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}  # kiln, python
    command = [sys.executable, "-c", body] if lang == "python" else ["bash", "-e", "-o", "pipefail", "-c", body]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env, check=False)
    assert done.returncode == 0, f"README block {index} ({lang}):\n{body}\n--- stderr:\n{done.stderr[-3000:]}"
