"""The examples the README and docs/architecture.md show run as written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
