#!/usr/bin/env python3
"""Device-agent figures: SMP responses per second, DR round trips, LFT block Sets.

Target (issue 4): a switch agent answers >= 20,000 SMP Gets per second per core.
Run: .venv/bin/python benchmarks/bench_agents.py [--seconds S]
"""

from __future__ import annotations

import argparse

from harness import rate  # benchmarks/harness.py

from ibemu.agents.ca import CaAgent
from ibemu.agents.switch import SwitchAgent
from ibemu.testing.wiring import InMemoryFabric
from ibemu.wire import madcodec as mb
from ibemu.wire.madpacket import frame_mad


def dr_request(attr: int, modifier: int = 0, method: int = mb.GET, data: bytes = b"") -> bytes:
    """A DR SMP as it arrives at the second hop of a 2-hop path (hp = 2 = HopCount)."""
    mad = bytearray(mb.dr_smp(method, attr, path=[1, 3], modifier=modifier, tid=7, data=data))
    mad[6] = 2
    mad[192 + 1] = 6
    return frame_mad(mad, dlid=0xFFFF, slid=0xFFFF, dqp=0, sqp=0, qkey=0, vl=15)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=1.5, help="time per figure")
    s = ap.parse_args().seconds

    sw = SwitchAgent(node_guid=0x0002C90000001000, num_ports=36, link_up=[True] * 36)
    node_info = dr_request(0x11)
    port_info = dr_request(0x15, modifier=5)
    assert sw.receive(3, node_info) and sw.receive(3, port_info)
    print(f"switch SMA GetResp(NodeInfo)           {rate(lambda: sw.receive(3, node_info), s):>10,.0f} /s")
    print(f"switch SMA GetResp(PortInfo)           {rate(lambda: sw.receive(3, port_info), s):>10,.0f} /s")

    blocks = [bytes([1 + (i + k) % 36 for i in range(64)]) for k in range(2)]
    lft_sets = [dr_request(0x19, modifier=3, method=mb.SET, data=b) for b in blocks]
    flip = [0]

    def lft_set() -> None:
        flip[0] ^= 1
        sw.receive(3, lft_sets[flip[0]])

    print(f"switch LFT Set, one 64-entry block     {rate(lft_set, s):>10,.0f} /s  (every Set changes all 64)")

    fab = InMemoryFabric(record_wire=False)
    fab.add("sm", CaAgent(node_guid=0x100, clock=fab.clock))
    for i in (1, 2, 3):
        fab.add(f"s{i}", SwitchAgent(node_guid=0x200 + i, num_ports=8, clock=fab.clock))
    fab.add("h", CaAgent(node_guid=0x300, clock=fab.clock))
    fab.connect("sm", 1, "s1", 6)
    fab.connect("s1", 3, "s2", 1)
    fab.connect("s2", 3, "s3", 1)
    fab.connect("s3", 5, "h", 1)
    mad = mb.dr_smp(mb.GET, 0x11, path=[1, 3, 3, 5])

    def round_trip() -> None:
        got = fab.send_mad("sm", 1, 0xFFFF, 0, 0, mad)
        assert got
        fab.delivered["sm"].clear()

    rt = rate(round_trip, s)
    print(f"DR NodeInfo round trip, 3-switch chain {rt:>10,.0f} /s  ({rt * 8:,.0f} SMP hops/s)")


if __name__ == "__main__":
    main()
