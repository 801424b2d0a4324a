"""CUDA libraries on disk (kiln.runtime.cuda_library): export and load round trips, without NVRTC or a GPU;
launch tables with symbolic sizes; forged, damaged and foreign files; the CUBIN's arch against the GPU's."""

from __future__ import annotations

import os
import random
import struct
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import attrs
import cuda_standin
import numpy as np
import pytest
from cuda_standin import FAKE_CUPY, gpu, needs_gxx
from library_files import forge, split
from te_helpers import two_stages

import kiln
from kiln import relay, runtime, te, tir
from kiln.ir.transform import PassContext
from kiln.runtime import library
from kiln.runtime.cuda_module import CudaModule, eval_int
from kiln.runtime.library import Graph, Launch, Library, Slot
from kiln.target import Target
from kiln.testing import models

SM90 = "cuda -arch=sm_90"
RNG = np.random.default_rng(19)




C = RNG.standard_normal((2, 16)).astype("float32")
B = RNG.standard_normal(16).astype("float32")


def chain(target: str = SM90) -> Library:
    """x * C, + B, relu: three launches (FuseOps off) with intermediates between them."""
    x = relay.var("x", shape=(2, 16))
    with PassContext(opt_level=3, disabled_pass=["FuseOps"]):
        func = relay.Function([x], relay.nn.relu(relay.add(relay.multiply(x, relay.const(C)), relay.const(B))))
        return relay.build(func, target=target)


def chain_numpy(x: np.ndarray) -> np.ndarray:
    return np.maximum(x * C + B, 0)


@pytest.fixture()
def gpu_lib() -> Library:
    return chain()


@pytest.fixture()
def lib_file(tmp_path: Path, own_key: Path, gpu_lib: Library) -> Path:
    path = tmp_path / "m.kiln"
    gpu_lib.export(path)
    return path






def same_code(a: CudaModule, b: CudaModule) -> None:
    """`b` (loaded) launches what `a` (built) does: kernels, grids, blocks, arguments, workspaces, code."""
    assert (b.name, b.arch, b.cubin, b.get_source("cuda")) == (a.name, a.arch, a.cubin, a.get_source("cuda"))
    assert [(p.name, p.dtype, [str(d) for d in p.shape]) for p in b.func.params] == \
        [(p.name, p.dtype, [str(d) for d in p.shape]) for p in a.func.params]
    assert [(v.name, v.dtype) for v in b.code.size_vars] == [(v.name, v.dtype) for v in a.code.size_vars]
    assert (b.code.written, b.code.uses_float16) == (a.code.written, a.code.uses_float16)
    assert [(w.name, w.dtype, str(w.shape[0])) for w in b.code.workspaces] == \
        [(w.name, w.dtype, str(w.shape[0])) for w in a.code.workspaces]
    for ka, kb in zip(a.code.kernels, b.code.kernels, strict=True):
        assert (kb.name, kb.block, kb.shared_bytes, kb.args) == (ka.name, ka.block, ka.shared_bytes, ka.args)
        assert [[str(e) for e in axis] for axis in kb.grid] == [[str(e) for e in axis] for axis in ka.grid]


def test_export_then_load_gives_the_same_kernels(lib_file: Path, gpu_lib: Library) -> None:
    loaded = runtime.load(lib_file)
    assert str(loaded.target) == str(gpu_lib.target)
    assert loaded.graph.launches == gpu_lib.graph.launches and loaded.graph.slots == gpu_lib.graph.slots
    for a, b in zip(gpu_lib.kernels, loaded.kernels, strict=True):
        assert isinstance(b, CudaModule)
        same_code(a, b)
    with pytest.raises(ValueError, match="was loaded from a library, which holds its CUBIN and CUDA C, not PTX"):
        loaded.kernels[0].get_source("ptx")
    loaded.export(lib_file.parent / "again.kiln")  # a loaded library exports again, byte for byte
    assert (lib_file.parent / "again.kiln").read_bytes() == lib_file.read_bytes()


def test_loading_needs_neither_cupy_nor_nvrtc(lib_file: Path, own_key: Path) -> None:
    script = textwrap.dedent(f"""
        import sys
        sys.modules["cupy"] = None  # any import of cupy (and so of NVRTC) fails
        from kiln import runtime
        lib = runtime.load({str(lib_file)!r})
        print(len(lib.kernels), "extern" in lib.kernels[0].get_source("cuda"), lib.kernels[0].arch)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "KILN_SECRET_FILE": str(own_key)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["3", "True", "sm_90"]


@needs_gxx
def test_a_loaded_library_runs_as_the_built_one_through_the_host_stand_in(
        lib_file: Path, gpu_lib: Library, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    launches = cuda_standin.install(monkeypatch, tmp_path)
    x = RNG.standard_normal((2, 16)).astype("float32")
    want = chain_numpy(x)
    built = gpu_lib.create_executor()
    ex = runtime.load(lib_file).create_executor()
    for _ in range(2):  # the checked run, then the fast path
        np.testing.assert_allclose(ex(x=x).get(), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(built(x=x).get(), want, rtol=1e-4, atol=1e-5)
    assert [name for name, *_ in launches] == ["fused_0_kernel0", "fused_1_kernel0", "fused_2_kernel0"] * 3




def symbolic_library(size: int) -> Library:
    """A library of one module of two kernels over size var n (a workspace between them), run at `size`."""
    s, args = two_stages(te.var("n"))
    mod = kiln.build(s, args, target=SM90)
    slots = [Slot((size,), "float32", "input", "a"), Slot((size,), "float32", "input", "b"),
             Slot((size,), "float32", "output")]
    return Library(Graph(slots, [Launch(0, (0, 1), (2,))], [0, 1], [2], {}), [mod], Target(SM90))


def test_symbolic_grids_workspaces_and_size_dtypes_survive_export(tmp_path: Path, own_key: Path) -> None:
    lib = symbolic_library(100)
    lib.export(tmp_path / "s.kiln")
    built, loaded = lib.kernels[0], runtime.load(tmp_path / "s.kiln").kernels[0]
    same_code(built, loaded)
    assert loaded.code.size_vars[0].dtype == "int32" and loaded.code.workspaces
    for n in (0, 1, 31, 32, 33, 1000):
        for kb, kl in zip(built.code.kernels, loaded.code.kernels, strict=True):
            got = [[eval_int(e, {id(loaded.code.size_vars[0]): n}) for e in axis] for axis in kl.grid]
            assert got == [[eval_int(e, {id(built.code.size_vars[0]): n}) for e in axis] for axis in kb.grid]
    # the loaded module's size var is its parameters' dim (what a call binds the grid with)
    assert loaded.func.params[0].shape[0] is loaded.code.size_vars[0]


@needs_gxx
def test_a_loaded_symbolic_library_runs_through_the_host_stand_in(tmp_path: Path, own_key: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    launches = cuda_standin.install(monkeypatch, tmp_path)
    symbolic_library(100).export(tmp_path / "s.kiln")
    ex = runtime.load(tmp_path / "s.kiln").create_executor()
    a, b = np.arange(100, dtype="float32"), np.ones(100, "float32")
    for _ in range(2):  # the checked run, then the fast path with its own workspace
        np.testing.assert_array_equal(ex(a=a, b=b).get(), (a + b) * 2)
    assert [(name, grid) for name, grid, *_ in launches] == [("main_kernel0", (4, 1, 1)),
                                                             ("main_kernel1", (4, 1, 1))] * 2


def _kernel(path: str, value: Any) -> Callable[[dict[str, Any], list[bytes]], None]:
    """An edit setting `kernels.0.<path>` (dot-separated keys and list indices) to `value`."""
    def edit(header: dict[str, Any], blobs: list[bytes]) -> None:
        *keys, last = path.split(".")
        node: Any = header["kernels"][0]
        for k in keys:
            node = node[int(k)] if isinstance(node, list) else node[k]
        node[int(last) if isinstance(node, list) else last] = value
    return edit


def _blob(key: str, make: Callable[[bytes], bytes]) -> Callable[[dict[str, Any], list[bytes]], None]:
    """An edit replacing kernel 0's blob `key` with `make(old bytes)`."""
    def edit(header: dict[str, Any], blobs: list[bytes]) -> None:
        i = header["kernels"][0][key]
        blobs[i] = make(blobs[i])
    return edit


def _nested(depth: int) -> list[Any]:
    e: list[Any] = ["int", "int32", 1]
    for _ in range(depth):
        e = ["add", "int32", e, ["int", "int32", 0]]
    return e


def _both(*edits: Callable[[dict[str, Any], list[bytes]], None]) -> Callable[[dict[str, Any], list[bytes]], None]:
    def edit(header: dict[str, Any], blobs: list[bytes]) -> None:
        for e in edits:
            e(header, blobs)
    return edit


def _target(value: str) -> Callable[[dict[str, Any], list[bytes]], None]:
    def edit(header: dict[str, Any], blobs: list[bytes]) -> None:
        header["target"] = value
    return edit


X86_OBJECT = b"\x7fELF\x02\x01\x01" + bytes(9) + struct.pack("<HH", 1, 62) + bytes(44)

FORGERIES: dict[str, tuple[Callable[[dict[str, Any], list[bytes]], None], str]] = {
    "one argument fewer": (_kernel("specs.0.args", [["param", 0], ["param", 1]]),
                           r"kernel 'fused_0_kernel0': the header passes it 2 arguments of 8 bytes, but its code "
                           r"in the CUBIN takes 3 of \[8, 8, 8\] bytes"),
    "a kernel the CUBIN lacks": (_kernel("specs.0.name", "system"),
                                 "the CUBIN of kernel 'fused_0' defines no kernel 'system'"),
    "a name that is no C name": (_kernel("specs.0.name", "k(); system"),
                                 r"specs\[0\].name: 'k\(\); system' is not a C"),
    "code in a grid": (_kernel("specs.0.grid.0", ["__import__('os').system('x')"]),
                       r"specs\[0\].grid\[0\]\[0\]: expected list, got str"),
    "an unknown operator": (_kernel("specs.0.grid.0", [["pow", "int32", ["int", "int32", 2], ["int", "int32", 2]]]),
                            r"grid\[0\]\[0\]: .* is not an expression"),
    "a float in a grid": (_kernel("specs.0.grid.0", [["int", "float32", 1]]),
                          r"grid\[0\]\[0\]\[1\]: 'float32' is not an integer dtype"),
    "a huge constant": (_kernel("specs.0.grid.0", [["int", "int64", 2**70]]), r"grid\[0\]\[0\]\[2\]: .* outside int64"),
    "a size var the kernel lacks": (_kernel("specs.0.grid.0", [["var", 0]]),
                                    r"grid\[0\]\[0\]\[1\]: size var index 0 out of range \(there are 0\)"),
    "a deep expression": (_kernel("specs.0.grid.0", [_nested(40)]), "an expression nested more than 32 deep"),
    "two grid axes": (_kernel("specs.0.grid", [[], []]), r"specs\[0\].grid: expected 3 axes, got 2"),
    "a block too large": (_kernel("specs.0.block", [2048, 1, 1]), r"specs\[0\].block: \[2048, 1, 1\] is not a CUDA"),
    "too many threads": (_kernel("specs.0.block", [64, 64, 1]), r"\[64, 64, 1\] is not a CUDA block"),
    "an empty block": (_kernel("specs.0.block", [0, 1, 1]), "is not a CUDA block"),
    "shared memory": (_kernel("specs.0.shared_bytes", 1 << 30), r"shared_bytes: 1073741824 bytes of shared memory"),
    "a pointer kind": (_kernel("specs.0.args.0", ["pointer", 0]), r"args\[0\]: expected \[kind, index\]"),
    "a parameter out of range": (_kernel("specs.0.args.0", ["param", 9]),
                                 r"args\[0\]\[1\]: param index 9 out of range \(there are 3\)"),
    "a workspace the kernel lacks": (_kernel("specs.0.args.0", ["workspace", 0]), "workspace index 0 out of range"),
    "no kernels": (_kernel("specs", []), "expected one or more kernels"),
    "a kernel twice": (lambda h, b: h["kernels"][0]["specs"].append(h["kernels"][0]["specs"][0]),
                       "expected one or more kernels of distinct names"),
    "written twice": (_kernel("written", [2, 2]), r"written: a parameter is listed twice"),
    "written out of range": (_kernel("written", [3]), r"written\[0\]: parameter index 3 out of range"),
    "a size var no dim uses": (_kernel("size_vars", [["n", "int32"]]), r"sizes \['n'\], but the parameters' symbolic"),
    "a workspace of code": (_kernel("workspaces", [["w", "float32", "1; rm"]]), r"workspaces\[0\]\[2\]: expected list"),
    "float16 as text": (_kernel("float16", "no"), r"float16: expected bool, got str"),
    "an arch of another target": (_kernel("arch", "sm_80"), r"arch: sm_80, but the library's target is cuda"),
    "an arch of nonsense": (_kernel("arch", "compute_90"), r"'compute_90' is not an architecture"),
    "a CUBIN of another arch": (_both(_target("cuda -arch=sm_80"), _kernel("arch", "sm_80")),
                                "the CUBIN of kernel 'fused_0' is for sm_90, but the header says sm_80"),
    "CPU object code": (_blob("cubin", lambda b: X86_OBJECT), "ELF machine 62, not CUDA"),
    "no CUBIN": (_blob("cubin", lambda b: b""), "the CUBIN of kernel 'fused_0': not an ELF file"),
    "a truncated CUBIN": (_blob("cubin", lambda b: b[:300]), "the CUBIN of kernel 'fused_0': section table"),
    "a source that is not text": (_blob("source", lambda b: b"\xff\xfe"), r"source: not UTF-8 text"),
    "a missing field": (lambda h, b: h["kernels"][0].pop("specs"), r"kernels\[0\]: expected keys"),
    "an object instead of a CUBIN": (lambda h, b: h["kernels"][0].update(object=h["kernels"][0].pop("cubin")),
                                     r"kernels\[0\]: expected keys"),
}


@pytest.mark.parametrize("case", list(FORGERIES))
def test_forged_cuda_headers_are_refused_even_when_trusted(lib_file: Path, case: str) -> None:
    edit, message = FORGERIES[case]
    header, blobs = split(lib_file)
    edit(header, blobs)
    bad = forge(lib_file, header, blobs, lib_file.parent / "forged.kiln")
    with pytest.raises(runtime.LibraryFormatError, match=message):
        runtime.load(bad, trust=True)
    with pytest.raises(runtime.LibraryTrustError):  # and without trust, the tag alone refuses it
        runtime.load(bad)


def test_damaged_cuda_libraries_give_kiln_errors_and_nothing_else(lib_file: Path) -> None:
    data = lib_file.read_bytes()
    header, blobs = split(lib_file)
    cubin = header["kernels"][0]["cubin"]
    rng = random.Random(3)
    for n in range(300):
        if n % 2:  # the whole file, cut or flipped (its checksum recomputed or not)
            damaged = bytearray(data[: rng.randrange(len(data))] if n % 3 == 0 else data)
            for _ in range(rng.randrange(0, 4)):
                damaged[rng.randrange(len(damaged))] ^= 1 << rng.randrange(8)
            path = lib_file.parent / "damaged.kiln"
            path.write_bytes(bytes(damaged))
        else:  # a CUBIN damaged inside a well-formed file
            mutated = list(blobs)
            code = bytearray(blobs[cubin])
            for _ in range(rng.randrange(1, 6)):
                code[rng.randrange(2048)] = rng.randrange(256)
            mutated[cubin] = bytes(code)
            path = forge(lib_file, header, mutated, lib_file.parent / "damaged.kiln")
        try:
            runtime.load(path, trust=True)
        except kiln.KilnError as e:
            assert isinstance(e, runtime.LibraryFormatError), repr(e)


def test_export_refuses_launch_expressions_it_cannot_write(tmp_path: Path, own_key: Path, gpu_lib: Library) -> None:
    m = gpu_lib.kernels[0]
    spec = attrs.evolve(m.code.kernels[0], grid=((tir.FloatImm("float32", 1.0),), (), ()))
    odd = CudaModule(m.func, m.target, attrs.evolve(m.code, kernels=(spec,)), m.cubin, m.arch)
    lib = Library(gpu_lib.graph, [odd, *gpu_lib.kernels[1:]], gpu_lib.target)
    with pytest.raises(runtime.ExecutorError, match="cannot export the grid of kernel 'fused_0_kernel0': 1.0"):
        lib.export(tmp_path / "odd.kiln")


def test_a_library_for_another_gpu_architecture_is_refused_naming_both(
        lib_file: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cuda_standin.install(monkeypatch, tmp_path)
    runtime.load(lib_file)  # the stand-in's device is sm_90
    for cc in ("80", "89", "100"):
        monkeypatch.setattr(FAKE_CUPY.cuda, "Device", lambda cc=cc: SimpleNamespace(id=0, compute_capability=cc))
        with pytest.raises(runtime.LibraryFormatError,
                           match=f"kiln library '{lib_file}': kernel 'fused_0' was compiled for sm_90, but the current "
                                 f"GPU \\(device 0\\) is sm_{cc}, which cannot run it"):
            runtime.load(lib_file)
    monkeypatch.setattr(FAKE_CUPY.cuda, "Device", lambda: SimpleNamespace(id=0, compute_capability="86"))
    chain("cuda -arch=sm_80").export(tmp_path / "sm80.kiln")
    assert runtime.load(tmp_path / "sm80.kiln").kernels[0].arch == "sm_80"  # sm_80 code runs on sm_86


def test_an_exported_cuda_library_is_a_library_file(lib_file: Path) -> None:
    header, _ = split(lib_file)
    assert set(header) == library._HEADER_KEYS and header["target"].startswith("cuda")
    entry = header["kernels"][0]
    assert entry["arch"] == "sm_90" and entry["specs"][0]["name"] == "fused_0_kernel0"


# -- on a GPU ------------------------------------------------------------------------------------------


@pytest.mark.gpu
@gpu
def test_gpu_exported_libraries_load_and_run(tmp_path: Path, own_key: Path) -> None:
    import cupy

    x = RNG.standard_normal((2, 16)).astype("float32")
    chain("cuda").export(tmp_path / "chain.kiln")  # the GPU's own arch
    func, params = models.mlp(batch=2, sizes=(16, 8, 4))
    relay.build(func, target="cuda", params=params).export(tmp_path / "mlp.kiln")
    for name, want in (("chain", chain_numpy(x)), ("mlp", models.mlp_numpy(x, params))):
        ex = runtime.load(tmp_path / f"{name}.kiln").create_executor()
        for _ in range(2):
            out = ex(x=x)
            assert isinstance(out, cupy.ndarray)
            np.testing.assert_allclose(out.get(), want, rtol=1e-4, atol=1e-5)
