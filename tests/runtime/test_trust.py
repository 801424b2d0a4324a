"""The trust model (SECURITY.md): the per-user secret, authenticated libraries and cache entries,
header validation against the kernels' own signatures, the object-code symbol allow-list, folder rules.

Each attack is built for real: a file edited with its sha256 recomputed, object code that calls
`system`, a planted cache entry; each must be refused with kiln's error and its code never run.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import stat
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import llvmlite.binding as llvm
import numpy as np
import pytest
from library_files import edited, forge, split

import kiln
from kiln import relay, runtime, tir
from kiln.cli import main as cli_main
from kiln.codegen import cache
from kiln.runtime import library, linker, objfile, trust
from kiln.target import Target, detect
from kiln.testing import models

RNG = np.random.default_rng(13)




@pytest.fixture(scope="module")
def mlp() -> tuple[Any, dict[str, np.ndarray], np.ndarray, np.ndarray]:
    func, params = models.mlp(batch=4, sizes=(32, 16, 8))
    x = RNG.standard_normal((4, 32)).astype("float32")
    return func, params, x, models.mlp_numpy(x, params)


@pytest.fixture()
def lib_file(tmp_path: Path, own_key: Path, mlp: Any) -> Path:
    path = tmp_path / "m.kiln"
    relay.build(mlp[0], params=mlp[1]).export(path)
    return path








def object_code(ir_text: str) -> bytes:
    """Object code for the host from LLVM IR text: what an attacker compiles."""
    linker.initialize()
    mod = llvm.parse_assembly(ir_text)
    tm = linker.create_target_machine(Target("llvm"))
    mod.triple = tm.triple
    return bytes(tm.emit_object(mod))


def ir_string(name: str, text: bytes) -> str:
    escaped = "".join(f"\\{b:02X}" for b in text)
    return f'@{name} = constant [{len(text)} x i8] c"{escaped}"\n'


def evil_kernel(name: str, signature: bytes, marker: Path, callee: str = "system") -> bytes:
    """A kernel `name` with kiln's signature symbol that runs `touch marker` through `callee`."""
    cmd = f"touch {marker}".encode() + b"\0"
    return object_code(
        ir_string(".cmd", cmd) + ir_string(linker.signature_symbol(name), signature)
        + f"declare i32 @{callee}(ptr)\n"
        + f"define i32 @{linker.kernel_symbol(name)}(ptr %a, ptr %b, ptr %c, ptr %d) {{\n"
        + f"  %r = call i32 @{callee}(ptr @.cmd)\n  ret i32 0\n}}\n")


# -- the secret key ------------------------------------------------------------------------


def test_key_file_is_created_private_and_signs(own_key: Path) -> None:
    tag = trust.sign(b"data")
    assert stat.S_IMODE(own_key.stat().st_mode) == 0o600
    assert stat.S_IMODE(own_key.parent.stat().st_mode) == 0o700
    assert len(own_key.read_bytes()) == 32 and len(tag) == 32
    assert trust.verify(b"data", tag) and not trust.verify(b"datA", tag) and not trust.verify(b"data", tag[:-1])


@pytest.mark.parametrize("mode", [0o644, 0o604, 0o620, 0o660])
def test_key_file_readable_or_writable_by_others_is_refused(own_key: Path, mode: int) -> None:
    trust.sign(b"x")
    own_key.chmod(mode)
    with pytest.raises(trust.TrustSetupError, match=rf"kiln secret key file '{own_key}' has mode 0{mode:o}, "
                                                    r"which lets other users read or write it.*chmod 600"):
        trust.sign(b"x")


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="chown to another user needs root")
def test_key_file_of_another_user_is_refused(own_key: Path) -> None:
    trust.sign(b"x")
    os.chown(own_key, 4242, -1)
    with pytest.raises(trust.TrustSetupError, match="is owned by user id 4242, not by you"):
        trust.sign(b"x")


def test_key_file_of_wrong_length_is_refused(own_key: Path) -> None:
    own_key.parent.mkdir(mode=0o700)
    own_key.write_bytes(b"short")
    own_key.chmod(0o600)
    with pytest.raises(trust.TrustSetupError, match="holds 5 bytes, not 32"):
        trust.sign(b"x")


def test_key_file_that_cannot_be_created_is_kilns_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("KILN_SECRET_FILE", str(tmp_path / "a-file" / "secret.key"))
    with pytest.raises(trust.TrustSetupError, match=r"cannot read or create kiln's secret key file .*KILN_CACHE=0"):
        trust.sign(b"x")


def _key_in_child(path: str, queue: Any) -> None:
    os.environ["KILN_SECRET_FILE"] = path
    queue.put(trust.secret())


def test_processes_racing_to_create_the_key_all_get_the_winners(tmp_path: Path) -> None:
    path = str(tmp_path / "race" / "secret.key")
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_key_in_child, args=(path, queue)) for _ in range(6)]
    for p in procs:
        p.start()
    keys = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(60)
    assert len(set(keys)) == 1 and keys[0] == Path(path).read_bytes()
    assert [f.name for f in Path(path).parent.iterdir()] == ["secret.key"]  # no temporary left behind


# -- libraries: authentication -----------------------------------------------------------------


def test_library_of_another_key_is_refused_and_runs_with_trust(lib_file: Path, mlp: Any,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    np.testing.assert_allclose(runtime.load(lib_file).create_executor()(mlp[2]), mlp[3], rtol=1e-4, atol=1e-5)
    monkeypatch.setenv("KILN_SECRET_FILE", str(lib_file.parent / "other-user" / "secret.key"))
    with pytest.raises(runtime.LibraryTrustError, match=r"not written by your kiln, or altered since: .*"
                                                        r"runtime.load\(path, trust=True\) \(kiln run --trust\)"):
        runtime.load(lib_file)
    lib = runtime.load(lib_file, trust=True)
    np.testing.assert_allclose(lib.create_executor()(mlp[2]), mlp[3], rtol=1e-4, atol=1e-5)
    lib.export(lib_file.parent / "resigned.kiln")  # re-signed under this key: loads without trust
    np.testing.assert_allclose(runtime.load(lib_file.parent / "resigned.kiln").create_executor()(mlp[2]), mlp[3],
                               rtol=1e-4, atol=1e-5)


def test_kiln_run_refuses_a_foreign_library_unless_trusted(lib_file: Path, mlp: Any, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    np.save(tmp_path / "x.npy", mlp[2])
    monkeypatch.setenv("KILN_SECRET_FILE", str(tmp_path / "other-user" / "secret.key"))
    assert cli_main(["run", str(lib_file), "-i", f"x={tmp_path / 'x.npy'}"]) == 2
    assert "not written by your kiln" in capsys.readouterr().err
    assert cli_main(["run", str(lib_file), "-i", f"x={tmp_path / 'x.npy'}", "-o", str(tmp_path / "y.npy")]) == 2
    assert cli_main(["run", str(lib_file), "--trust", "-i", f"x={tmp_path / 'x.npy'}",
                     "-o", str(tmp_path / "y.npy")]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), mlp[3], rtol=1e-4, atol=1e-5)


def test_old_format_files_get_a_clear_error(lib_file: Path) -> None:
    old = lib_file.parent / "old.kiln"
    old.write_bytes(b"KILNLIB1" + lib_file.read_bytes()[8:])
    with pytest.raises(runtime.LibraryFormatError, match="written by an older kiln .format 1, without "
                                                         "authentication.; compile the model again"):
        runtime.load(old)


def _shrink_output(header: dict[str, Any], blobs: list[bytes]) -> None:
    """The attack of issue 13: the output slot and its kernel's parameter shrunk to one element."""
    out = header["outputs"][0]
    header["slots"][out]["shape"] = [1, 1]
    header["kernels"][1]["params"][-1]["shape"] = [1, 1]


def test_header_edited_with_checksum_recomputed_is_refused(lib_file: Path) -> None:
    bad = edited(lib_file, _shrink_output)
    with pytest.raises(runtime.LibraryTrustError, match="not written by your kiln"):
        runtime.load(bad)
    # trusted or not, the header must agree with the signature compiled into the kernel
    with pytest.raises(runtime.LibraryFormatError,
                       match=r"kernel 'fused_1': the header gives its parameters as '.*bias_add:float32\[1,1\]', "
                             r"but its object code was compiled for '.*bias_add:float32\[4,8\]'"):
        runtime.load(bad, trust=True)


def test_kernel_replaced_by_code_calling_system_is_never_run(lib_file: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    header, blobs = split(lib_file)
    sig = objfile.ObjectFile(blobs[0]).data_of(linker.signature_symbol("fused_0"))
    assert sig is not None
    blobs[header["kernels"][0]["object"]] = evil_kernel("fused_0", sig, marker)
    bad = forge(lib_file, header, blobs, tmp_path / "evil.kiln")
    with pytest.raises(runtime.LibraryTrustError):
        runtime.load(bad)
    with pytest.raises(runtime.LibraryFormatError,
                       match="kernel 'fused_0': its object code calls 'system', which kiln's code generator never "
                             "calls; the code was not made by kiln and is not linked"):
        runtime.load(bad, trust=True)
    assert not marker.exists()


def test_the_allow_list_holds_for_every_engine_whatever_symbols_are_claimed(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    obj = evil_kernel("k", b"", marker)
    with pytest.raises(linker.DisallowedSymbolError, match="kernel 'k': its object code calls 'system'"):
        linker.Engine(obj, Target("llvm"), ["exp"], "k")  # the stored symbol list is not believed
    # an allowed name that does not resolve (LLVM's float16 libcall on CPUs without F16C) is
    # kiln's error before linking, never a call to address 0
    if not llvm.address_of_symbol("__truncdfhf2"):
        with pytest.raises(linker.UnresolvedSymbolError, match="kernel 'k' calls symbol.s. that no loaded library "
                                                            "defines: __truncdfhf2"):
            linker.Engine(evil_kernel("k", b"", marker, "__truncdfhf2"), Target("llvm"), [], "k")
    assert not marker.exists()


# -- libraries: structure, checked even with trust=True ------------------------------------------


def _set(path: str, value: Any) -> Callable[[dict[str, Any], list[bytes]], None]:
    def edit(header: dict[str, Any], blobs: list[bytes]) -> None:
        *keys, last = path.split(".")
        node: Any = header
        for k in keys:
            node = node[int(k)] if isinstance(node, list) else node[k]
        node[int(last) if isinstance(node, list) else last] = value
    return edit


@pytest.mark.parametrize(("edit", "message"), [
    (_set("launches.1.kernel", 7), r"header field launches\[1\].kernel: kernel index 7 out of range \(there are 2\)"),
    (_set("launches.0.inputs", [0, 2, 99]), r"launches\[0\].inputs\[2\]: slot index 99 out of range"),
    (_set("launches.0.inputs", [0, 2]), r"launches\[0\]: 3 slots for a kernel of 4 parameters"),
    (_set("launches.0.inputs", [0, 3, 2]), r"launches\[0\]: slot 3 for parameter 'const1': shape \[16\], "
                                           r"the kernel takes \[16, 32\]"),
    (_set("launches.0.outputs", [2]), r"launches\[0\]: slot 2 for parameter 'relu': shape \[16, 32\]"),
    (_set("slots.0.dtype", "float64"), r"slot 0 for parameter 'p0': dtype float64, the kernel takes float32"),
    (_set("slots.4.shape", [1, 1]), r"launches\[1\]: slot 4 for parameter 'bias_add': shape \[1, 1\]"),
    (_set("slots.0.shape", [-4, 32]), r"slots\[0\].shape\[0\]: negative size -4"),
    (_set("storage_sizes", [-256]), r"storage_sizes\[0\]: negative size -256"),
    (_set("storage_sizes", [4]), r"slots\[1\]: needs 256 bytes, but its storage buffer 0 has 4"),
    (_set("slots.1.storage", 3), r"slots\[1\].storage: storage buffer index 3 out of range"),
    (_set("slots.1.kind", "heap"), r"slots\[1\].kind: expected one of"),
    (_set("slots.1.shape", "4x16"), r"slots\[1\].shape: expected list, got str"),
    (_set("launches.0.kernel", True), r"launches\[0\].kernel: expected int, got bool"),
    (_set("kernels.0.params.3.dtype", "float128"), r"kernels\[0\].params\[3\].dtype: unknown dtype"),
    (_set("kernels.0.name", "fused_0; rm"), r"kernels\[0\].name: 'fused_0; rm' is not a name"),
    (_set("kernels.0.object", 9), r"kernels\[0\].object: blob index 9 out of range"),
    (_set("outputs", [12]), r"outputs\[0\]: slot index 12 out of range"),
    (_set("inputs", []), r"inputs: must list every input slot once"),
    (_set("constants.2", 3), r"constants\['2'\]: array float32\(16,\), its slot is float32\(16, 32\)"),
    (_set("constants", {"2": 2, "3": 3, "5": 4}), r"constants: every const slot needs its array"),
    (_set("constants.0", 2), r"constants\['0'\]: not the index of a const slot"),
    (_set("target", "llvm -mcpu="), r"header field target"),
    # a CPU library's kernels relabelled for a GPU: they are not CUDA kernels (no CUBIN, no launch table)
    (_set("target", "cuda -arch=sm_90"), r"kernels\[0\]: expected keys \['arch', 'cubin', 'float16', 'name'"),
    (_set("launches.0", {"kernel": 0}), r"launches\[0\]: expected keys \['inputs', 'kernel', 'outputs'\]"),
    (_set("output_names", ["y", "y", "z"]), r"output_names: expected 1 distinct names"),
    (_set("checks", [["s", "512"]]), r"checks\[0\]: expected \[small, large, what\]: two dims and a text"),
    (_set("checks", [["s +", "512", "a slice"]]), r"checks\[0\]\[0\]: expected a size or a symbolic dim"),
    (_set("checks", [["s", -512, "a slice"]]), r"checks\[0\]\[1\]: negative size -512"),
])
def test_inconsistent_headers_are_refused_even_when_trusted(lib_file: Path, edit: Any, message: str) -> None:
    bad = edited(lib_file, edit)
    with pytest.raises(runtime.LibraryFormatError, match=message):
        runtime.load(bad, trust=True)


def test_negative_and_inconsistent_blob_sizes_are_refused(lib_file: Path) -> None:
    header, blobs = split(lib_file)
    sizes = [len(b) for b in blobs]
    bad = forge(lib_file, header, blobs, lib_file.parent / "neg.kiln", [-sizes[1], *sizes[1:]])
    with pytest.raises(runtime.LibraryFormatError, match=r"header field blobs\[0\]: negative size"):
        runtime.load(bad, trust=True)
    bad = forge(lib_file, header, blobs, lib_file.parent / "long.kiln", [sizes[0] + 1, *sizes[1:]])
    with pytest.raises(runtime.LibraryFormatError, match="header field blobs: sizes add up to"):
        runtime.load(bad, trust=True)


@pytest.mark.parametrize(("blob", "message"), [
    (b"", "object code of kernel 'fused_0': 0 bytes, too short for an ELF header"),
    (b"\x00" * 4096, "object code of kernel 'fused_0': not an ELF object file"),
    ("truncated", "object code of kernel 'fused_0': section table .* is not within its 4000 bytes"),
    ("aarch64", "object code of kernel 'fused_0': code for aarch64, but this machine is x86_64"),
    ("big-endian", "not 64-bit little-endian ELF"),
    ("sections", r"section 1 \(.* bytes at .*\) is not within"),
    ("strtab", r"string table \d+ is empty or does not end in a NUL byte"),  # LLVM aborted on one (a fuzz find)
])
def test_garbage_truncated_empty_and_foreign_object_code_is_refused(lib_file: Path, blob: Any,
                                                                   message: str) -> None:
    if objfile.host_machine() != 62:
        pytest.skip("the messages name x86_64")

    def edit(header: dict[str, Any], blobs: list[bytes]) -> None:
        i = header["kernels"][0]["object"]
        obj = bytearray(blobs[i])
        if blob == "truncated":
            obj = obj[:4000]
        elif blob == "aarch64":
            obj[18:20] = struct.pack("<H", 183)
        elif blob == "big-endian":
            obj[5] = 2
        elif blob == "strtab":
            (shoff,) = struct.unpack_from("<Q", obj, 40)
            (names,) = struct.unpack_from("<H", obj, 62)
            off, size = struct.unpack_from("<QQ", obj, shoff + 64 * names + 24)
            obj[off + size - 1] = ord("x")
        elif blob == "sections":
            (shoff,) = struct.unpack_from("<Q", obj, 40)
            struct.pack_into("<Q", obj, shoff + 64 + 24, len(obj) - 8)  # section 1's offset near the end
        else:
            obj = bytearray(blob)
        blobs[i] = bytes(obj)

    with pytest.raises(runtime.LibraryFormatError, match=message):
        runtime.load(edited(lib_file, edit), trust=True)


_MUTATE_OBJECTS = """
import random, struct, sys
from kiln.runtime import linker
from kiln.errors import KilnError
from kiln.target import Target
objs = [open(p, "rb").read() for p in sys.argv[2:]]
rnd = random.Random(int(sys.argv[1]))
linked = refused = 0
for _ in range(1000):
    x = bytearray(rnd.choice(objs))
    (shoff,) = struct.unpack_from("<Q", x, 40)
    for _ in range(rnd.randint(1, 6)):
        r = rnd.random()
        pos = rnd.randrange(64) if r < 0.3 else rnd.randrange(shoff, len(x)) if r < 0.6 else rnd.randrange(len(x))
        x[pos] = rnd.randrange(256) if rnd.random() < 0.5 else x[pos] ^ (1 << rnd.randrange(8))
    try:
        linker.Engine(bytes(x), Target("llvm"), [], "fused_0")  # linked, never called
        linked += 1
    except KilnError:
        refused += 1
print(linked, refused)
"""


def test_mutated_object_code_is_refused_or_linked_never_aborts(lib_file: Path, tmp_path: Path) -> None:
    """LLVM's JIT linker aborts the process on many malformed objects (bad alignments, section names,
    relocation types, TLS): the ELF checks must catch them first. In a child, so an abort fails the test."""
    _, blobs = split(lib_file)
    paths = []
    for i, blob in enumerate(blobs[:2]):
        paths.append(tmp_path / f"k{i}.o")
        paths[-1].write_bytes(blob)
    done = subprocess.run([sys.executable, "-c", _MUTATE_OBJECTS, "13", *map(str, paths)], capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    linked, refused = map(int, done.stdout.split())
    assert linked + refused == 1000 and refused > 500


_HOST = detect.host_cpu()


def _host_without_avx512() -> detect.HostCPU:
    host = _HOST
    return detect.HostCPU("haswell", (*(f for f in host.features if "avx512" not in f), "-avx512f"), host.triple, 1)


def test_a_library_for_features_this_cpu_lacks_is_refused(
        tmp_path: Path, own_key: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    x = relay.var("x", shape=(64,))
    lib = relay.build(relay.Function([x], relay.exp(x)), target="llvm -mcpu=x86-64 -mattr=+avx512f")
    lib.export(tmp_path / "foreign.kiln")
    monkeypatch.setattr(detect, "host_cpu", _host_without_avx512)
    with pytest.raises(runtime.LibraryFormatError, match=r"needs CPU feature\(s\) avx512f that this CPU \(haswell"):
        runtime.load(tmp_path / "foreign.kiln")


def test_code_for_features_this_cpu_lacks_is_never_linked(monkeypatch: pytest.MonkeyPatch) -> None:
    x = relay.var("x", shape=(64,))
    func = relay.Function([x], relay.exp(x))
    monkeypatch.setattr(detect, "host_cpu", _host_without_avx512)
    with pytest.raises(linker.CPUFeatureError, match=r"kernel '\w+' was compiled for .*needs CPU feature\(s\) "
                                                     r"avx512f that this CPU \(haswell\) lacks"):
        relay.build(func, target="llvm -mcpu=x86-64 -mattr=+avx512f")
    with pytest.raises(linker.CPUFeatureError, match=r"needs CPU feature\(s\) avx512f that"):
        relay.build(func, target="llvm -mcpu=skylake-avx512")


def test_a_cpu_name_implies_its_features(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(detect, "host_cpu", _host_without_avx512)
    with pytest.raises(runtime.LibraryFormatError, match=r"needs CPU feature\(s\) avx512f that this CPU \(haswell"):
        library.check_host_target(Target("llvm -mcpu=skylake-avx512"))
    library.check_host_target(Target("llvm -mcpu=skylake-avx512 -mattr=-avx512f"))  # turned off: fine
    library.check_host_target(Target("llvm -mcpu=x86-64"))


# -- the kernel cache --------------------------------------------------------------------------


def _func(scale: float) -> tir.PrimFunc:
    n = 64
    a, b = tir.buffer("A", (n,), "float32"), tir.buffer("B", (n,), "float32")
    i = tir.Var("i")
    return tir.PrimFunc("scale", [a, b], tir.for_range(i, n, tir.BufferStore(b, a.load(i) * scale + 1.0, (i,))))


@pytest.fixture()
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, own_key: Path) -> Path:
    path = tmp_path / "cache"
    monkeypatch.setenv("KILN_CACHE_DIR", str(path))
    cache.KERNEL_CACHE.clear()
    yield path
    cache.KERNEL_CACHE.clear()


def _plant(path: Path, obj: bytes, key: str) -> None:
    """A cache entry with a valid sha256 and a tag under another key: what anyone with write access makes."""
    header = {"key": key, "length": len(obj), "sha256": hashlib.sha256(obj).hexdigest(), "symbols": [],
              "hmac": "00" * 32}
    head = json.dumps(header).encode()
    path.write_bytes(b"KILNOBJ2" + struct.pack("<Q", len(head)) + head + obj)


def test_planted_cache_entry_is_refused_rebuilt_and_never_run(cache_dir: Path) -> None:
    a = np.arange(64, dtype="float32")
    kiln.build(_func(2.0))
    (path,) = cache_dir.glob("*/*.kobj")
    assert stat.S_IMODE(cache_dir.stat().st_mode) == 0o700 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    wrong = kiln.build(_func(5.0))  # genuine code of another kernel: right symbols, wrong numbers
    _plant(path, wrong.object_code, path.stem)
    cache.KERNEL_CACHE.clear()
    refused, untrusted = cache.KERNEL_CACHE.corrupt, cache.KERNEL_CACHE.untrusted
    m = kiln.build(_func(2.0))
    assert (cache.KERNEL_CACHE.corrupt, cache.KERNEL_CACHE.untrusted) == (refused + 1, untrusted + 1)
    b = np.zeros_like(a)
    m(a, b)
    np.testing.assert_array_equal(b, a * 2 + 1)
    assert cache.KERNEL_CACHE.load(path.stem) is not None  # rewritten, signed


def test_cache_entry_calling_system_is_not_linked_even_with_a_stolen_key(cache_dir: Path, tmp_path: Path) -> None:
    kiln.build(_func(2.0))
    (path,) = cache_dir.glob("*/*.kobj")
    marker = tmp_path / "pwned"
    evil = evil_kernel("scale", b"", marker)
    cache.KERNEL_CACHE.store(path.stem, evil, [])  # signed: as if the attacker had read the key
    cache.KERNEL_CACHE.clear()
    with pytest.raises(linker.DisallowedSymbolError, match="kernel 'scale': its object code calls 'system'"):
        kiln.build(_func(2.0))
    assert not marker.exists()


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_cache_folder_writable_by_others_is_refused(cache_dir: Path, mode: int) -> None:
    cache_dir.mkdir()
    cache_dir.chmod(mode)
    with pytest.raises(trust.TrustSetupError,
                       match=rf"kiln cache folder '{cache_dir}' has mode 0{mode:o}, which lets other users write "
                             rf"it; kiln refuses it. Fix it with `chmod go-w {cache_dir}`.*KILN_CACHE=0"):
        kiln.build(_func(3.0))


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="chown to another user needs root")
def test_cache_folder_of_another_user_is_refused(cache_dir: Path) -> None:
    cache_dir.mkdir(mode=0o700)
    os.chown(cache_dir, 4242, -1)
    with pytest.raises(trust.TrustSetupError, match=rf"kiln cache folder '{cache_dir}' is owned by user id 4242"):
        kiln.build(_func(3.0))


def test_cache_off_needs_no_folder(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache_dir.mkdir()
    cache_dir.chmod(0o777)
    monkeypatch.setenv("KILN_CACHE", "0")
    a, b = np.arange(64, dtype="float32"), np.zeros(64, "float32")
    kiln.build(_func(3.0))(a, b)
    np.testing.assert_array_equal(b, a * 3 + 1)
