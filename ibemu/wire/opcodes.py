"""BTH OpCodes: names, transports and the extended headers each one carries.

OpCode = transport (bits 7:5) | operation (bits 4:0). ../shared/ref/ib-wire.md lists them.
"""

from __future__ import annotations

from enum import IntEnum


class Transport(IntEnum):
    RC = 0x00
    UC = 0x20
    RD = 0x40
    UD = 0x60
    CNP = 0x80
    XRC = 0xA0


class Op(IntEnum):
    """Operation codes (low five bits of the OpCode)."""

    SEND_FIRST = 0x00
    SEND_MIDDLE = 0x01
    SEND_LAST = 0x02
    SEND_LAST_WITH_IMMEDIATE = 0x03
    SEND_ONLY = 0x04
    SEND_ONLY_WITH_IMMEDIATE = 0x05
    RDMA_WRITE_FIRST = 0x06
    RDMA_WRITE_MIDDLE = 0x07
    RDMA_WRITE_LAST = 0x08
    RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x09
    RDMA_WRITE_ONLY = 0x0A
    RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x0B
    RDMA_READ_REQUEST = 0x0C
    RDMA_READ_RESPONSE_FIRST = 0x0D
    RDMA_READ_RESPONSE_MIDDLE = 0x0E
    RDMA_READ_RESPONSE_LAST = 0x0F
    RDMA_READ_RESPONSE_ONLY = 0x10
    ACKNOWLEDGE = 0x11
    ATOMIC_ACKNOWLEDGE = 0x12
    COMPARE_SWAP = 0x13
    FETCH_ADD = 0x14
    SEND_LAST_WITH_INVALIDATE = 0x16
    SEND_ONLY_WITH_INVALIDATE = 0x17


CNP_OPCODE = 0x81

# Extended headers after the BTH, per operation (RC/UC/XRC-style transports).
_CHAIN_BY_OP: dict[int, tuple[str, ...]] = {
    Op.SEND_FIRST: (),
    Op.SEND_MIDDLE: (),
    Op.SEND_LAST: (),
    Op.SEND_LAST_WITH_IMMEDIATE: ("ImmDt",),
    Op.SEND_ONLY: (),
    Op.SEND_ONLY_WITH_IMMEDIATE: ("ImmDt",),
    Op.RDMA_WRITE_FIRST: ("RETH",),
    Op.RDMA_WRITE_MIDDLE: (),
    Op.RDMA_WRITE_LAST: (),
    Op.RDMA_WRITE_LAST_WITH_IMMEDIATE: ("ImmDt",),
    Op.RDMA_WRITE_ONLY: ("RETH",),
    Op.RDMA_WRITE_ONLY_WITH_IMMEDIATE: ("RETH", "ImmDt"),
    Op.RDMA_READ_REQUEST: ("RETH",),
    Op.RDMA_READ_RESPONSE_FIRST: ("AETH",),
    Op.RDMA_READ_RESPONSE_MIDDLE: (),
    Op.RDMA_READ_RESPONSE_LAST: ("AETH",),
    Op.RDMA_READ_RESPONSE_ONLY: ("AETH",),
    Op.ACKNOWLEDGE: ("AETH",),
    Op.ATOMIC_ACKNOWLEDGE: ("AETH", "AtomicAckETH"),
    Op.COMPARE_SWAP: ("AtomicETH",),
    Op.FETCH_ADD: ("AtomicETH",),
    Op.SEND_LAST_WITH_INVALIDATE: ("IETH",),
    Op.SEND_ONLY_WITH_INVALIDATE: ("IETH",),
}

_VALID_OPS: dict[Transport, frozenset[int]] = {
    Transport.RC: frozenset(_CHAIN_BY_OP),
    Transport.UC: frozenset(
        {Op.SEND_FIRST, Op.SEND_MIDDLE, Op.SEND_LAST, Op.SEND_LAST_WITH_IMMEDIATE, Op.SEND_ONLY,
         Op.SEND_ONLY_WITH_IMMEDIATE, Op.RDMA_WRITE_FIRST, Op.RDMA_WRITE_MIDDLE,
         Op.RDMA_WRITE_LAST, Op.RDMA_WRITE_LAST_WITH_IMMEDIATE, Op.RDMA_WRITE_ONLY,
         Op.RDMA_WRITE_ONLY_WITH_IMMEDIATE}
    ),
    Transport.RD: frozenset(op for op in _CHAIN_BY_OP if op < Op.SEND_LAST_WITH_INVALIDATE),
    Transport.UD: frozenset({Op.SEND_ONLY, Op.SEND_ONLY_WITH_IMMEDIATE}),
}


def _build_tables() -> tuple[dict[int, str], dict[int, tuple[str, ...]]]:
    names: dict[int, str] = {}
    chains: dict[int, tuple[str, ...]] = {}
    for transport, ops in _VALID_OPS.items():
        for op in sorted(ops):
            code = transport | op
            names[code] = f"{transport.name}_{Op(op).name}"
            chain = _CHAIN_BY_OP[op]
            if transport is Transport.UD:
                chain = ("DETH", *chain)
            elif transport is Transport.RD:
                chain = ("RDETH", "DETH", *chain)
            chains[code] = chain
    names[CNP_OPCODE] = "CNP"
    chains[CNP_OPCODE] = ()
    return names, chains


OPCODE_NAMES, _CHAINS = _build_tables()


def header_chain(opcode: int) -> tuple[str, ...]:
    """Names of the extended headers that follow the BTH for ``opcode`` (empty if unknown)."""
    return _CHAINS.get(opcode, ())


def is_known(opcode: int) -> bool:
    return opcode in OPCODE_NAMES


def is_ud(opcode: int) -> bool:
    return opcode & 0xE0 == Transport.UD


def opcode(transport: Transport | str, op: Op | str) -> int:
    """``opcode("RC", "RDMA_WRITE_ONLY") == 0x0A``."""
    t = Transport[transport] if isinstance(transport, str) else transport
    o = Op[op] if isinstance(op, str) else op
    code = t | o
    if code not in OPCODE_NAMES:
        raise ValueError(f"{t.name} has no {o.name} operation")
    return code


def ext_headers_len(opcode: int) -> int:
    """Total length of the extended headers after the BTH for ``opcode``."""
    return sum(EXT_HEADER_LENGTHS[name] for name in header_chain(opcode))


EXT_HEADER_LENGTHS = {
    "RDETH": 4,
    "DETH": 8,
    "RETH": 16,
    "AETH": 4,
    "AtomicETH": 28,
    "AtomicAckETH": 8,
    "ImmDt": 4,
    "IETH": 4,
}
