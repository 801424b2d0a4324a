"""Native memory: compiling and dropping many kernels does not grow the process, and the compiler child."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln import tir
from kiln.codegen import jit, llvm_process
from kiln.codegen.llvm import emit_llvm_ir
from kiln.target import Target

# Compiles and drops 300 distinct kernels after a warm-up, half through the kernel cache and
# half with KILN_CACHE=0, and prints the growth of the resident set. The bound is
# 20 MB over 1,000 kernels; before kernels were compiled in a child, each left about 80 KB
# behind (24 MB here). About 10 s on an idle machine.
_CHILD = textwrap.dedent("""
    import gc, os, sys
    import numpy as np
    import kiln
    from kiln import tir
    from kiln.codegen import jit

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def kernel(k):
        n = tir.Var("n")
        a, b = tir.buffer("A", (n,), "float32"), tir.buffer("B", (n,), "float32")
        i = tir.Var("i")
        value = a.load(i) * tir.FloatImm("float32", k + 0.5)
        return tir.PrimFunc(f"k{k}", [a, b], tir.for_range(i, n, tir.BufferStore(b, value, (i,))))

    x, y = np.ones(16, np.float32), np.zeros(16, np.float32)
    def run(first, count):
        for k in range(first, first + count):
            m = kiln.build(kernel(k))
            m(x, y)
            assert y[0] == k + 0.5, (k, y[0])
            del m

    run(0, 80)  # warm-up: imports, LLVM's tables, the caches filling to their bounds
    gc.collect()
    before = rss()
    run(1000, 150)
    os.environ["KILN_CACHE"] = "0"
    run(2000, 150)
    gc.collect()
    print(rss() - before, jit._COMPILER.started)
""")


def test_compiling_and_dropping_300_kernels_grows_rss_by_under_6_mb(tmp_path: Path) -> None:
    env = {**os.environ, "KILN_CACHE": "1", "KILN_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=600,
                          check=False, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    growth, children = map(int, done.stdout.split())
    assert growth < 6 * 2**20, f"RSS grew {growth / 2**10:.0f} KB over 300 kernels ({growth / 300 / 2**10:.1f} KB each)"
    assert children >= 2  # the compiler child was replaced on the way (every RECYCLE_AFTER kernels)


def _ir(value: float = 2.5) -> str:
    n = tir.Var("n")
    a, b = tir.buffer("A", (n,), "float32"), tir.buffer("B", (n,), "float32")
    i = tir.Var("i")
    body = tir.for_range(i, n, tir.BufferStore(b, a.load(i) * tir.FloatImm("float32", value), (i,)),
                         tir.ForKind.VECTORIZED)
    return emit_llvm_ir(tir.PrimFunc("scale", [a, b], body), Target("llvm"))


def test_the_child_and_this_process_emit_the_same_object_code(monkeypatch: pytest.MonkeyPatch) -> None:
    target = Target("llvm")
    in_child = jit.compile_ir(_ir(), target, "scale", sources=True)
    monkeypatch.setenv("KILN_LLVM_CHILD", "0")
    here = jit.compile_ir(_ir(), target, "scale", sources=True)
    assert in_child[0] == here[0] and in_child[1] == here[1]
    assert in_child[2]["asm"] == here[2]["asm"] and "vmulps" in here[2]["asm"]


def test_llvm_ending_the_child_is_a_codegen_error_and_the_next_kernel_compiles() -> None:
    compiler = llvm_process.Compiler()
    try:
        # A 32-bit CPU on a 64-bit triple: LLVM aborts ("64-bit code requested ..."). kiln's target
        # check refuses it before it gets here; the child is the second line of defence.
        text = "define float @f(float %x) {\n  %y = fadd float %x, 1.0\n  ret float %y\n}\n"
        request = {"text": text, "triple": Target("llvm")["mtriple"], "cpu": "i686", "features": "",
                   "level": 3, "sources": False}
        kind, said = compiler.compile(request)
        assert kind == "died" and "64-bit code requested" in said
        kind, result = compiler.compile({**request, "cpu": "x86-64"})
        assert kind == "ok" and result["obj"][:4] == b"\x7fELF"
        assert compiler.started == 2
    finally:
        compiler.close()


def test_ir_llvm_rejects_is_a_codegen_error_naming_the_kernel() -> None:
    with pytest.raises(jit.CodegenError, match=r"(?s)LLVM rejected the generated IR of kernel 'bad': .*\n   1  define"):
        jit.compile_ir("define void @f() {\n  ret i32 0\n}\n", Target("llvm"), "bad")


def test_the_child_is_replaced_after_recycle_after_kernels_and_results_stay_right(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_CACHE", "0")
    compiler = llvm_process.Compiler(recycle_after=3)
    monkeypatch.setattr(jit, "_COMPILER", compiler)
    try:
        x = np.arange(8, dtype=np.float32)
        for k in range(7):
            n = tir.Var("n")
            a, b = tir.buffer("A", (n,), "float32"), tir.buffer("B", (n,), "float32")
            i = tir.Var("i")
            body = tir.for_range(i, n, tir.BufferStore(b, a.load(i) + tir.FloatImm("float32", k), (i,)))
            out = np.zeros_like(x)
            kiln.build(tir.PrimFunc(f"add{k}", [a, b], body))(x, out)
            np.testing.assert_array_equal(out, x + k)
        assert compiler.started == 3  # kernels 1-3, 4-6, 7
    finally:
        compiler.close()


def test_without_a_working_child_kernels_compile_in_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_CACHE", "0")
    compiler = llvm_process.Compiler()
    monkeypatch.setattr(jit, "_COMPILER", compiler)
    monkeypatch.setattr(llvm_process.sys, "executable", "/bin/false")  # an embedded interpreter, say
    try:
        x = np.arange(8, dtype=np.float32)
        for k in range(2):
            n = tir.Var("n")
            a, b = tir.buffer("A", (n,), "float32"), tir.buffer("B", (n,), "float32")
            i = tir.Var("i")
            body = tir.for_range(i, n, tir.BufferStore(b, a.load(i) * tir.FloatImm("float32", k + 2.0), (i,)))
            out = np.zeros_like(x)
            kiln.build(tir.PrimFunc(f"mul{k}", [a, b], body))(x, out)
            np.testing.assert_array_equal(out, x * (k + 2))
        assert compiler.started == 1  # tried once, then not again
        assert compiler.compile({})[0] == "unavailable"
    finally:
        compiler.close()
