"""`ibemu demo`: build real IB and RoCEv2 frames, capture them, decode them back (and with tshark).

The wire layer end to end: a directed-route discovery exchange, a trap 128, a PMA
PortCounters query, an RC RDMA WRITE with its ACK and a PSN-sequence NAK (native, ERF pcap),
and a RoCEv2 WRITE (Ethernet pcap). Every frame is decoded by ibemu's strict decoder (CRCs
checked) and, when tshark is installed, by Wireshark's dissectors.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from scapy.packet import Raw, raw

from ibemu.wire import PcapWriter, decode_frame, decode_native, fast
from ibemu.wire.ib import BTH, DETH, LRH, RETH
from ibemu.wire.mad import (
    PMA,
    SMP,
    DirectedRouteSMP,
    Method,
    NodeInfo,
    Notice,
    PortCounters,
    Trap128Details,
)
from ibemu.wire.roce import RoceBTH, roce_packet


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="build, capture and decode real IB / RoCEv2 frames")
    p.add_argument("-o", "--out", default="out", help="directory for the pcap files (default: out)")
    p.add_argument("--no-tshark", action="store_true", help="do not run tshark on the captures")
    p.add_argument("--no-live", action="store_true", help="skip the live fabric part (it needs root)")
    p.set_defaults(func=run)


def native_packets() -> list[tuple[str, bytes]]:
    """The native frames of the demo, each with a caption."""
    node_info_get = DirectedRouteSMP(method=Method.GET, tid=0x1001, hop_pointer=1, hop_count=2,
                                     initial_path=[1, 3], data=NodeInfo())
    node_info_resp = DirectedRouteSMP(
        method=Method.GET_RESP, d=1, tid=0x1001, hop_pointer=2, hop_count=2, initial_path=[1, 3],
        return_path=[1, 2],
        data=NodeInfo(node_type=2, num_ports=8, node_guid=0x0002C90300000101,
                      port_guid=0x0002C90300000101, system_image_guid=0x0002C90300000101,
                      local_port_num=2, vendor_id=0x0002C9))
    smp_hdr = LRH(vl=15, dlid=0xFFFF, slid=0xFFFF) / BTH(opcode=0x64, destqp=0) / DETH(srcqp=0)
    trap = (LRH(vl=15, dlid=1, slid=5) / BTH(opcode=0x64, destqp=0) / DETH(srcqp=0)
            / SMP(method=Method.TRAP, tid=0x2001,
                  data=Notice(trap_number=128, issuer_lid=5, data_details=Trap128Details(lidaddr=5))))
    perf = (LRH(dlid=5, slid=1) / BTH(opcode=0x64, destqp=1) / DETH(qkey=0x80010000, srcqp=1)
            / PMA(method=Method.GET, tid=0x3001, data=PortCounters(port_select=1)))
    data = bytes(range(256)) * 16
    write = fast.NativeTemplate(slid=1, dlid=4, destqp=0x12).packet(
        0x0A, 100, data, ackreq=True, ext=fast.reth(0x7F000000, 0xBEEF, len(data)))
    ack = fast.NativeTemplate(slid=4, dlid=1, destqp=0x34).packet(0x11, 100, ext=fast.aeth(0x1F, 1))
    nak = fast.NativeTemplate(slid=4, dlid=1, destqp=0x34).packet(0x11, 99, ext=fast.aeth(0x60, 1))
    scapy_write = raw(LRH(dlid=4, slid=1) / BTH(opcode=0x0A, destqp=0x12, psn=100, ackreq=1)
                      / RETH(va=0x7F000000, rkey=0xBEEF, dmalen=len(data)) / Raw(data))
    if scapy_write != write:
        raise RuntimeError("fast path and scapy layers disagree on the RDMA WRITE packet")
    return [
        ("SubnGet(NodeInfo), directed route 1,3", raw(smp_hdr / node_info_get)),
        ("SubnGetResp(NodeInfo) from a switch", raw(smp_hdr / node_info_resp)),
        ("SubnTrap(Notice) trap 128 link state change", raw(trap)),
        ("PerfMgt Get(PortCounters)", raw(perf)),
        ("RC RDMA WRITE Only 4 KiB (fast path)", write),
        ("RC ACK", ack),
        ("RC NAK PSN sequence error", nak),
    ]


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    native_path, roce_path = out / "demo-native.pcap", out / "demo-roce.pcap"
    print("ibemu wire demo: frames built, captured, decoded back with CRCs checked\n")
    with PcapWriter(native_path, "ib") as w:
        for caption, pkt in native_packets():
            w.write(pkt)
            decoded = decode_native(pkt)
            print(f"  native {len(pkt):5d} B  {caption:<44} {decoded.summary()}")
    roce = raw(roce_packet("198.18.0.1", "198.18.0.2", RoceBTH(opcode=0x0A, dqpn=0x12, psn=7),
                           RETH(va=0x1000, rkey=0xBEEF, dmalen=1024), payload=b"\xab" * 1024))
    with PcapWriter(roce_path, "eth") as w:
        w.write(roce)
    print(f"  RoCEv2 {len(roce):5d} B  {'RC RDMA WRITE Only 1 KiB':<44} {decode_frame(roce).summary()}")
    print(f"\ncaptures: {native_path} (ERF / InfiniBand), {roce_path} (Ethernet / RRoCE)")
    tshark = shutil.which("tshark")
    if args.no_tshark:
        pass
    elif tshark is None:
        print("tshark not installed: skipping Wireshark's view (scripts/setup.sh installs it)")
    else:
        for path in (native_path, roce_path):
            print(f"\ntshark -r {path}:")
            result = subprocess.run([tshark, "-n", "-r", str(path)], capture_output=True, text=True, timeout=60)
            sys.stdout.write(result.stdout)
            if result.returncode != 0:
                sys.stderr.write(result.stderr)
                return 1
    if args.no_live:
        return 0
    from ibemu.fabric.demo import live_demo_available, run_live_demo
    from ibemu.scenario.loader import load_builtin

    why_not = live_demo_available()
    if why_not:
        print(f"\nlive fabric demo skipped ({why_not}): run `sudo make run` for it")
        return 0
    print("\nibemu live fabric: the built-in default scenario's k=4 fat-tree, managed by the real OpenSM")
    run_live_demo(load_builtin("default").topology, out.resolve() / "live", print)
    return 0
