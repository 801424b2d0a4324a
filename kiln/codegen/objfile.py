"""A small reader of ELF64 relocatable object files: what kiln checks before it links code.

It reads, never executes: the header (magic, 64-bit class, little-endian,
relocatable, machine), the section table (every offset and size within the
file) and the symbol table, and answers which symbols the object leaves
undefined (what the JIT would resolve in the process: the calls it makes to
the outside) and the bytes of a defined data symbol (the signature that kiln's
LLVM back end embeds in each kernel as `kiln_sig_<name>`).

Any malformation raises `ObjectFileError`; a machine other than the host's
raises it too, so code for another CPU never reaches the JIT.
"""

from __future__ import annotations

import functools
import platform
import struct

import attrs

from kiln.errors import KilnError


class ObjectFileError(KilnError, ValueError):
    """Bytes that are not a well-formed ELF64 object for this machine."""


# e_machine values (the ELF psABI registry)
MACHINES = {3: "i386", 40: "arm", 62: "x86_64", 183: "aarch64", 21: "ppc64", 243: "riscv64", 22: "s390x"}
_HOST_NAMES = {"x86_64": 62, "amd64": 62, "aarch64": 183, "arm64": 183, "ppc64le": 21, "ppc64": 21,
               "riscv64": 243, "s390x": 22}

_SHT_SYMTAB, _SHT_NOBITS = 2, 8
_SHN_UNDEF, _SHN_LORESERVE = 0, 0xFF00
_ET_REL = 1


@functools.cache
def host_machine() -> int:
    """The ELF e_machine of the CPU this process runs on (0 when unknown)."""
    return _HOST_NAMES.get(platform.machine().lower(), 0)


@attrs.frozen
class Symbol:
    """One symbol-table entry."""

    name: str
    section: int  # st_shndx: 0 = undefined
    value: int
    size: int
    binding: int  # 0 local, 1 global, 2 weak


@attrs.frozen
class _Section:
    type: int
    offset: int
    size: int
    link: int
    entsize: int


class ObjectFile:
    """A parsed ELF64 little-endian relocatable object.

    Raises:
        ObjectFileError: for bytes that are not one, are truncated, or are for another machine.
    """

    def __init__(self, data: bytes, what: str = "object code") -> None:
        self.data = bytes(data)
        self.what = what
        d = self.data
        if len(d) < 64:
            raise self._error(f"{len(d)} bytes, too short for an ELF header")
        if d[:4] != b"\x7fELF":
            raise self._error("not an ELF object file (bad magic)")
        if d[4] != 2 or d[5] != 1:
            raise self._error(f"not 64-bit little-endian ELF (class {d[4]}, data {d[5]})")
        e_type, e_machine = struct.unpack_from("<HH", d, 16)
        if e_type != _ET_REL:
            raise self._error(f"ELF type {e_type}, expected a relocatable object (1)")
        self.machine = e_machine
        host = host_machine()
        if host and e_machine != host:
            raise self._error(f"code for {MACHINES.get(e_machine, f'ELF machine {e_machine}')}, but this machine "
                              f"is {MACHINES.get(host, platform.machine())}")
        (shoff,) = struct.unpack_from("<Q", d, 40)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", d, 58)
        if shentsize != 64 or shnum == 0 or not 0 <= shoff <= len(d) - shnum * 64:
            raise self._error(f"section table ({shnum} entries of {shentsize} bytes at {shoff}) "
                              f"is not within its {len(d)} bytes")
        if shstrndx >= shnum:
            raise self._error(f"section-name table index {shstrndx} of {shnum} sections")
        self.sections: list[_Section] = []
        for i in range(shnum):
            _, sh_type, _, _, off, size, link, _, _, entsize = struct.unpack_from("<IIQQQQIIQQ", d, shoff + 64 * i)
            if sh_type != _SHT_NOBITS and (off > len(d) or size > len(d) - off):
                raise self._error(f"section {i} ({size} bytes at {off}) is not within its {len(d)} bytes")
            self.sections.append(_Section(sh_type, off, size, link, entsize))
        self.symbols = self._read_symbols()

    def _error(self, message: str) -> ObjectFileError:
        return ObjectFileError(f"{self.what}: {message}")

    def _bytes(self, sec: _Section) -> bytes:
        return self.data[sec.offset: sec.offset + sec.size]

    def _read_symbols(self) -> list[Symbol]:
        tables = [s for s in self.sections if s.type == _SHT_SYMTAB]
        if len(tables) > 1:
            raise self._error(f"{len(tables)} symbol tables, expected one")
        if not tables:
            return []
        tab = tables[0]
        if tab.entsize != 24 or tab.size % 24 or tab.link >= len(self.sections):
            raise self._error("malformed symbol table")
        strings = self._bytes(self.sections[tab.link])
        raw = self._bytes(tab)
        out = []
        for k in range(tab.size // 24):
            st_name, st_info, _, st_shndx, st_value, st_size = struct.unpack_from("<IBBHQQ", raw, 24 * k)
            if st_name >= max(len(strings), 1):
                raise self._error(f"symbol {k} names string offset {st_name} of a {len(strings)}-byte table")
            end = strings.find(b"\0", st_name)
            if end < 0:
                raise self._error(f"symbol {k}: unterminated name")
            try:
                name = strings[st_name:end].decode("ascii")
            except UnicodeDecodeError:
                raise self._error(f"symbol {k}: a name that is not ASCII") from None
            if st_shndx != _SHN_UNDEF and st_shndx < _SHN_LORESERVE and st_shndx >= len(self.sections):
                raise self._error(f"symbol {name!r} is in section {st_shndx} of {len(self.sections)}")
            out.append(Symbol(name, st_shndx, st_value, st_size, st_info >> 4))
        return out

    def undefined_symbols(self) -> list[str]:
        """The names the object needs from outside (sorted, without the empty null symbol)."""
        return sorted({s.name for s in self.symbols if s.section == _SHN_UNDEF and s.name})

    def defined(self, name: str) -> Symbol | None:
        """The defined symbol `name`, or None."""
        for s in self.symbols:
            if s.name == name and s.section != _SHN_UNDEF:
                return s
        return None

    def data_of(self, name: str) -> bytes | None:
        """The bytes of defined data symbol `name` (read from its section), or None when absent.

        Raises:
            ObjectFileError: when the symbol's bytes are not within its section.
        """
        sym = self.defined(name)
        if sym is None or sym.section >= _SHN_LORESERVE:
            return None
        sec = self.sections[sym.section]
        if sec.type == _SHT_NOBITS or sym.value > sec.size or sym.size > sec.size - sym.value:
            raise self._error(f"symbol {name!r} ({sym.size} bytes at {sym.value}) is not within its section")
        return self.data[sec.offset + sym.value: sec.offset + sym.value + sym.size]
