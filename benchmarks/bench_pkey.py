#!/usr/bin/env python3
"""Partition enforcement figures: the kernel LFT classifier's time per frame (BPF_PROG_TEST_RUN)
with no port enforcing and with the ingress and egress ports enforcing, and the userspace
forwarder's fast path per frame likewise. Needs root (BPF).

Run: .venv/bin/python benchmarks/bench_pkey.py [--repeat N]
"""

from __future__ import annotations

import argparse
import statistics
import time

from ibemu.agents.port import PortState
from ibemu.agents.switch import SwitchAgent
from ibemu.kernel import bpf, lft_map
from ibemu.wire import fast

ENFORCE = lft_map.ENFORCE_IN | lft_map.ENFORCE_OUT
TABLE = [0xFFFF, 0x8001]


def kernel_ns(repeat: int) -> tuple[float, float]:
    prog = lft_map.LftProgram({1: 1, 2: 42})
    try:
        prog.apply({40: 2})
        eth = fast.ethernet_header(b"\x02" * 6, b"\x04" * 6)
        frame = fast.NativeTemplate(slid=1, dlid=40, destqp=5, pkey=0x8001, eth=eth).packet(0x04, 1, bytes(1024))
        off = statistics.median(bpf.test_run(prog.prog_fd, frame, repeat)[2] for _ in range(7))
        prog.set_partition(1, ENFORCE, TABLE)
        prog.set_partition(2, ENFORCE, TABLE)
        on = statistics.median(bpf.test_run(prog.prog_fd, frame, repeat)[2] for _ in range(7))
        return off, on
    finally:
        prog.close()


def user_ns(n: int) -> tuple[float, float]:
    sw = SwitchAgent(node_guid=1, num_ports=2, link_up=[True, True])
    for p in (1, 2):
        sw.ports[p].state = PortState.ACTIVE
    sw.lft.set_block(0, bytes([2] * 64))
    sw.lft.set_top(63)
    frames = [bytes(14) + fast.NativeTemplate(slid=9, dlid=40, destqp=5, pkey=0x8001).packet(0x04, 1, bytes(1024))] * n
    out: list[float] = []
    for enforce in (0, ENFORCE):
        for p in (1, 2):
            sw.ports[p].partition_flags, sw.ports[p].pkeys = enforce, list(TABLE)
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter_ns()
            assert sw.forwarder.forward_run(frames, 0, 1, 14, {}, vcrc_known_good=True) == n
            best = min(best, (time.perf_counter_ns() - t0) / n)
        out.append(best)
    return out[0], out[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=200_000, help="test runs per kernel measurement")
    args = ap.parse_args()
    off, on = kernel_ns(args.repeat)
    print(f"kernel classifier, 1 KiB data frame: {off:.0f} ns/frame no port enforcing, "
          f"{on:.0f} ns/frame ingress and egress enforcing")
    uoff, uon = user_ns(20_000)
    print(f"user forwarder fast path, 1 KiB data frame: {uoff:.0f} ns/frame no port enforcing, "
          f"{uon:.0f} ns/frame ingress and egress enforcing")


if __name__ == "__main__":
    main()
