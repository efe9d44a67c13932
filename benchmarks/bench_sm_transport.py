#!/usr/bin/env python3
"""The SM's own cost per SMP: ``sm.transport.Transport`` over a port that answers at once.

No fabric, no agents: every request is echoed back as its GetResp by an in-process port, so
what is left is the transport (TIDs, the window, waiting, matching, retries bookkeeping) and
trio. Printed per run: requests/s and CPU microseconds per request (``time.process_time``,
which other processes on the machine do not inflate), for ``request_all`` of N directed-route
NodeInfo Gets with a window of 128 (``DEFAULT_MAX_IN_FLIGHT``).

Run: .venv/bin/python benchmarks/bench_sm_transport.py [--n 8000] [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import trio

from ibemu.sm.transport import DEFAULT_MAX_IN_FLIGHT, Transport
from ibemu.testing.madport import EchoPort
from ibemu.wire import madcodec as mb


async def one_run(n: int) -> tuple[float, float]:
    transport = Transport(EchoPort(), max_in_flight=DEFAULT_MAX_IN_FLIGHT)
    reqs = [mb.dr_smp(mb.GET, 0x0011, path=[1, 2, 3]) for _ in range(n)]
    async with trio.open_nursery() as nursery:
        await nursery.start(transport.serve)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        replies = await transport.request_all(reqs)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        nursery.cancel_scope.cancel()
    assert all(r is not None for r in replies)
    return n / wall, cpu / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=8000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    runs = [trio.run(one_run, args.n) for _ in range(args.runs)]
    cpu = [c for _, c in runs]
    rate = [r for r, _ in runs]
    print(f"SM transport, {args.n} requests, window {DEFAULT_MAX_IN_FLIGHT}, an echoing port:")
    print(f"  CPU per request: median {statistics.median(cpu):.1f} us (range {min(cpu):.1f}-{max(cpu):.1f})")
    print(f"  requests/s (wall): median {statistics.median(rate):,.0f} (range {min(rate):,.0f}-{max(rate):,.0f})")


if __name__ == "__main__":
    main()
