"""tshark decodes ibemu's own captures with the expected fields."""

from __future__ import annotations

import subprocess
from pathlib import Path

from scapy.packet import raw

from ibemu.wire import PcapWriter, fast, read_pcap
from ibemu.wire.ib import BTH, DETH, LRH, RETH
from ibemu.wire.mad import (
    PMA,
    SMP,
    DirectedRouteSMP,
    NodeInfo,
    Notice,
    PortCounters,
    Trap128Details,
)
from ibemu.wire.roce import RoceBTH, roce_packet

SMP_GET = raw(LRH(vl=15, dlid=0xFFFF, slid=0xFFFF) / BTH(opcode=0x64, destqp=0) / DETH()
              / DirectedRouteSMP(method=1, tid=0x1234, hop_pointer=1, hop_count=3, initial_path=[1, 4, 2],
                                 data=NodeInfo(node_type=2, num_ports=36, node_guid=0x0002C90300ABCDEF)))
TRAP_128 = raw(LRH(vl=15, dlid=1, slid=7) / BTH(opcode=0x64, destqp=0) / DETH()
               / SMP(method=5, tid=0x99, data=Notice(trap_number=128, issuer_lid=7,
                                                     data_details=Trap128Details(lidaddr=7))))
PERF = raw(LRH(dlid=7, slid=1) / BTH(opcode=0x64, destqp=1) / DETH(qkey=0x80010000, srcqp=1)
           / PMA(method=0x81, tid=0x77, data=PortCounters(port_select=3, port_xmit_data=123456)))
_t = fast.NativeTemplate(slid=1, dlid=4, destqp=0x12)
WRITE = _t.packet(0x0A, 100, b"x" * 1000, ackreq=True, ext=fast.reth(0x7000, 0xBEEF, 1000))
ACK = fast.NativeTemplate(slid=4, dlid=1, destqp=0x34).packet(0x11, 100, ext=fast.aeth(0x1F, 1))
NAK = fast.NativeTemplate(slid=4, dlid=1, destqp=0x34).packet(0x11, 99, ext=fast.aeth(0x60, 1))


def _tshark(tshark: str, path: Path, *fields: str) -> list[list[str]]:
    argv = [tshark, "-n", "-r", str(path), "-T", "fields", "-E", "separator=|"]
    for f in fields:
        argv += ["-e", f]
    out = subprocess.run(argv, check=True, capture_output=True, text=True, timeout=60).stdout
    return [line.split("|") for line in out.splitlines()]


def test_native_capture_decodes(tshark: str, tmp_path: Path) -> None:
    path = tmp_path / "native.pcap"
    with PcapWriter(path, "ib") as w:
        for i, pkt in enumerate((SMP_GET, TRAP_128, PERF, WRITE, ACK, NAK)):
            w.write(pkt, ts_ns=1_700_000_000_000_000_000 + i * 1000)
    assert len(list(read_pcap(path))) == 6
    rows = _tshark(tshark, path, "infiniband.lrh.dlid", "infiniband.lrh.slid", "infiniband.bth.opcode",
                   "infiniband.mad.mgmtclass", "infiniband.mad.attributeid", "infiniband.mad.transactionid",
                   "infiniband.smpdirected.hoppointer", "infiniband.smpdirected.hopcount",
                   "infiniband.invariant.crc", "infiniband.variant.crc")
    assert len(rows) == 6
    smp = rows[0]
    assert smp[:8] == ["65535", "65535", "100", "0x81", "0x0011", "0x0000000000001234", "0x01", "0x03"]
    assert int(smp[8], 16) == int.from_bytes(SMP_GET[-6:-2], "big")  # tshark shows the raw wire order
    assert int(smp[9], 16) == int.from_bytes(SMP_GET[-2:], "big")
    trap, perf, write, ack, nak = rows[1:]
    assert trap[3:5] == ["0x01", "0x0002"] and perf[3:5] == ["0x04", "0x0012"]
    assert write[2] == "10" and ack[2] == "17" and nak[2] == "17"

    detail = _tshark(tshark, path, "infiniband.notice.trapnumberdeviceid", "infiniband.trap.lidaddr",
                     "infiniband.portcounters.portselect", "infiniband.portcounters.portxmitdata",
                     "infiniband.nodeinfo.numports", "infiniband.reth.dmalen", "infiniband.reth.r_key",
                     "infiniband.aeth.syndrome", "infiniband.bth.psn")
    assert detail[0][4] == "0x24"
    assert detail[1][0] == "0x0080" and detail[1][1] == "0x0007"
    assert detail[2][2] == "0x03" and detail[2][3] == "123456"
    assert detail[3][5] == "1000" and detail[3][6] == "0x0000beef" and detail[3][8] == "100"
    assert detail[4][7] == "31" and detail[5][7] == "96"  # 0x1f ACK, 0x60 NAK PSN sequence error
    assert detail[4][8] == "100" and detail[5][8] == "99"


def test_rocev2_capture_decodes(tshark: str, tmp_path: Path) -> None:
    frame = raw(roce_packet("198.18.0.1", "198.18.0.2", RoceBTH(opcode=0x0A, dqpn=0x55, psn=42),
                            RETH(va=0x1000, rkey=0x77, dmalen=64), payload=b"y" * 64, sport=50000))
    path = tmp_path / "roce.pcap"
    with PcapWriter(path, "eth") as w:
        w.write(frame)
    rows = _tshark(tshark, path, "udp.dstport", "infiniband.bth.opcode", "infiniband.bth.destqp",
                   "infiniband.bth.psn", "infiniband.reth.dmalen", "infiniband.invariant.crc",
                   "_ws.col.Protocol")
    assert rows == [["4791", "10", "0x000055", "42", "64",
                     f"0x{int.from_bytes(frame[-4:], 'big'):08x}", "RRoCE"]]
