"""Classic BPF socket filters that split a host port's IB frames between its two readers.

A host port has two AF_PACKET readers: the HCA's management agent (QP0/QP1: SMPs, GMPs,
the MAD socket's traffic) in the agent host, and the transport (data QPs) of whatever
workload runs on the host. Each attaches a filter so the kernel hands it only its share:
at 100,000 data packets/s the agent host would otherwise wake for every one.

Frames are Ethernet (14 bytes) + LRH (8) [+ GRH (40) when LNH = 3] + BTH; DestQP is the low
24 bits of the BTH's second word. Raw (LNH 0/1) frames go to the management agent, which
counts them as errors; frames too short to hold a BTH are dropped by both filters.
"""

from __future__ import annotations

import ctypes
import socket
import struct

SO_ATTACH_FILTER = 26

# BPF opcodes (linux/filter.h)
_LD_B_ABS = 0x30
_LD_W_ABS = 0x20
_LD_H_ABS = 0x28
_ALU_AND_K = 0x54
_JEQ_K = 0x15
_JGT_K = 0x25
_JGE_K = 0x35
_RET_K = 0x06

_ETH = 14
_LRH_B1 = _ETH + 1
_QP_WORD_LOCAL = _ETH + 8 + 4   # BTH word 1 (resv8 | DestQP), no GRH
_QP_WORD_GLOBAL = _ETH + 48 + 4  # ... behind a GRH
ACCEPT = 0x40000
"""Bytes of a frame a filter keeps (all of it: frames are at most 9 KiB)."""

Insn = tuple[int, int, int, int]


def _qp_split(mad_side: bool) -> list[Insn]:
    """Accept frames for QP0/QP1 (``mad_side``) or for every other QP (the data side)."""
    mad, data = (ACCEPT, 0) if mad_side else (0, ACCEPT)
    return [
        *_qp_prefix(mad),
        (_JGT_K, 0, 1, 1),                     # 9: DestQP > 1 -> 10 else 11
        (_RET_K, 0, 0, data),                  # 10
        (_RET_K, 0, 0, mad),                   # 11
    ]


def _qp_prefix(raw_verdict: int) -> list[Insn]:
    """Load DestQP into A (instructions 0-8); raw IB frames get ``raw_verdict``."""
    return [
        (_LD_B_ABS, 0, 0, _LRH_B1),            # 0: A = LRH byte 1
        (_ALU_AND_K, 0, 0, 3),                 # 1: A = LNH
        (_JEQ_K, 2, 0, 2),                     # 2: LNH 2 (BTH follows) -> 5
        (_JEQ_K, 3, 0, 3),                     # 3: LNH 3 (GRH, then BTH) -> 7
        (_RET_K, 0, 0, raw_verdict),           # 4: raw IB or IPv6
        (_LD_W_ABS, 0, 0, _QP_WORD_LOCAL),     # 5
        (0x05, 0, 0, 1),                       # 6: ja +1 -> 8
        (_LD_W_ABS, 0, 0, _QP_WORD_GLOBAL),    # 7
        (_ALU_AND_K, 0, 0, 0xFFFFFF),          # 8: A = DestQP
    ]


def qp_range(first: int, end: int) -> list[Insn]:
    """Frames for QPs ``first`` .. ``end - 1`` only: one process's share of a host port.

    Processes that share a host port (two flows ending on one host) take disjoint QP number
    ranges, and the kernel hands each only its own frames, as an HCA demultiplexes QPs.
    """
    if not 2 <= first < end <= 1 << 24:
        raise ValueError("a QP range lies within 2 .. 2^24")
    return [
        *_qp_prefix(0),
        (_JGE_K, 0, 2, first),                 # 9: DestQP >= first -> 10 else 12
        (_JGE_K, 1, 0, end),                   # 10: DestQP >= end -> 12 else 11
        (_RET_K, 0, 0, ACCEPT),                # 11
        (_RET_K, 0, 0, 0),                     # 12
    ]


_MAD = _ETH + 8 + 12 + 8  # LRH, BTH, DETH


SM_REPLIES: list[Insn] = [
    (_LD_B_ABS, 0, 0, _LRH_B1),               # 0: A = LRH byte 1
    (_ALU_AND_K, 0, 0, 3),                    # 1: A = LNH
    (_JEQ_K, 0, 9, 2),                        # 2: LNH 2 (IBA local) -> 3 else reject
    (_LD_W_ABS, 0, 0, _QP_WORD_LOCAL),        # 3
    (_ALU_AND_K, 0, 0, 0xFFFFFF),             # 4: A = DestQP
    (_JEQ_K, 0, 6, 0),                        # 5: QP0 -> 6 else reject
    (_LD_B_ABS, 0, 0, _MAD + 1),              # 6: A = management class
    (_ALU_AND_K, 0, 0, 0x7F),                 # 7: 0x01 (LID-routed) or 0x81 (directed route)
    (_JEQ_K, 0, 3, 1),                        # 8: SMP -> 9 else reject
    (_LD_B_ABS, 0, 0, _MAD + 3),              # 9: A = method
    (_JEQ_K, 2, 0, 0x81),                     # 10: GetResp -> accept
    (_JEQ_K, 1, 0, 0x05),                     # 11: Trap -> accept
    (_RET_K, 0, 0, 0),                        # 12: reject
    (_RET_K, 0, 0, ACCEPT),                   # 13: accept
]
"""QP0 GetResp and Trap frames: what a subnet manager's own port takes (``sm.directport``)."""

MANAGEMENT_ONLY = _qp_split(True)
"""QP0/QP1 frames (and malformed ones): the HCA's management agent."""

SM_OWN_TID_TAG = 0xFFFF
"""TID bits 63..48 of the SMPs a subnet manager sends from its own packet socket
(``sm.directport``): a slot the MAD socket never gives a client."""

CA_MANAGEMENT: list[Insn] = [
    *_qp_prefix(ACCEPT),
    (_JGT_K, 0, 1, 1),                         # 9: DestQP > 1 -> 10 else 11
    (_RET_K, 0, 0, 0),                         # 10: a data QP's
    (_JEQ_K, 0, 7, 0),                         # 11: QP0 -> 12 else 19 (QP1: accept)
    (_LD_B_ABS, 0, 0, _LRH_B1),                # 12
    (_ALU_AND_K, 0, 0, 3),                     # 13: A = LNH
    (_JEQ_K, 0, 4, 2),                         # 14: no GRH -> 15 else 19
    (_LD_B_ABS, 0, 0, _MAD + 3),               # 15: A = method
    (_JEQ_K, 0, 2, 0x81),                      # 16: GetResp -> 17 else 19
    (_LD_H_ABS, 0, 0, _MAD + 8),               # 17: A = TID bits 63..48
    (_JEQ_K, 1, 0, SM_OWN_TID_TAG),            # 18: the SM's own port's -> 20 else 19
    (_RET_K, 0, 0, ACCEPT),                    # 19
    (_RET_K, 0, 0, 0),                         # 20
]
"""A CA's management agent (agent host): ``MANAGEMENT_ONLY`` but for the GetResps to SMPs a
subnet manager sent from its own packet socket on this port (TID tag ``SM_OWN_TID_TAG``),
which that socket takes: an HCA delivers a response to the QP0 owner that sent the request,
once. (The MAD socket would drop the agent's copy as ``no_client``, after the agent host
parsed and checked it in Python: at tens of thousands of SMPs a second, most of its CPU.)"""
DATA_ONLY = _qp_split(False)
"""Frames for data QPs (2 and above): the host's transport."""


def attach(sock: socket.socket, program: list[Insn]) -> None:
    """Attach a classic BPF ``program`` to ``sock`` (SO_ATTACH_FILTER)."""
    code = b"".join(struct.pack("HBBI", op, jt, jf, k) for op, jt, jf, k in program)
    buf = ctypes.create_string_buffer(code, len(code))
    fprog = struct.pack("HL", len(program), ctypes.addressof(buf))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)


def matches(program: list[Insn], frame: bytes) -> bool:
    """Run ``program`` over ``frame`` in Python, as the kernel would (for tests)."""
    a, pc = 0, 0
    while True:
        op, jt, jf, k = program[pc]
        if op == _RET_K:
            return k != 0
        if op == _LD_B_ABS:
            if k >= len(frame):
                return False
            a = frame[k]
        elif op == _LD_W_ABS:
            if k + 4 > len(frame):
                return False
            a = int.from_bytes(frame[k : k + 4], "big")
        elif op == _LD_H_ABS:
            if k + 2 > len(frame):
                return False
            a = int.from_bytes(frame[k : k + 2], "big")
        elif op == _ALU_AND_K:
            a &= k
        elif op == 0x05:
            pc += k
        elif op == _JEQ_K:
            pc += jt if a == k else jf
        elif op == _JGT_K:
            pc += jt if a > k else jf
        elif op == _JGE_K:
            pc += jt if a >= k else jf
        else:  # pragma: no cover - only the opcodes above are emitted
            raise ValueError(f"opcode {op:#x}")
        pc += 1
