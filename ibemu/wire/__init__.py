"""Packet formats: scapy layers (IB native and RoCEv2), fast codecs, CRCs, capture files.

Importing this package registers every layer with scapy. Pure: no kernel, no trio.
"""

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

__all__ = [
    "AETH", "BTH", "DETH", "ETHERTYPE_IB", "GRH", "IETH", "LRH", "MAD", "PMA", "RDETH", "RETH",
    "SMP", "AtomicAckETH", "AtomicETH", "AttrId", "ClassPortInfo", "DirectedRouteSMP", "ImmDt",
    "LinearForwardingTable", "Method", "MgmtClass", "NodeDescription", "NodeInfo", "Notice",
    "Op", "PKeyTable", "PcapWriter", "PortCounters", "PortInfo", "RoceBTH", "SMInfo",
    "SwitchInfo", "Transport", "Trap128Details", "Trap144Details", "decode_frame",
    "decode_native", "opcode", "read_pcap", "roce_packet",
]
