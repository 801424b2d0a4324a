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

_SHT_SYMTAB, _SHT_STRTAB, _SHT_RELA, _SHT_NOBITS, _SHT_REL = 2, 3, 4, 8, 9
# NULL, PROGBITS, SYMTAB, STRTAB, RELA, NOTE, NOBITS, REL, LLVM_ADDRSIG, X86_64_UNWIND (.eh_frame)
_SECTION_TYPES = frozenset([0, 1, 2, 3, 4, 7, 8, 9, 0x6FFF4C03, 0x70000001])
_MAX_ALIGN = 4096
# WRITE, ALLOC, EXECINSTR, MERGE, STRINGS, INFO_LINK, X86_64_LARGE, EXCLUDE (never TLS or GROUP)
_SECTION_FLAGS = 0x1 | 0x2 | 0x4 | 0x10 | 0x20 | 0x40 | 0x10000000 | 0x80000000
_SHN_ABS, _SHN_COMMON = 0xFFF1, 0xFFF2
# The x86-64 relocations that LLVM's RuntimeDyld implements (it aborts the process on any other):
# NONE, 64, PC32, PLT32, GOTPCREL, 32, 32S, PC64, GOTOFF64, GOTPC32, GOT64, GOTPC64, GOTPCRELX,
# REX_GOTPCRELX. kiln's code (large code model) uses GOTOFF64, GOT64 and GOTPC64.
_X86_64_RELOCATIONS = frozenset([0, 1, 2, 4, 9, 10, 11, 24, 25, 26, 27, 29, 41, 42])
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
    info: int
    entsize: int
    name: int = 0  # offset in the section-name table


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
        version, entry, phoff, shoff, flags, ehsize, phentsize, phnum, shentsize, shnum, shstrndx = \
            struct.unpack_from("<IQQQIHHHHHH", d, 20)
        # a relocatable object has no entry point or program headers; LLVM asserts on odd ones
        if (version, entry, phoff, flags, ehsize, phnum) != (1, 0, 0, 0, 64, 0) or phentsize not in (0, 56):
            raise self._error("an ELF header that is not a plain relocatable object's")
        if shentsize != 64 or shnum == 0 or not 0 <= shoff <= len(d) - shnum * 64:
            raise self._error(f"section table ({shnum} entries of {shentsize} bytes at {shoff}) "
                              f"is not within its {len(d)} bytes")
        if shstrndx >= shnum:
            raise self._error(f"section-name table index {shstrndx} of {shnum} sections")
        self.sections = [self._section(i, shoff + 64 * i) for i in range(shnum)]
        self._check_sections(shstrndx)
        self.symbols = self._read_symbols()
        self._check_relocations()

    def _section(self, i: int, at: int) -> _Section:
        name, sh_type, flags, addr, off, size, link, info, align, entsize = struct.unpack_from("<IIQQQQIIQQ",
                                                                                            self.data, at)
        if flags & ~_SECTION_FLAGS:  # thread-local storage, above all, which the JIT aborts on
            raise self._error(f"section {i} has flags {flags:#x}, which kiln's objects never carry")
        if sh_type != _SHT_NOBITS and (off > len(self.data) or size > len(self.data) - off):
            raise self._error(f"section {i} ({size} bytes at {off}) is not within its {len(self.data)} bytes")
        if sh_type not in _SECTION_TYPES:
            raise self._error(f"section {i} has type {sh_type:#x}, which kiln's objects never hold")
        if addr != 0 or align > _MAX_ALIGN or align & (align - 1):
            raise self._error(f"section {i}: address {addr}, alignment {align} (a power of 2 up to {_MAX_ALIGN} "
                              "expected)")
        return _Section(sh_type, off, size, link, info, entsize, name)

    def _check_sections(self, shstrndx: int) -> None:
        """Names within the name table; tables linked to tables of the right type."""
        count = len(self.sections)
        if self.sections[0] != _Section(0, 0, 0, 0, 0, 0, 0):
            raise self._error("section 0 is not the null section")
        names = self.sections[shstrndx]
        if names.type != _SHT_STRTAB:
            raise self._error(f"section-name table {shstrndx} is not a string table")
        table = self._bytes(names)
        for i, sec in enumerate(self.sections):
            if sec.type == _SHT_STRTAB and not self._bytes(sec).endswith(b"\0"):  # LLVM aborts on one
                raise self._error(f"string table {i} is empty or does not end in a NUL byte")
            if sec.name >= max(len(table), 1) or table.find(b"\0", sec.name) < 0:
                raise self._error(f"section {i}: name offset {sec.name} is not within the section-name table")
            if sec.type == _SHT_SYMTAB and (sec.link >= count or self.sections[sec.link].type != _SHT_STRTAB):
                raise self._error(f"symbol table {i} links section {sec.link}, not a string table")
            if sec.type in (_SHT_RELA, _SHT_REL) and (
                    sec.link >= count or self.sections[sec.link].type != _SHT_SYMTAB or not 0 < sec.info < count):
                raise self._error(f"relocation section {i} links section {sec.link} and patches section {sec.info}")

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
            if st_shndx >= _SHN_LORESERVE and st_shndx not in (_SHN_ABS, _SHN_COMMON):
                raise self._error(f"symbol {name!r} is in reserved section {st_shndx:#x}")
            if st_shndx != _SHN_UNDEF and st_shndx < _SHN_LORESERVE:
                if st_shndx >= len(self.sections):
                    raise self._error(f"symbol {name!r} is in section {st_shndx} of {len(self.sections)}")
                sec = self.sections[st_shndx]
                if st_value > sec.size or st_size > sec.size - st_value:
                    raise self._error(f"symbol {name!r} ({st_size} bytes at {st_value}) is not within its section")
            if st_info & 0xF > 4 or st_info >> 4 > 2:  # NOTYPE..FILE; LOCAL, GLOBAL, WEAK
                raise self._error(f"symbol {name!r} has type {st_info & 0xF} and binding {st_info >> 4}")
            out.append(Symbol(name, st_shndx, st_value, st_size, st_info >> 4))
        return out

    def _check_relocations(self) -> None:
        """Every relocation names a symbol of the table, patches bytes within its section, and (on
        x86-64) is of a type the JIT's linker implements: a malformed one would abort the process."""
        for i, sec in enumerate(self.sections):
            if sec.type not in (_SHT_RELA, _SHT_REL):
                continue
            size = 24 if sec.type == _SHT_RELA else 16
            if sec.entsize != size or sec.size % size:
                raise self._error(f"section {i}: malformed relocation table")
            if sec.info >= len(self.sections):  # sh_info: the section it patches
                raise self._error(f"section {i} relocates section {sec.info} of {len(self.sections)}")
            target = self.sections[sec.info].size
            raw = self._bytes(sec)
            for k in range(sec.size // size):
                offset, r_info = struct.unpack_from("<QQ", raw, size * k)
                sym, kind = r_info >> 32, r_info & 0xFFFFFFFF
                if sym >= max(len(self.symbols), 1) or offset > target or target - offset < 4:
                    raise self._error(f"relocation {k} of section {i} (symbol {sym}, offset {offset}) "
                                      "is not within its tables")
                if self.machine == 62 and kind not in _X86_64_RELOCATIONS:
                    raise self._error(f"relocation {k} of section {i} has type {kind}, which kiln never emits")

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
