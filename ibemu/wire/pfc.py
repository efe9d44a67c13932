"""IEEE 802.1Qbb priority flow control frames (sans-IO): build, parse, quanta to time.

A PFC frame is a MAC control frame: to 01:80:C2:00:00:01, EtherType 0x8808, opcode 0x0101,
a class-enable vector (bit p: the time of priority p is valid) and eight 16-bit pause times
in quanta of 512 bit times at the port's line rate; quanta 0 for an enabled priority is XON.
Padded to the 60-byte minimum frame (without FCS).
"""

from __future__ import annotations

import struct

PFC_DST = bytes.fromhex("0180c2000001")
ETH_P_PAUSE = 0x8808
PFC_OPCODE = 0x0101
PRIORITIES = 8
MAX_QUANTA = 0xFFFF
QUANTUM_BITS = 512
MIN_FRAME = 60
_BODY = struct.Struct("!HHH8H")  # ethertype, opcode, class-enable vector, 8 times


def pause_frame(src_mac: bytes, quanta: dict[int, int]) -> bytes:
    """A PFC frame from ``src_mac`` pausing each priority of ``quanta`` (0 = XON)."""
    if len(src_mac) != 6:
        raise ValueError("a MAC address is 6 bytes")
    vector = 0
    times = [0] * PRIORITIES
    for prio, q in quanta.items():
        if not 0 <= prio < PRIORITIES or not 0 <= q <= MAX_QUANTA:
            raise ValueError(f"priority {prio} / quanta {q} out of range")
        vector |= 1 << prio
        times[prio] = q
    frame = PFC_DST + src_mac + _BODY.pack(ETH_P_PAUSE, PFC_OPCODE, vector, *times)
    return frame + bytes(MIN_FRAME - len(frame))


def parse_pause(frame: bytes | bytearray | memoryview) -> dict[int, int] | None:
    """Priority -> quanta of a PFC frame (enabled priorities only); None if it is not one."""
    if len(frame) < 12 + _BODY.size:
        return None
    etype, opcode, vector, *times = _BODY.unpack_from(frame, 12)
    if etype != ETH_P_PAUSE or opcode != PFC_OPCODE:
        return None
    return {p: times[p] for p in range(PRIORITIES) if vector >> p & 1}


def quanta_ns(quanta: int, line_gbps: float) -> int:
    """How long ``quanta`` pause quanta last at ``line_gbps``."""
    return round(quanta * QUANTUM_BITS / line_gbps)


def is_pause(frame: bytes | bytearray | memoryview) -> bool:
    return len(frame) >= 14 and frame[12] == 0x88 and frame[13] == 0x08
