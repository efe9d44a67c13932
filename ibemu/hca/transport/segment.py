"""Segmentation of messages into MTU-sized packets: opcodes, packet counts, PSN arithmetic."""

from __future__ import annotations

from ibemu.wire.opcodes import Op, ext_headers_len

PSN_MASK = 0xFFFFFF
PSN_HALF = 1 << 23
MTUS = (256, 512, 1024, 2048, 4096)


def check_mtu(mtu: int) -> int:
    if mtu not in MTUS:
        raise ValueError(f"path MTU {mtu} is not one of {MTUS}")
    return mtu


def npkts(length: int, mtu: int) -> int:
    """Packets (and PSNs) a message of ``length`` bytes takes; a 0-byte message takes one."""
    return max(1, -(-length // mtu))


def psn_diff(a: int, b: int) -> int:
    """``a - b`` in 24-bit PSN space, in ``[-2^23, 2^23)``."""
    d = (a - b) & PSN_MASK
    return d - (1 << 24) if d >= PSN_HALF else d


# (first, middle, last, only) opcodes per message kind, with and without immediate.
SEND_OPS = (Op.SEND_FIRST, Op.SEND_MIDDLE, Op.SEND_LAST, Op.SEND_ONLY)
SEND_IMM_OPS = (Op.SEND_FIRST, Op.SEND_MIDDLE, Op.SEND_LAST_WITH_IMMEDIATE, Op.SEND_ONLY_WITH_IMMEDIATE)
WRITE_OPS = (Op.RDMA_WRITE_FIRST, Op.RDMA_WRITE_MIDDLE, Op.RDMA_WRITE_LAST, Op.RDMA_WRITE_ONLY)
WRITE_IMM_OPS = (Op.RDMA_WRITE_FIRST, Op.RDMA_WRITE_MIDDLE, Op.RDMA_WRITE_LAST_WITH_IMMEDIATE,
                 Op.RDMA_WRITE_ONLY_WITH_IMMEDIATE)
READ_RESP_OPS = (Op.RDMA_READ_RESPONSE_FIRST, Op.RDMA_READ_RESPONSE_MIDDLE,
                 Op.RDMA_READ_RESPONSE_LAST, Op.RDMA_READ_RESPONSE_ONLY)


def segment_opcode(ops: tuple[int, int, int, int], i: int, n: int) -> int:
    """Opcode of packet ``i`` of an ``n``-packet message from ``ops``."""
    if n == 1:
        return ops[3]
    if i == 0:
        return ops[0]
    return ops[2] if i == n - 1 else ops[1]


# Bytes from the LRH to the payload, per opcode (LRH 8 + BTH 12 + extended headers).
HEADER_LEN: dict[int, int] = {code: 20 + ext_headers_len(code) for code in range(256)}
