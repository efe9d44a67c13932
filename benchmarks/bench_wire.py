#!/usr/bin/env python3
"""Wire-layer figures: fast-path build and parse rates, CRC costs, scapy for comparison.

Targets (issue 2): 4 KiB RDMA WRITE with ICRC+VCRC >= 150,000/s; 256-byte >= 400,000/s;
parse forwarding fields >= 1,000,000/s; VCRC of 4 KiB <= 4 us. One core, one process.
Run: .venv/bin/python benchmarks/bench_wire.py [--seconds S]
"""

from __future__ import annotations

import argparse
import os
import zlib

from harness import rate  # benchmarks/harness.py
from scapy.packet import Raw, raw

from ibemu.wire import crc, fast
from ibemu.wire.ib import BTH, LRH, RETH


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=1.5, help="time per figure")
    args = ap.parse_args()
    s = args.seconds

    tmpl = fast.NativeTemplate(slid=1, dlid=4, destqp=0x12, eth=fast.ethernet_header(b"\2" * 6, b"\4" * 6))
    rows: list[tuple[str, str, str, str]] = []

    def check(name: str, value: float, unit: str, target: str, ok: bool) -> None:
        rows.append((name, f"{value:,.2f}" if value < 100 else f"{value:,.0f}", unit, f"{target} {'ok' if ok else 'MISSED'}"))

    psn = iter(range(1 << 62))
    for size, target in ((4096, 150_000), (256, 400_000)):
        payload = os.urandom(size)
        ext = fast.reth(0x10000, 0xBEEF, size)
        r = rate(lambda payload=payload, ext=ext: tmpl.packet(0x0A, next(psn), payload, ext=ext), s)
        check(f"build RC WRITE Only {size} B (+ICRC+VCRC)", r, "pkt/s", f">= {target:,}", r >= target)

    frame = tmpl.packet(0x0A, 1, os.urandom(4096), ext=fast.reth(0, 0, 4096))
    pkt = bytes(frame[14:])
    r = rate(lambda: fast.peek(pkt), s)
    check("parse forwarding fields (peek)", r, "pkt/s", ">= 1,000,000", r >= 1_000_000)
    r = rate(lambda: fast.dlid_vl(pkt), s)
    check("parse DLID+VL only", r, "pkt/s", "(switch hot path)", True)

    data4k = os.urandom(4096)
    us = 1e6 / rate(lambda: crc.vcrc(data4k), s)
    check("VCRC (CRC-16) of 4 KiB", us, "us", "<= 4 us", us <= 4)
    us = 1e6 / rate(lambda: zlib.crc32(data4k), s)
    check("ICRC (CRC-32) of 4 KiB", us, "us", "(zlib)", True)
    us = 1e6 / rate(lambda: crc.check_native(pkt), s)
    check("verify ICRC+VCRC of a 4 KiB packet", us, "us", "(receive path)", True)

    payload = os.urandom(4096)
    r = rate(lambda: raw(LRH(dlid=4, slid=1) / BTH(opcode=0x0A, destqp=0x12) / RETH(dmalen=4096) / Raw(payload)), s / 2)
    check("scapy build of the same 4 KiB packet", r, "pkt/s", "(for comparison)", True)
    r = rate(lambda: LRH(pkt), s / 2)
    check("scapy dissect of a 4 KiB packet", r, "pkt/s", "(for comparison)", True)

    w = max(len(r[0]) for r in rows)
    print(f"{'figure':<{w}}  {'value':>12}  {'unit':<6} target")
    for name, value, unit, target in rows:
        print(f"{name:<{w}}  {value:>12}  {unit:<6} {target}")


if __name__ == "__main__":
    main()
