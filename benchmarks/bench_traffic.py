#!/usr/bin/env python3
"""Traffic figures on a live k=4 fat-tree (kernel datapath, ibemu's SM), as a user runs them.

- one RC QP, MTU 4096, ``ibemu perf write_bw`` client and server as two processes in two
  hosts' namespaces, 3 switches apart (h0 -> h2: edge, aggregation, edge) and 5 apart
  (h0 -> h15, across the core): packets/s, payload Gb/s, CPU per packet on each side
  (getrusage of each process over the whole run, start-up included);
- ``write_lat``/``send_lat`` half round trip (median, p99);
- ring allreduce and all-to-all across the 16 hosts: time, algbw, busbw.

Target (issue 6): >= 100,000 packets/s per core (>= 3.2 Gb/s of payload), aim 200,000.
Run: sudo .venv/bin/python benchmarks/bench_traffic.py [--iters N]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def ibemu(env: dict[str, str], *args: str) -> list[str]:
    return [sys.executable, "-m", "ibemu.cli.main", *args]


def run_pair(env: dict[str, str], test: str, server: str, client: str, *extra: str) -> tuple[str, str]:
    """(client output, server output) of one ``ibemu perf`` test."""
    srv = subprocess.Popen(ibemu(env, "exec", server, "--", sys.executable, "-m", "ibemu.cli.main", "perf", test),
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(1.0)
    cli = subprocess.run(ibemu(env, "exec", client, "--", sys.executable, "-m", "ibemu.cli.main", "perf", test,
                               server, *extra), env=env, capture_output=True, text=True, timeout=600)
    out, _ = srv.communicate(timeout=60)
    if cli.returncode != 0:
        raise SystemExit(f"perf {test} failed:\n{cli.stderr[-2000:]}")
    return cli.stdout, out


def cpu(text: str) -> str:
    line = next((ln for ln in text.splitlines() if "CPU per packet" in ln), "")
    return line.split(":", 1)[1].strip() if line else "?"


def values(text: str) -> list[str]:
    rows = [ln for ln in text.splitlines() if ln.startswith(" ") and ln.split()[0].isdigit()]
    return rows[-1].split()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=40000, help="4 KiB WRITEs per bandwidth run")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root: sudo .venv/bin/python benchmarks/bench_traffic.py")
    state = Path(tempfile.mkdtemp(prefix="ibemu-bench-traffic-"))
    env = {**os.environ, "IBEMU_STATE_DIR": str(state)}
    up = subprocess.run(ibemu(env, "up", "--topo", "fat-tree,k=4", "--sm", "ibemu", "--sm-engine", "ftree"),
                        env=env, capture_output=True, text=True)
    if up.returncode != 0:
        raise SystemExit(up.stderr)
    rows: list[tuple[str, str]] = []
    try:
        cases = (("4 KiB messages, 3 switches (h2 -> h0)", "h0", "h2", 4096, args.iters, "256"),
                 ("4 KiB messages, 5 switches (h15 -> h0)", "h0", "h15", 4096, args.iters, "256"),
                 ("64 KiB messages, 3 switches (h2 -> h0)", "h0", "h2", 65536, args.iters // 8, "128"),
                 ("64 KiB messages, 5 switches (h15 -> h0)", "h0", "h15", 65536, args.iters // 8, "128"))
        for label, server, client, size, iters, depth in cases:
            text, srv_text = run_pair(env, "write_bw", server, client, "-s", str(size), "-n", str(iters),
                                      "-t", depth)
            v = values(text)
            mbps = float(v[3])
            pps = float(v[4]) * 1e6 * (size // 4096)
            rows.append((f"RC WRITE, MTU 4096, 1 QP, {label}",
                         f"{pps:,.0f} packets/s, {mbps * 8 * 1.048576 / 1000:.2f} Gb/s"))
            rows.append(("  CPU per packet, sender", cpu(text)))
            rows.append(("  CPU per packet, receiver", cpu(srv_text)))
        for test in ("write_lat", "send_lat"):
            text, _ = run_pair(env, test, "h0", "h15", "-s", "64", "-n", "2000")
            v = values(text)
            rows.append((f"{test} 64 B h15 -> h0, half round trip", f"median {float(v[4]):.1f} us, p99 {float(v[7]):.1f} us"))
        for kind in ("allreduce", "alltoall"):
            r = subprocess.run(ibemu(env, "perf", kind, "-s", "1MiB", "-n", "5"), env=env, capture_output=True,
                               text=True)
            line = next(ln for ln in r.stdout.splitlines() if ln and not ln.startswith("#")).split()
            rows.append((f"{kind} 1 MiB, 16 hosts", f"{float(line[4]) / 1000:.1f} ms, algbw {line[5]} GB/s, "
                                                   f"busbw {line[6]} GB/s, wrong {line[7]}"))
    finally:
        subprocess.run(ibemu(env, "down"), env=env, capture_output=True)
    width = max(len(r[0]) for r in rows)
    print(f"load before: {os.getloadavg()[0]:.2f}")
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


if __name__ == "__main__":
    main()
