"""A small reader of CUBINs (CUDA ELF executables): what kiln checks before a loaded library's kernels run.

It reads, never executes: the ELF header (64-bit, little-endian, machine
EM_CUDA = 190), the SM version the code is for (from `e_flags`), the section
table (every section within the file), the symbol table (each kernel is a
global FUNC symbol) and each kernel's attribute table, `.nv.info.<kernel>`,
whose EIATTR_KPARAM_INFO entries give the ordinal and byte size of every
parameter the kernel's code reads.

A loaded library's header says how to launch each kernel (`runtime.cuda_library`);
with this reader the loader checks that the CUBIN holds each kernel it names and
that the header passes it exactly as many arguments, of the sizes, as its
code reads: a kernel given a wrong argument list would read garbage pointers.

Any malformation raises `CubinError`.
"""

from __future__ import annotations

import struct

import attrs

from kiln.errors import KilnError

EM_CUDA = 190
# e_ident[EI_ABIVERSION]: 7 keeps the SM version in e_flags' low byte, 8 (CUDA 12.8 on) in bits 8-15
_ABI_V1 = 7
_SHT_SYMTAB, _SHT_STRTAB, _SHT_NOBITS = 2, 3, 8
_STT_FUNC, _STB_GLOBAL = 2, 1
# .nv.info entries: a format byte, an attribute byte, then 2 bytes (a value, or for EIFMT_SVAL the size
# of the data that follows)
_EIFMT_SVAL = 4
_EIATTR_KPARAM_INFO = 0x17
_MAX_PARAMS = 4096  # CUDA passes at most 32 KiB of parameters, at least 8 bytes each here


class CubinError(KilnError, ValueError):
    """Bytes that are not a well-formed CUBIN."""


@attrs.frozen
class Cubin:
    """What kiln reads of a CUBIN: its SM version and, per kernel, its parameters' sizes in bytes."""

    sm: int  # e.g. 90 for sm_90
    kernels: dict[str, tuple[int, ...]]


def read_cubin(data: bytes, what: str = "CUBIN") -> Cubin:
    """Parses the header, sections, symbols and kernel parameter tables of `data`.

    Args:
        data: the CUBIN's bytes.
        what: how messages name it ("the CUBIN of kernel 'fused_0'").

    Raises:
        CubinError: for bytes that are not a CUBIN, are truncated, or whose tables are malformed.
    """

    def fail(message: str) -> CubinError:
        return CubinError(f"{what}: {message}")

    if len(data) < 64 or data[:4] != b"\x7fELF":
        raise fail("not an ELF file (bad magic or shorter than an ELF header)")
    if data[4] != 2 or data[5] != 1:
        raise fail(f"not 64-bit little-endian ELF (class {data[4]}, data {data[5]})")
    (machine,) = struct.unpack_from("<H", data, 18)
    if machine != EM_CUDA:
        raise fail(f"ELF machine {machine}, not CUDA ({EM_CUDA})")
    (flags,) = struct.unpack_from("<I", data, 48)
    sm = flags & 0xFF if data[8] == _ABI_V1 else flags >> 8 & 0xFF
    shoff, = struct.unpack_from("<Q", data, 40)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 58)
    if shentsize != 64 or shnum == 0 or shoff > len(data) or shnum * 64 > len(data) - shoff:
        raise fail(f"section table ({shnum} entries of {shentsize} bytes at {shoff}) is not within its "
                   f"{len(data)} bytes")
    sections = []
    for i in range(shnum):
        name, kind, _, _, off, size, link, _, _, entsize = struct.unpack_from("<IIQQQQIIQQ", data, shoff + 64 * i)
        if kind != _SHT_NOBITS and (off > len(data) or size > len(data) - off):
            raise fail(f"section {i} ({size} bytes at {off}) is not within its {len(data)} bytes")
        sections.append((name, kind, off, size, link, entsize))
    if shstrndx >= shnum or sections[shstrndx][1] != _SHT_STRTAB:
        raise fail(f"section-name table {shstrndx} is not a string table")

    def string(table: int, offset: int) -> str:
        _, _, off, size, _, _ = sections[table]
        end = data.find(b"\0", off + offset, off + size)
        if offset >= size or end < 0:
            raise fail(f"name offset {offset} is not within string table {table}")
        return data[off + offset: end].decode("ascii", errors="replace")

    names = {string(shstrndx, s[0]): i for i, s in enumerate(sections)}
    tables = [s for s in sections if s[1] == _SHT_SYMTAB]
    if len(tables) != 1:
        raise fail(f"{len(tables)} symbol tables, expected one")
    _, _, off, size, link, entsize = tables[0]
    if entsize != 24 or size % 24 or link >= shnum or sections[link][1] != _SHT_STRTAB:
        raise fail("malformed symbol table")
    kernels: dict[str, tuple[int, ...]] = {}
    for k in range(size // 24):
        st_name, st_info, _, st_shndx = struct.unpack_from("<IBBH", data, off + 24 * k)
        if st_info & 0xF == _STT_FUNC and st_info >> 4 == _STB_GLOBAL and 0 < st_shndx < shnum:
            kernel = string(link, st_name)
            info = names.get(f".nv.info.{kernel}")
            if info is None or sections[info][1] == _SHT_NOBITS:
                raise fail(f"kernel {kernel!r} has no attribute table .nv.info.{kernel}")
            kernels[kernel] = _param_sizes(data, sections[info][2], sections[info][3], f"{what}: kernel {kernel!r}")
    return Cubin(sm, kernels)


def _param_sizes(data: bytes, off: int, size: int, where: str) -> tuple[int, ...]:
    """The byte size of each parameter (by ordinal) from a kernel's `.nv.info` entries at `off`."""
    sizes: dict[int, int] = {}
    pos, end = off, off + size
    while pos < end:
        if end - pos < 4:
            raise CubinError(f"{where}: attribute table ends inside an entry")
        fmt, attr, value = struct.unpack_from("<BBH", data, pos)
        pos += 4
        if fmt != _EIFMT_SVAL:
            continue
        if value > end - pos:
            raise CubinError(f"{where}: attribute {attr:#x} of {value} bytes runs past its table")
        if attr == _EIATTR_KPARAM_INFO:
            if value < 12:
                raise CubinError(f"{where}: a parameter entry of {value} bytes")
            _, ordinal, _, bits = struct.unpack_from("<IHHI", data, pos)
            if ordinal in sizes or ordinal >= _MAX_PARAMS:
                raise CubinError(f"{where}: parameter ordinal {ordinal} repeated or out of range")
            sizes[ordinal] = bits >> 18 & 0x3FFF
        pos += value
    if sorted(sizes) != list(range(len(sizes))):
        raise CubinError(f"{where}: parameter ordinals {sorted(sizes)} are not 0 to {len(sizes) - 1}")
    return tuple(sizes[i] for i in range(len(sizes)))
