"""kiln.build, the callable Module (argument checks, get_source) and the kernel cache."""

from __future__ import annotations

import gc
import os
import re

import numpy as np
import pytest

import kiln
from kiln import tir
from kiln.codegen import cache
from kiln.errors import KilnError
from kiln.runtime.module import ArgumentError, Module


def _func(name: str = "axpy", scale: float = 2.0) -> tir.PrimFunc:
    n = tir.Var("n")
    A, B = tir.buffer("A", (n, 4)), tir.buffer("B", (n, 4))
    i, j = tir.Var("i"), tir.Var("j")
    body = tir.for_range(i, n, tir.for_range(j, 4, tir.BufferStore(B, A.load(i, j) * scale + 1.0, (i, j))))
    return tir.PrimFunc(name, [A, B], body)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("KILN_CACHE", raising=False)
    cache.KERNEL_CACHE.clear()
    yield tmp_path
    cache.KERNEL_CACHE.clear()


@pytest.fixture
def no_cache(monkeypatch):
    monkeypatch.setenv("KILN_CACHE", "0")


@pytest.fixture
def module(no_cache) -> Module:
    return kiln.build(_func())


def test_build_returns_a_callable_module(module):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.zeros_like(a)
    module(a, b)
    np.testing.assert_array_equal(b, a * 2 + 1)
    assert module.name == "axpy" and "axpy" in repr(module)


def test_build_renames_the_kernel(no_cache):
    m = kiln.build(_func(), name="renamed")
    assert m.name == "renamed" and "def renamed(" in m.get_source("tir")


def test_get_source_formats(module):
    assert re.search(r"define .*i32 @kiln_axpy\(", module.get_source("ll"))
    assert "kiln_axpy:" in module.get_source("asm")
    assert module.get_source("tir") == str(_func())
    with pytest.raises(ValueError, match="'ll', 'asm' or 'tir'"):
        module.get_source("ptx")


def test_build_refuses_unbound_loops_on_cuda_and_other_objects(no_cache):
    with pytest.raises(KilnError, match="not bound to a GPU thread"):
        kiln.build(_func(), target="cuda -arch=sm_90")
    with pytest.raises(KilnError):
        kiln.build(42)


# -- argument checks -----------------------------------------------------------------


def _ok() -> tuple[np.ndarray, np.ndarray]:
    return np.zeros((3, 4), np.float32), np.zeros((3, 4), np.float32)


@pytest.mark.parametrize(
    ("make", "pattern"),
    [
        (lambda a, b: (a,), r"kernel 'axpy': expected 2 arrays \(A, B\), got 1"),
        (lambda a, b: (a, b, b), r"expected 2 arrays \(A, B\), got 3"),
        (lambda a, b: (a.tolist(), b), r"parameter 'A': expected a numpy.ndarray of float32\(n, 4\), got list"),
        (lambda a, b: (a.astype(np.float64), b), r"parameter 'A': expected dtype float32, got float64"),
        (lambda a, b: (a.ravel(), b), r"parameter 'A': expected 2 dims \(n, 4\), got 1 dims \(12,\)"),
        (lambda a, b: (np.zeros((3, 5), np.float32), np.zeros((3, 5), np.float32)),
         r"parameter 'A': expected shape \(n, 4\), got \(3, 5\) \(dim 1\)"),
        (lambda a, b: (a, np.zeros((2, 4), np.float32)),
         r"parameter 'B': size n is 3 from A.shape\[0\] but 2 here"),
        (lambda a, b: (np.zeros((4, 6), np.float32)[:3, :4], b), r"parameter 'A': expected a C-contiguous array"),
        (lambda a, b: (a, b), None),
    ],
)
def test_argument_errors_name_kernel_parameter_expected_and_got(module, make, pattern):
    a, b = _ok()
    args = make(a, b)
    if pattern is None:  # a well-formed call, for contrast
        module(*args)
        return
    with pytest.raises(ArgumentError, match=pattern):
        module(*args)


def test_argument_error_is_kiln_type_and_value_error():
    assert issubclass(ArgumentError, KilnError)
    assert issubclass(ArgumentError, TypeError) and issubclass(ArgumentError, ValueError)


def test_readonly_unaligned_and_aliased_arrays_are_rejected(module):
    a, b = _ok()
    a.flags.writeable = False
    with pytest.raises(ArgumentError, match="'A': expected a writeable array"):
        module(a, b)
    raw = np.zeros(3 * 4 * 4 + 1, np.uint8)
    unaligned = raw[1:].view(np.float32).reshape(3, 4)
    with pytest.raises(ArgumentError, match="'A': expected an aligned array"):
        module(unaligned, b)
    with pytest.raises(ArgumentError, match="'B': shares memory with parameter 'A'"):
        module(b, b)


def test_static_dims_are_checked(no_cache):
    A = tir.buffer("X", (8,))
    i = tir.Var("i")
    m = kiln.build(tir.PrimFunc("static8", [A], tir.for_range(i, 8, tir.BufferStore(A, tir.const(1.0), (i,)))))
    with pytest.raises(ArgumentError, match=r"'X': expected shape \(8\), got \(7,\)"):
        m(np.zeros(7, np.float32))
    x = np.zeros(8, np.float32)
    m(x)
    assert (x == 1).all()


# -- the cache -----------------------------------------------------------------------


def _files(root) -> list:
    return sorted(p for p in root.rglob("*.kobj"))


def test_cache_memory_hit_returns_the_same_module(cache_dir):
    m1 = kiln.build(_func())
    m2 = kiln.build(_func())  # a structurally equal, distinct PrimFunc
    assert m1 is m2
    assert len(_files(cache_dir)) == 1


def test_cache_disk_hit_loads_object_code(cache_dir):
    m1 = kiln.build(_func())
    cache.KERNEL_CACHE.clear()
    before = cache.KERNEL_CACHE.disk_hits
    m2 = kiln.build(_func())
    assert m2 is not m1 and cache.KERNEL_CACHE.disk_hits == before + 1
    a, b = _ok()
    a += 3
    m2(a, b)
    np.testing.assert_array_equal(b, a * 2 + 1)
    assert re.search(r"define .*i32 @kiln_axpy\(", m2.get_source("ll"))  # regenerated on demand


def test_cache_key_depends_on_ir_and_target(cache_dir):
    kiln.build(_func(scale=2.0))
    kiln.build(_func(scale=3.0))
    kiln.build(_func(scale=2.0), target="llvm -num-cores=1")
    assert len(_files(cache_dir)) == 3
    assert cache.cache_key(str(_func()), kiln.Target("llvm")) == cache.cache_key(str(_func()), kiln.Target("llvm"))


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "wrong_key"])
def test_corrupt_cache_file_is_detected_deleted_and_rebuilt(cache_dir, damage):
    kiln.build(_func())
    (path,) = _files(cache_dir)
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip":
        data[-10] ^= 0xFF
    elif damage == "garbage":
        data = bytearray(b"not a kiln file")
    else:
        data = data.replace(path.stem.encode(), b"0" * len(path.stem), 1)
    path.write_bytes(bytes(data))
    cache.KERNEL_CACHE.clear()
    corrupt = cache.KERNEL_CACHE.corrupt
    m = kiln.build(_func())
    assert cache.KERNEL_CACHE.corrupt == corrupt + 1
    a, b = _ok()
    m(a, b)
    np.testing.assert_array_equal(b, a * 2 + 1)
    assert path.read_bytes() != bytes(data)  # rewritten whole
    assert cache.KERNEL_CACHE.load(path.stem) is not None


def test_cache_disabled_writes_nothing(cache_dir, monkeypatch):
    monkeypatch.setenv("KILN_CACHE", "0")
    m1, m2 = kiln.build(_func()), kiln.build(_func())
    assert m1 is not m2
    assert _files(cache_dir) == []


def test_cache_writes_atomically_leaving_no_temp_files(cache_dir):
    kiln.build(_func())
    assert [p.name for p in cache_dir.rglob(".tmp-*")] == []


# -- memory --------------------------------------------------------------------------


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
def test_compiling_and_dropping_many_kernels_keeps_memory_bounded(no_cache):
    a = np.ones((2, 4), np.float32)
    b = np.empty_like(a)
    for k in range(10):  # warm up LLVM's one-time allocations
        kiln.build(_func(scale=float(k)))(a, b)
    gc.collect()
    start = _rss_mb()
    count = 300
    for k in range(count):
        m = kiln.build(_func(scale=1000.0 + k))
        m(a, b)
        del m
    gc.collect()
    growth = _rss_mb() - start
    assert growth < 100 * count / 1000, f"{growth:.1f} MB for {count} kernels"
