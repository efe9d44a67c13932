"""Directed-route SMPs relayed by the kernel at intermediate switches (eBPF, cls_bpf).

Where the kernel SMA loads (``ibemu.kernel.sma``, C) it does these relays itself, and more;
this program (the assembler's, no compiler needed) is the fallback where it does not.

A directed-route SMP crosses every switch on its path twice, and at all but the last one the
switch only relays it: on the way out (D=0, 1 <= HopPointer < HopCount) ReturnPath[hp] =
ingress port, hp += 1, send on InitialPath[hp]; on the way back (D=1, 2 <= hp <= HopCount)
hp -= 1, send on ReturnPath[hp] (../shared/ref/ib-wire.md, C14-9 / C14-13; the same rules
as ``ibemu.agents.dr``). In Python every relay costs a wake-up, a recv, the strict check,
the rewrite and a send (~30 us of the agent host's one core). This program does exactly
those relays in the kernel (~3.5 us, ``bpf.test_run``), as a direct-action ``bpf`` filter on
the switch's shared tc block, which sees every frame of every port the LFT does not forward:

- it takes only a canonical management packet: 0x88B5, 304 bytes, VL15, LNH IBA local,
  DLID permissive, PktLen 72, UD SEND Only with no pad to QP0, class 0x81 (directed route);
- it checks the VCRC and the ICRC as the agent's strict check does (a frame that fails is
  left to the agent, which counts it on its port);
- it relays only the two cases above, through ports the agent host has told it about (a
  per-port map, keyed by the receiving port's MAC and checked against the ingress ifindex)
  and only while the switch's relay is enabled and the egress port has carrier;
- it rewrites hop pointer and return path, recomputes ICRC and VCRC, sets the Ethernet
  addresses of the egress cable and redirects the frame to the egress port.

Anything else (the last hop, which the switch's SMA answers; LID-routed heads and tails;
bad hop pointers; unknown ports; a disabled switch) returns TC_ACT_UNSPEC: no filter
after it, so the frame goes up to the agent's packet socket exactly as before. The agent host disables a switch's relay while an
SMP-loss fault is set on it or it is powered off. Relayed frames are not counted in the
switch's PortCounters (like data frames the tc LFT forwards).
"""

from __future__ import annotations

import os
import struct
import zlib

from ibemu.kernel import bpf
from ibemu.kernel.bpf import R0, R1, R2, R3, R4, R5, R6, R7, R8, R9, R10, Asm
from ibemu.kernel.packet import ETH_P_IB
from ibemu.kernel.tc_netlink import BlockFilters

ETH = 14
MAD = ETH + 28
FRAME_LEN = ETH + 290
ICRC_AT = ETH + 284
VCRC_AT = ETH + 288
HP = MAD + 6
HC = MAD + 7
STATUS = MAD + 4
INITIAL_PATH = MAD + 128
RETURN_PATH = MAD + 192

FLAG_ENABLED = 1

# stack slots (offsets from r10)
_S_PORT_KEY = -8
_S_EGRESS_KEY = -16
_S_TABLE_KEY = -24
_S_HP = -32
_S_DIR = -40
_S_EGRESS = -48
_S_INGRESS = -56
_S_EVAL = -64

CRC32_TABLE = bpf.crc_table(0xEDB88320, 32)
CRC16_TABLE = bpf.crc_table(0xD008, 16)  # VCRC: poly 0x100B, reflected


def _crc_loop(a: Asm, crc: int, start: int, end: int, table_off: int, *, tables: int = R9) -> None:
    """crc = T[(crc ^ pkt[i]) & 0xff] ^ (crc >> 8) for frame bytes start .. end-1 (r7 = data)."""
    loop = a.fresh("crc")
    a.movi(R3, start)
    a.label(loop)
    a.mov(R4, R7)
    a.alu64("add", R4, R3, reg=True)
    a.mov(R5, R4)
    a.alu64("add", R5, 1)
    a.jmp("jgt", R5, R8, "next", reg=True)
    a.ldx(1, R5, R4, 0)
    a.alu64("xor", R5, crc, reg=True)
    a.alu64("and", R5, 0xFF)
    a.alu64("lsh", R5, 2)
    a.mov(R1, tables)
    a.alu64("add", R1, R5, reg=True)
    a.ldx(4, R1, R1, table_off)
    a.alu64("rsh", crc, 8)
    a.alu64("xor", crc, R1, reg=True)
    a.alu64("add", R3, 1)
    a.jmp("jlt", R3, end, loop)


def _crc_byte(a: Asm, crc: int, value: int, table_off: int, *, tables: int = R9) -> None:
    a.mov(R5, crc)
    a.alu64("xor", R5, value)
    a.alu64("and", R5, 0xFF)
    a.alu64("lsh", R5, 2)
    a.mov(R1, tables)
    a.alu64("add", R1, R5, reg=True)
    a.ldx(4, R1, R1, table_off)
    a.alu64("rsh", crc, 8)
    a.alu64("xor", crc, R1, reg=True)


def _icrc(a: Asm, crc: int) -> None:
    """ICRC of the frame's IB packet into ``crc``: LRH .. BTH byte 3, 0xFF for BTH byte 4
    (the VL nibble masked to ones is already ones on VL15), then the rest up to the ICRC."""
    a.alu32("mov", crc, -1)  # 0xFFFFFFFF, zero-extended
    _crc_loop(a, crc, ETH, ETH + 12, 0)
    _crc_byte(a, crc, 0xFF, 0)
    _crc_loop(a, crc, ETH + 13, ICRC_AT, 0)
    a.alu32("xor", crc, -1)


def _vcrc(a: Asm, crc: int) -> None:
    a.movi(crc, 0xFFFF)
    _crc_loop(a, crc, ETH, VCRC_AT, 1024)
    a.alu64("xor", crc, 0xFFFF)


def program(ports_fd: int, egress_fd: int, tables_fd: int) -> bytes:
    """The relay program, bound to its three maps."""
    a = Asm()
    a.mov(R6, R1)
    a.ldx(4, R2, R6, bpf.SKB_LEN)
    a.jmp("jne", R2, FRAME_LEN, "next")
    a.ldx(4, R7, R6, bpf.SKB_DATA)
    a.ldx(4, R8, R6, bpf.SKB_DATA_END)
    a.mov(R2, R7)
    a.alu64("add", R2, FRAME_LEN)
    a.jmp("jgt", R2, R8, "next", reg=True)
    # headers of a canonical management packet (see the module docstring)
    a.ldx(2, R2, R7, 12)
    a.jmp("jne", R2, 0xB588, "next")  # 88 B5, read little-endian
    a.ldx(1, R2, R7, ETH + 0)
    a.alu64("and", R2, 0xF0)
    a.jmp("jne", R2, 0xF0, "next")  # VL15
    a.ldx(1, R2, R7, ETH + 1)
    a.alu64("and", R2, 0x03)
    a.jmp("jne", R2, 2, "next")  # LNH: IBA local
    a.ldx(2, R2, R7, ETH + 2)
    a.jmp("jne", R2, 0xFFFF, "next")  # DLID permissive
    a.ldx(2, R2, R7, ETH + 4)
    a.alu64("and", R2, 0xFF07)
    a.jmp("jne", R2, 72 << 8, "next")  # PktLen 72 words
    a.ldx(1, R2, R7, ETH + 8)
    a.jmp("jne", R2, 0x64, "next")  # UD SEND Only
    a.ldx(1, R2, R7, ETH + 9)
    a.alu64("and", R2, 0x30)
    a.jmp("jne", R2, 0, "next")  # no pad
    a.ldx(1, R2, R7, ETH + 13)
    a.ldx(1, R3, R7, ETH + 14)
    a.alu64("or", R2, R3, reg=True)
    a.ldx(1, R3, R7, ETH + 15)
    a.alu64("or", R2, R3, reg=True)
    a.jmp("jne", R2, 0, "next")  # QP0
    a.ldx(1, R2, R7, MAD + 1)
    a.jmp("jne", R2, 0x81, "next")  # directed-route SMP class
    a.ldx(1, R3, R7, HC)
    a.jmp("jgt", R3, 63, "next")
    a.ldx(1, R2, R7, HP)
    a.ldx(1, R4, R7, STATUS)
    a.jmp("jset", R4, 0x80, "returning")
    # outgoing: 1 <= hp < n, egress = InitialPath[hp + 1]
    a.jmp("jeq", R2, 0, "next")
    a.jmp("jge", R2, R3, "next", reg=True)
    a.stx(8, R10, _S_HP, R2)
    a.st(8, R10, _S_DIR, 0)
    a.mov(R4, R7)
    a.alu64("add", R4, R2, reg=True)
    a.mov(R5, R4)
    a.alu64("add", R5, INITIAL_PATH + 2)
    a.jmp("jgt", R5, R8, "next", reg=True)
    a.ldx(1, R5, R4, INITIAL_PATH + 1)
    a.goto("egress")
    # returning: 2 <= hp <= n, egress = ReturnPath[hp - 1]
    a.label("returning")
    a.jmp("jlt", R2, 2, "next")
    a.jmp("jgt", R2, R3, "next", reg=True)
    a.stx(8, R10, _S_HP, R2)
    a.st(8, R10, _S_DIR, 1)
    a.mov(R4, R7)
    a.alu64("add", R4, R2, reg=True)
    a.mov(R5, R4)
    a.alu64("add", R5, RETURN_PATH)
    a.jmp("jgt", R5, R8, "next", reg=True)
    a.ldx(1, R5, R4, RETURN_PATH - 1)
    a.label("egress")
    a.jmp("jeq", R5, 0, "next")
    a.stx(8, R10, _S_EGRESS, R5)
    # the ingress port: keyed by the receiving port's MAC, checked against the ifindex
    a.ldx(4, R2, R7, 0)
    a.stx(4, R10, _S_PORT_KEY, R2)
    a.ldx(2, R2, R7, 4)
    a.stx(2, R10, _S_PORT_KEY + 4, R2)
    a.st(2, R10, _S_PORT_KEY + 6, 0)
    a.map_lookup(ports_fd, _S_PORT_KEY)
    a.jmp("jeq", R0, 0, "next")
    a.ldx(4, R2, R0, 0)
    a.ldx(4, R3, R6, bpf.SKB_IFINDEX)
    a.jmp("jne", R2, R3, "next", reg=True)
    a.ldx(4, R2, R0, 12)
    a.jmp("jset", R2, FLAG_ENABLED, "enabled")
    a.goto("next")
    a.label("enabled")
    a.ldx(4, R2, R0, 8)
    a.stx(8, R10, _S_INGRESS, R2)
    a.ldx(4, R3, R0, 4)
    a.alu64("lsh", R3, 8)
    a.ldx(8, R4, R10, _S_EGRESS)
    a.alu64("or", R3, R4, reg=True)
    a.stx(4, R10, _S_EGRESS_KEY, R3)
    a.map_lookup(egress_fd, _S_EGRESS_KEY)
    a.jmp("jeq", R0, 0, "next")
    a.ldx(4, R2, R0, 4)
    a.jmp("jeq", R2, 0, "next")  # egress without carrier: the agent discards and counts
    a.stx(8, R10, _S_EVAL, R0)
    a.st(4, R10, _S_TABLE_KEY, 0)
    a.map_lookup(tables_fd, _S_TABLE_KEY)
    a.jmp("jeq", R0, 0, "next")
    a.mov(R9, R0)
    # the strict check: VCRC and ICRC as received
    _vcrc(a, R6)
    a.ldx(2, R2, R7, VCRC_AT)
    a.jmp("jne", R6, R2, "next", reg=True)
    _icrc(a, R6)
    a.ldx(4, R2, R7, ICRC_AT)
    a.jmp("jne", R6, R2, "next", reg=True)
    # rewrite hop pointer (and return path going out)
    a.ldx(8, R2, R10, _S_HP)
    a.ldx(8, R3, R10, _S_DIR)
    a.jmp("jne", R3, 0, "back")
    a.mov(R4, R7)
    a.alu64("add", R4, R2, reg=True)
    a.mov(R5, R4)
    a.alu64("add", R5, RETURN_PATH + 1)
    a.jmp("jgt", R5, R8, "next", reg=True)
    a.ldx(8, R5, R10, _S_INGRESS)
    a.stx(1, R4, RETURN_PATH, R5)
    a.alu64("add", R2, 1)
    a.stx(1, R7, HP, R2)
    a.goto("reseal")
    a.label("back")
    a.alu64("sub", R2, 1)
    a.stx(1, R7, HP, R2)
    a.label("reseal")
    _icrc(a, R6)
    a.stx(4, R7, ICRC_AT, R6)
    _vcrc(a, R6)
    a.stx(2, R7, VCRC_AT, R6)
    # Ethernet addresses of the egress cable, then out
    a.ldx(8, R4, R10, _S_EVAL)
    a.ldx(4, R2, R4, 8)
    a.stx(4, R7, 0, R2)
    a.ldx(2, R2, R4, 12)
    a.stx(2, R7, 4, R2)
    a.ldx(4, R2, R4, 14)
    a.stx(4, R7, 6, R2)
    a.ldx(2, R2, R4, 18)
    a.stx(2, R7, 10, R2)
    a.ldx(4, R1, R4, 0)
    a.movi(R2, 0)
    a.call(bpf.FN_REDIRECT)
    a.exit()
    a.label("next")
    a.movi(R0, bpf.TC_ACT_UNSPEC)
    a.exit()
    return a.assemble()


def port_key(mac: bytes) -> bytes:
    return bytes(mac[:6]) + b"\0\0"


def port_value(ifindex: int, switch_id: int, port: int, enabled: bool) -> bytes:
    return struct.pack("=IIII", ifindex, switch_id, port, FLAG_ENABLED if enabled else 0)


def egress_key(switch_id: int, port: int) -> bytes:
    return struct.pack("=I", (switch_id << 8) | port)


def egress_value(ifindex: int, up: bool, peer_mac: bytes, own_mac: bytes) -> bytes:
    return struct.pack("=II", ifindex, int(up)) + bytes(peer_mac[:6]) + bytes(own_mac[:6])


class DrRelay:
    """The loaded program and its maps; ports are added with ``add_port``, each switch's tc
    block gets the program with ``attach``."""

    def __init__(self, max_ports: int = 65536) -> None:
        self.ports = bpf.Map(bpf.BPF_MAP_TYPE_HASH, 8, 16, max_ports, "ibemu_dr_in")
        self.egress = bpf.Map(bpf.BPF_MAP_TYPE_HASH, 4, 20, max_ports, "ibemu_dr_out")
        self.tables = bpf.Map(bpf.BPF_MAP_TYPE_ARRAY, 4, 2048, 1, "ibemu_dr_crc")
        self.tables.update(b"\0\0\0\0", bpf.pack_u32s(CRC32_TABLE) + bpf.pack_u32s(CRC16_TABLE))
        self.prog_fd = -1
        self._in: dict[tuple[int, int], tuple[bytes, int]] = {}  # (switch, port) -> (MAC key, ifindex)
        self._out: dict[tuple[int, int], tuple[int, bytes, bytes]] = {}
        self._enabled: dict[int, bool] = {}
        try:
            self.prog_fd = bpf.load_program(program(self.ports.fd, self.egress.fd, self.tables.fd),
                                            name="ibemu_dr_relay")
        except BaseException:
            self.close()
            raise

    def add_port(self, switch_id: int, port: int, ifindex: int, mac: bytes, peer_mac: bytes,
                 *, up: bool, enabled: bool = True) -> None:
        """Port ``port`` of switch ``switch_id`` (any number below 2**24) is ``ifindex`` in the
        switch's namespace, with ``mac``; its cable's far end has ``peer_mac``."""
        self._in[(switch_id, port)] = (port_key(mac), ifindex)
        self._out[(switch_id, port)] = (ifindex, peer_mac, mac)
        self._enabled.setdefault(switch_id, enabled)
        self.ports.update(port_key(mac), port_value(ifindex, switch_id, port, self._enabled[switch_id]))
        self.egress.update(egress_key(switch_id, port), egress_value(ifindex, up, peer_mac, mac))

    def set_carrier(self, switch_id: int, port: int, up: bool) -> None:
        out = self._out.get((switch_id, port))
        if out is not None:
            ifindex, peer_mac, mac = out
            self.egress.update(egress_key(switch_id, port), egress_value(ifindex, up, peer_mac, mac))

    def set_enabled(self, switch_id: int, enabled: bool) -> None:
        """Relay this switch's SMPs in the kernel (True) or hand them all to its agent."""
        if self._enabled.get(switch_id) == enabled:
            return
        self._enabled[switch_id] = enabled
        for (sw, port), (key, ifindex) in self._in.items():
            if sw == switch_id:
                self.ports.update(key, port_value(ifindex, sw, port, enabled))

    def attach(self, ns: str, prio: int) -> None:
        """Take the directed-route SMPs of the switch in ``ns`` (its tc block, see
        ``tc_netlink.BlockFilters.replace_dr_rule_with_bpf``). Blocking: enters ``ns``."""
        filters = BlockFilters(ns, block=1, prio=prio, protocol=ETH_P_IB)
        try:
            filters.replace_dr_rule_with_bpf(self.prog_fd, prio=prio + 1)
        finally:
            filters.close()

    def close(self) -> None:
        """Free the program and maps (filters that use the program keep it alive)."""
        if self.prog_fd >= 0:
            os.close(self.prog_fd)
            self.prog_fd = -1
        for m in (self.ports, self.egress, self.tables):
            m.close()


def _self_check() -> None:
    """The tables agree with the CRCs the agents use (zlib's CRC-32 and ibemu's VCRC)."""
    from ibemu.wire.crc import vcrc

    data = bytes(range(256)) * 2
    c = 0xFFFFFFFF
    for b in data:
        c = CRC32_TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    assert c ^ 0xFFFFFFFF == zlib.crc32(data)
    v = 0xFFFF
    for b in data:
        v = CRC16_TABLE[(v ^ b) & 0xFF] ^ (v >> 8)
    assert v ^ 0xFFFF == vcrc(data)
