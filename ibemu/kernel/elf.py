"""A small loader of eBPF objects compiled by clang (``clang -O2 -target bpf -c prog.c``).

ibemu writes its larger kernel programs in C (``ibemu/kernel/bpf_src``) and loads them itself:
no libbpf bindings. What an object may contain, and what the loader does with it:

- exactly one program section (an executable section with code, e.g. ``SEC("tc")``); the
  ``.text`` section must be empty (helpers are ``static __always_inline``: BPF-to-BPF calls
  are rejected here, not half-supported);
- maps as ``struct ibemu_map name SEC("maps") = {type, key_size, value_size, max_entries,
  flags}`` (five u32; no BTF): the loader creates each with ``bpf.Map``, unless the caller
  passes a map of that name already made (a shared map, a map of maps, whose inner map the
  caller owns) or a different ``max_entries`` for it;
- the program section's ``.rel`` section: every relocation must be a 64-bit immediate load
  (``ld_imm64``, R_BPF_64_64) of a symbol in ``maps``; the loader writes the map's fd into
  it and marks it BPF_PSEUDO_MAP_FD. Anything else (global data, ``.rodata``, calls,
  CO-RE relocations) is refused with a ``ElfError`` naming the symbol;
- ``license``: passed to the kernel (GPL helpers need it).

ELF64 little-endian only (what ``-target bpf`` produces on x86_64 and arm64). A verifier
rejection raises ``LoadError`` with the program's name and the last lines of the verifier's
log (``LoadError.tail``); callers log that and fall back to the Python agents.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field

from ibemu.kernel import bpf
from ibemu.kernel.commands import KernelError

SHT_SYMTAB = 2
SHT_REL = 9
SHF_EXECINSTR = 0x4
R_BPF_64_64 = 1
BPF_LD_IMM64 = 0x18
BPF_PSEUDO_MAP_FD = 1
MAP_DEF = struct.Struct("<5I")

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")
_REL = struct.Struct("<QQ")


class ElfError(KernelError):
    """The object is not one this loader takes (see the module docstring)."""


class LoadError(KernelError):
    """The kernel refused the program (``name``); ``tail``: the verifier's last lines."""

    def __init__(self, name: str, reason: str, tail: str) -> None:
        super().__init__(f"eBPF program {name!r} rejected: {reason}\n{tail}")
        self.name, self.reason, self.tail = name, reason, tail


@dataclass(frozen=True, slots=True)
class MapDef:
    name: str
    map_type: int
    key_size: int
    value_size: int
    max_entries: int
    flags: int


@dataclass(slots=True)
class BpfObject:
    """What ``parse`` found: one program and the maps it references."""

    name: str
    section: str
    insns: bytearray
    relocations: list[tuple[int, str]]
    """(instruction index, map symbol) per ld_imm64 to patch."""
    maps: dict[str, MapDef]
    license: str


@dataclass(slots=True)
class Loaded:
    """A loaded program (``prog_fd``) and its maps by name; ``close`` frees what it made."""

    name: str
    prog_fd: int
    maps: dict[str, bpf.Map]
    owned: list[bpf.Map] = field(default_factory=list)

    def close(self) -> None:
        if self.prog_fd >= 0:
            os.close(self.prog_fd)
            self.prog_fd = -1
        for m in self.owned:
            m.close()
        self.owned.clear()


def _cstr(table: bytes, off: int) -> str:
    end = table.find(b"\0", off)
    return table[off:end if end >= 0 else len(table)].decode(errors="replace")


def parse(data: bytes) -> BpfObject:
    """Parse a clang ``-target bpf`` object (see the module docstring); raises ``ElfError``."""
    if len(data) < _EHDR.size or data[:4] != b"\x7fELF":
        raise ElfError("not an ELF file")
    ident = data[:16]
    if ident[4] != 2 or ident[5] != 1:
        raise ElfError("not a 64-bit little-endian ELF object")
    (_ident, _etype, machine, _ver, _entry, _phoff, shoff, _flags, _ehsize, _phes, _phnum,
     shentsize, shnum, shstrndx) = _EHDR.unpack_from(data, 0)
    if machine != 247:  # EM_BPF
        raise ElfError(f"not an eBPF object (e_machine {machine})")
    if shentsize != _SHDR.size or shoff + shnum * shentsize > len(data) or shstrndx >= shnum:
        raise ElfError("truncated or malformed section header table")
    sections = [_SHDR.unpack_from(data, shoff + i * shentsize) for i in range(shnum)]

    def body(i: int) -> bytes:
        sh = sections[i]
        off, size = sh[4], sh[5]
        if sh[1] == 8:  # SHT_NOBITS
            return bytes(size)
        if off + size > len(data):
            raise ElfError(f"section {i} runs past the end of the file")
        return data[off:off + size]

    shstr = body(shstrndx)
    names = [_cstr(shstr, sh[0]) for sh in sections]
    progs = [i for i, sh in enumerate(sections) if sh[2] & SHF_EXECINSTR and sh[5] > 0]
    if any(names[i] == ".text" for i in progs):
        raise ElfError(".text has code: BPF-to-BPF calls are not supported (make helpers "
                       "static __always_inline)")
    if len(progs) != 1:
        raise ElfError(f"expected one program section, found {len(progs)}")
    prog = progs[0]
    insns = bytearray(body(prog))
    if len(insns) % 8:
        raise ElfError("program section is not a whole number of instructions")

    symtabs = [i for i, sh in enumerate(sections) if sh[1] == SHT_SYMTAB]
    if len(symtabs) != 1:
        raise ElfError("no symbol table")
    symtab = body(symtabs[0])
    strtab = body(sections[symtabs[0]][6])
    symbols = [_SYM.unpack_from(symtab, off) for off in range(0, len(symtab) - _SYM.size + 1, _SYM.size)]
    maps_idx = names.index("maps") if "maps" in names else -1
    maps_body = body(maps_idx) if maps_idx >= 0 else b""

    prog_name = names[prog]
    maps: dict[str, MapDef] = {}
    for st_name, st_info, _other, shndx, value, _size in symbols:
        name = _cstr(strtab, st_name)
        if shndx == prog and st_info & 0xF == 2:  # STT_FUNC
            prog_name = name
        if shndx == maps_idx and maps_idx >= 0 and name:
            if value + MAP_DEF.size > len(maps_body):
                raise ElfError(f"map {name!r}: definition runs past its section")
            maps[name] = MapDef(name, *MAP_DEF.unpack_from(maps_body, value))

    relocations: list[tuple[int, str]] = []
    for i, sh in enumerate(sections):
        if sh[1] != SHT_REL or sh[7] != prog:
            continue
        rel = body(i)
        for off in range(0, len(rel) - _REL.size + 1, _REL.size):
            r_offset, r_info = _REL.unpack_from(rel, off)
            sym_i, rtype = r_info >> 32, r_info & 0xFFFFFFFF
            if sym_i >= len(symbols):
                raise ElfError(f"relocation at {r_offset:#x}: bad symbol index {sym_i}")
            sym = symbols[sym_i]
            sym_name = _cstr(strtab, sym[0]) or names[sym[3]] if sym[3] < len(names) else "?"
            if sym[3] != maps_idx or sym_name not in maps:
                raise ElfError(f"relocation at {r_offset:#x} against {sym_name!r}: only maps are supported")
            if rtype != R_BPF_64_64 or r_offset % 8 or r_offset + 16 > len(insns) \
                    or insns[r_offset] != BPF_LD_IMM64:
                raise ElfError(f"relocation at {r_offset:#x} against {sym_name!r}: not an ld_imm64")
            relocations.append((r_offset // 8, sym_name))

    lic = body(names.index("license")).split(b"\0", 1)[0].decode() if "license" in names else ""
    return BpfObject(prog_name, names[prog], insns, relocations, maps, lic)


def load(obj: BpfObject, *, maps: Mapping[str, bpf.Map] | None = None,
         sizes: Mapping[str, int] | None = None, prog_type: int = bpf.BPF_PROG_TYPE_SCHED_CLS) -> Loaded:
    """Create the object's maps (those not in ``maps``; ``sizes`` overrides max_entries),
    patch the map references and load the program. Raises ``LoadError`` on a verifier
    rejection, ``OSError``/``KernelError`` otherwise; frees what it made on failure."""
    given = dict(maps or {})
    sizes = dict(sizes or {})
    owned: list[bpf.Map] = []
    made: dict[str, bpf.Map] = {}
    try:
        for name, d in obj.maps.items():
            if name in given:
                made[name] = given[name]
                continue
            if d.map_type == bpf.BPF_MAP_TYPE_ARRAY_OF_MAPS:
                raise ElfError(f"map {name!r} is a map of maps: the caller must create it")
            m = bpf.Map(d.map_type, d.key_size, d.value_size, sizes.get(name, d.max_entries),
                        name, flags=d.flags)
            owned.append(m)
            made[name] = m
        insns = bytearray(obj.insns)
        for index, sym in obj.relocations:
            off = index * 8
            insns[off + 1] = (insns[off + 1] & 0x0F) | (BPF_PSEUDO_MAP_FD << 4)
            struct.pack_into("<i", insns, off + 4, made[sym].fd)
        try:
            fd = bpf.load_program(bytes(insns), prog_type=prog_type, name=obj.name[:15])
        except KernelError as exc:
            text = str(exc)
            reason = text.splitlines()[0] if text else "rejected"
            tail = "\n".join(line for line in text.splitlines()[1:] if line.strip())
            raise LoadError(obj.name, reason, "\n".join(tail.splitlines()[-8:])) from exc
    except BaseException:
        for m in owned:
            m.close()
        raise
    return Loaded(obj.name, fd, made, owned)


def load_file(path: str, **kwargs: object) -> Loaded:
    with open(path, "rb") as f:
        obj = parse(f.read())
    return load(obj, **kwargs)  # type: ignore[arg-type]
