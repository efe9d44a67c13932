"""The eBPF object loader (``ibemu.kernel.elf``): parsing objects written here byte by byte
(no compiler needed), the real ``sma.c`` object when clang is there, and, as root, loading."""

from __future__ import annotations

import os
import struct
import subprocess
from pathlib import Path

import pytest

from ibemu.kernel import elf

LD_IMM64_R1 = struct.pack("<BBhi", 0x18, 0x01, 0, 0) + bytes(8)  # r1 = <map> (two slots)
MOV_R0_0 = struct.pack("<BBhi", 0xB7, 0x00, 0, 0)
EXIT = struct.pack("<BBhi", 0x95, 0, 0, 0)


def make_object(sections: dict[str, bytes], symbols: list[tuple[str, str, int, int]],
                relocs: dict[str, list[tuple[int, str]]], *, exec_sections: tuple[str, ...] = ("tc",),
                machine: int = 247) -> bytes:
    """A minimal ELF64 LE object: ``sections`` name -> body; ``symbols`` (name, section,
    value, type); ``relocs`` program section -> [(offset, symbol)]."""
    names = ["", *sections, *[f".rel{s}" for s in relocs], ".symtab", ".strtab", ".shstrtab"]
    shstr = b"\0".join(n.encode() for n in names) + b"\0"
    name_off = {n: shstr.index(n.encode() + b"\0") if n else 0 for n in names}
    strtab = b"\0" + b"".join(s[0].encode() + b"\0" for s in symbols)
    index = {n: i for i, n in enumerate(names)}
    syms = bytes(24)
    str_off = 1
    sym_index = {}
    for i, (name, sec, value, stype) in enumerate(symbols, 1):
        syms += struct.pack("<IBBHQQ", str_off, 0x10 | stype, 0, index[sec], value, 20)
        sym_index[name] = i
        str_off += len(name) + 1
    bodies: dict[str, bytes] = dict(sections)
    for sec, rels in relocs.items():
        bodies[f".rel{sec}"] = b"".join(struct.pack("<QQ", off, (sym_index[sym] << 32) | 1) for off, sym in rels)
    bodies[".symtab"], bodies[".strtab"], bodies[".shstrtab"] = syms, strtab, shstr
    data = bytearray(64)
    offsets = {}
    for n in names[1:]:
        offsets[n] = len(data)
        data += bodies[n]
        data += bytes(-len(data) % 8)
    shoff = len(data)
    data += bytes(64)
    for n in names[1:]:
        stype = 2 if n == ".symtab" else 3 if n in (".strtab", ".shstrtab") else 9 if n.startswith(".rel") else 1
        flags = 0x6 if n in exec_sections or n == ".text" else 0x3
        link = index[".strtab"] if n == ".symtab" else index[".symtab"] if n.startswith(".rel") else 0
        info = index[n[4:]] if n.startswith(".rel") else 0
        data += struct.pack("<IIQQQQIIQQ", name_off[n], stype, flags, 0, offsets[n], len(bodies[n]),
                            link, info, 8, 0)
    ident = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    struct.pack_into("<16sHHIQQQIHHHHHH", data, 0, ident, 1, machine, 1, 0, 0, shoff, 0, 64, 0, 0,
                     64, len(names), index[".shstrtab"])
    return bytes(data)


def simple(**kw: object) -> bytes:
    prog = LD_IMM64_R1 + MOV_R0_0 + EXIT
    maps = struct.pack("<5I", 2, 4, 8, 4, 0)
    return make_object({".text": b"", "tc": prog, "maps": maps, "license": b"GPL\0"},
                       [("prog", "tc", 0, 2), ("counts", "maps", 0, 1)],
                       {"tc": [(0, "counts")]}, **kw)  # type: ignore[arg-type]


def test_parse_finds_program_maps_and_relocations() -> None:
    obj = elf.parse(simple())
    assert obj.name == "prog" and obj.section == "tc" and obj.license == "GPL"
    assert obj.maps == {"counts": elf.MapDef("counts", 2, 4, 8, 4, 0)}
    assert obj.relocations == [(0, "counts")]
    assert len(obj.insns) == 32


@pytest.mark.parametrize("case, message", [
    ("not_elf", "not an ELF"),
    ("machine", "not an eBPF object"),
    ("truncated", "truncated"),
    ("text_code", "BPF-to-BPF"),
    ("two_programs", "one program section"),
    ("reloc_not_map", "only maps"),
    ("reloc_not_ld_imm64", "not an ld_imm64"),
])
def test_parse_refuses_what_it_does_not_support(case: str, message: str) -> None:
    prog = LD_IMM64_R1 + MOV_R0_0 + EXIT
    maps = struct.pack("<5I", 2, 4, 8, 4, 0)
    base = {".text": b"", "tc": prog, "maps": maps, "license": b"GPL\0"}
    syms = [("prog", "tc", 0, 2), ("counts", "maps", 0, 1)]
    data: bytes
    if case == "not_elf":
        data = b"\0" * 100
    elif case == "machine":
        data = simple(machine=62)
    elif case == "truncated":
        data = simple()[:-100]
    elif case == "text_code":
        data = make_object({**base, ".text": MOV_R0_0 + EXIT}, syms, {"tc": [(0, "counts")]})
    elif case == "two_programs":
        data = make_object({**base, "xdp": MOV_R0_0 + EXIT}, syms, {"tc": [(0, "counts")]},
                           exec_sections=("tc", "xdp"))
    elif case == "reloc_not_map":
        data = make_object(base, [*syms, ("helper", "license", 0, 1)], {"tc": [(0, "helper")]})
    else:
        data = make_object(base, syms, {"tc": [(16, "counts")]})
    with pytest.raises(elf.ElfError, match=message):
        elf.parse(data)


def test_parse_the_sma_object() -> None:
    from ibemu.kernel import sma

    if subprocess.run(["sh", "-c", "command -v clang"], capture_output=True).returncode:
        pytest.skip("clang is not installed")
    path, why = sma.object_path()
    assert path is not None, why
    with open(path, "rb") as f:
        obj = elf.parse(f.read())
    assert obj.name == "ibemu_sma" and obj.license == "GPL"
    assert set(obj.maps) == {"sma_ports", "sma_out", "sma_dev", "sma_attr", "sma_crc", "sma_lft", "sma_fwd",
                            "sma_log", "sma_tail", "sma_rdelta", "sma_vcnt", "sma_scratch"}
    assert {sym for _i, sym in obj.relocations} == set(obj.maps)
    for i, _sym in obj.relocations:
        assert obj.insns[i * 8] == elf.BPF_LD_IMM64


@pytest.mark.root
def test_load_patches_map_references_and_reports_rejections() -> None:
    from ibemu.kernel import bpf

    if os.geteuid() != 0:
        pytest.skip("needs root (BPF_PROG_LOAD)")
    # r1 = map; r2 = fp-4 with key 0; r0 = lookup; if r0 == 0 return 0; return *(u32 *)r0
    key = struct.pack("<BBhi", 0x62, 0x0A, -4, 0)  # *(u32 *)(r10 - 4) = 0
    r2 = struct.pack("<BBhi", 0xBF, 0xA2, 0, 0) + struct.pack("<BBhi", 0x07, 0x02, 0, -4)
    call = struct.pack("<BBhi", 0x85, 0, 0, 1)
    jeq = struct.pack("<BBhi", 0x15, 0x00, 1, 0)  # if r0 == 0 goto +1
    ld = struct.pack("<BBhi", 0x61, 0x00, 0, 0)  # r0 = *(u32 *)(r0 + 0)
    prog = key + LD_IMM64_R1 + r2 + call + jeq + ld + EXIT
    maps = struct.pack("<5I", 2, 4, 4, 1, 0)
    data = make_object({".text": b"", "tc": prog, "maps": maps, "license": b"GPL\0"},
                       [("answer", "tc", 0, 2), ("value", "maps", 0, 1)], {"tc": [(8, "value")]})
    loaded = elf.load(elf.parse(data))
    try:
        loaded.maps["value"].update(b"\0\0\0\0", struct.pack("<I", 42))
        assert bpf.test_run(loaded.prog_fd, bytes(64))[0] == 42
    finally:
        loaded.close()
    # the same on a hash map without the NULL check: the verifier refuses it, and says why
    hash_map = struct.pack("<5I", 1, 4, 4, 1, 0)
    bad = elf.parse(make_object({".text": b"", "tc": key + LD_IMM64_R1 + r2 + call + ld + EXIT, "maps": hash_map,
                                 "license": b"GPL\0"},
                                [("careless", "tc", 0, 2), ("value", "maps", 0, 1)], {"tc": [(8, "value")]}))
    with pytest.raises(elf.LoadError) as info:
        elf.load(bad)
    assert info.value.name == "careless"
    assert "map_value_or_null" in info.value.tail or "invalid mem access" in info.value.tail


def test_without_clang_or_object_the_reason_is_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No object beside the source, none cached, no clang: no path, and why (the agent
    host logs that one line and runs the agents)."""
    from ibemu.kernel import sma

    src = tmp_path / "prog.c"
    src.write_text("int x;\n")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    path, why = sma.object_path(str(src))
    assert path is None and "clang" in why
    assert sma.object_path(str(tmp_path / "missing.c"))[0] is None
