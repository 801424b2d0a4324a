"""The CUBIN reader (kiln.runtime.cubin): SM versions, kernels and their parameter sizes, and malformed files."""

from __future__ import annotations

import random
import struct
from collections.abc import Callable

import pytest

from kiln.codegen import nvrtc
from kiln.runtime.cubin import EM_CUDA, CubinError, read_cubin

SOURCE = r"""
extern "C" __global__ void __launch_bounds__(64) k0(const float* __restrict__ a, float* __restrict__ b, long long n) {
  int i = threadIdx.x; if (i < n) b[i] = a[i] * 2;
}
extern "C" __global__ void mixed(int a, double* b, char c) { b[0] = a + c; }
extern "C" __global__ void nothing() { }
"""


@pytest.fixture(scope="module")
def sm90() -> bytes:
    return nvrtc.compile_cuda(SOURCE, "sm_90")


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_90", "sm_100", "sm_120"])
def test_the_sm_version_and_every_kernels_parameter_sizes_are_read(arch: str) -> None:
    cubin = read_cubin(nvrtc.compile_cuda(SOURCE, arch))
    assert cubin.sm == int(arch[3:])
    assert cubin.kernels == {"k0": (8, 8, 8), "mixed": (4, 8, 1), "nothing": ()}


def test_the_older_abi_keeps_the_sm_version_in_the_low_byte(sm90: bytes) -> None:
    old = bytearray(sm90)
    old[8] = 7  # EI_ABIVERSION 7 (CUDA before 12.8): e_flags = virtual SM << 16 | SM
    struct.pack_into("<I", old, 48, 0x500550)
    assert read_cubin(bytes(old)).sm == 80


def _with_machine(data: bytes, machine: int) -> bytes:
    out = bytearray(data)
    struct.pack_into("<H", out, 18, machine)
    return bytes(out)


@pytest.mark.parametrize(("damage", "message"), [
    (lambda d: b"", "not an ELF file"),
    (lambda d: b"\x7fELF" + bytes(100), r"not 64-bit little-endian ELF \(class 0"),
    (lambda d: _with_machine(d, 62), f"ELF machine 62, not CUDA \\({EM_CUDA}\\)"),
    (lambda d: d[:200], r"section table \(.* entries of 64 bytes at .*\) is not within its 200 bytes"),
    (lambda d: d.replace(b".nv.info.mixed", b".nv.info.mixeX"), "kernel 'mixed' has no attribute table"),
])
def test_malformed_cubins_are_refused_saying_why(sm90: bytes, damage: Callable[[bytes], bytes], message: str) -> None:
    with pytest.raises(CubinError, match=f"^the CUBIN: {message}"):
        read_cubin(damage(sm90), "the CUBIN")


def test_truncated_and_bit_flipped_cubins_give_cubin_errors_and_nothing_else(sm90: bytes) -> None:
    rng = random.Random(7)
    refused = 0
    for n in range(3000):
        data = bytearray(sm90)
        if n % 3 == 0:
            data = data[: rng.randrange(len(data))]
        else:  # the header and tables sit in the first 2 KiB, the code after
            for _ in range(rng.randrange(1, 6)):
                data[rng.randrange(2048 if n % 2 else len(data))] = rng.randrange(256)
        try:
            read_cubin(bytes(data))
        except CubinError:
            refused += 1
    assert refused > 1000  # most damage is caught; what is not left the tables readable
