"""Packet formats: scapy layers (IB native and RoCEv2), fast codecs, CRCs, capture files.

The scapy layers load (and register with scapy) on first use of a name below, or on import
of ``ibemu.wire.ib``/``mad``/``roce``: the fast path (``fast``, ``opcodes``, ``crc``) that
the transport and the agents run on does not pay scapy's import time. Pure: no kernel, no trio.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names, for type checkers; at run time they load on first use
    from ibemu.wire.capture import PcapWriter, read_pcap
    from ibemu.wire.decode import decode_frame, decode_native
    from ibemu.wire.ib import (
        AETH,
        BTH,
        DETH,
        ETHERTYPE_IB,
        GRH,
        IETH,
        LRH,
        RDETH,
        RETH,
        AtomicAckETH,
        AtomicETH,
        ImmDt,
    )
    from ibemu.wire.mad import (
        MAD,
        PMA,
        SMP,
        AttrId,
        ClassPortInfo,
        DirectedRouteSMP,
        LinearForwardingTable,
        Method,
        MgmtClass,
        NodeDescription,
        NodeInfo,
        Notice,
        PKeyTable,
        PortCounters,
        PortInfo,
        SMInfo,
        SwitchInfo,
        Trap128Details,
        Trap144Details,
    )
    from ibemu.wire.opcodes import Op, Transport, opcode
    from ibemu.wire.roce import RoceBTH, roce_packet

_HOMES = {
    "PcapWriter": "capture", "read_pcap": "capture",
    "decode_frame": "decode", "decode_native": "decode",
    **dict.fromkeys(("AETH", "BTH", "DETH", "ETHERTYPE_IB", "GRH", "IETH", "LRH", "RDETH", "RETH",
                     "AtomicAckETH", "AtomicETH", "ImmDt"), "ib"),
    **dict.fromkeys(("MAD", "PMA", "SMP", "AttrId", "ClassPortInfo", "DirectedRouteSMP",
                     "LinearForwardingTable", "Method", "MgmtClass", "NodeDescription", "NodeInfo",
                     "Notice", "PKeyTable", "PortCounters", "PortInfo", "SMInfo", "SwitchInfo",
                     "Trap128Details", "Trap144Details"), "mad"),
    "Op": "opcodes", "Transport": "opcodes", "opcode": "opcodes",
    "RoceBTH": "roce", "roce_packet": "roce",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'ibemu.wire' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"ibemu.wire.{home}"), name)
    globals()[name] = value
    return value


__all__ = [
    "AETH", "BTH", "DETH", "ETHERTYPE_IB", "GRH", "IETH", "LRH", "MAD", "PMA", "RDETH", "RETH",
    "SMP", "AtomicAckETH", "AtomicETH", "AttrId", "ClassPortInfo", "DirectedRouteSMP", "ImmDt",
    "LinearForwardingTable", "Method", "MgmtClass", "NodeDescription", "NodeInfo", "Notice",
    "Op", "PKeyTable", "PcapWriter", "PortCounters", "PortInfo", "RoceBTH", "SMInfo",
    "SwitchInfo", "Transport", "Trap128Details", "Trap144Details", "decode_frame",
    "decode_native", "opcode", "read_pcap", "roce_packet",
]
