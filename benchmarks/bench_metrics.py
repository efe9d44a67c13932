#!/usr/bin/env python3
"""What the metrics endpoint and the sysfs trees cost on a live fabric of a given size.

Brings a fabric up with ``ibemu up --topo TOPO --metrics PORT`` (the fabric daemon: ibemu's SM,
the kernel datapath), scrapes ``/metrics`` ``--scrapes`` times and prints, per scrape, its
wall time, the samples it returned and the daemon's own collection time
(``ibemu_scrape_duration_seconds``: from the collector's start to its last family, which
includes prometheus_client's text exposition of the families before it); then the sysfs trees' files and refresh
period (from the daemon's log), and tears the fabric down.

Run: sudo .venv/bin/python benchmarks/bench_metrics.py [--topo fat-tree,k=8] [--scrapes 5]
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def ibemu(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "IBEMU_STATE_DIR": str(state)}
    return subprocess.run([sys.executable, "-m", "ibemu.cli.main", *args], capture_output=True, text=True,
                          env=env, check=False, timeout=600)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topo", default="fat-tree,k=8")
    ap.add_argument("--scrapes", type=int, default=5)
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="bench-metrics-") as tmp:
        state = Path(tmp)
        t0 = time.perf_counter()
        up = ibemu(state, "up", "--topo", args.topo, "--metrics", str(port))
        if up.returncode != 0:
            sys.exit(up.stderr)
        print(f"{args.topo}: up in {time.perf_counter() - t0:.1f} s")
        try:
            time.sleep(3)  # the first sysfs pass and the SM's settling
            for i in range(args.scrapes):
                t = time.perf_counter()
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as r:
                    text = r.read().decode()
                wall = time.perf_counter() - t
                samples = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
                m = re.search(r"^ibemu_scrape_duration_seconds (\S+)$", text, re.M)
                collect = float(m.group(1)) if m else float("nan")
                print(f"scrape {i + 1}: {wall:.3f} s wall, {samples} samples, collector {collect:.3f} s")
                time.sleep(1)
            run_dir = next(p for p in (state / "runs").iterdir() if p.is_dir())
            files = sum(1 for p in (run_dir / "sysfs").rglob("*") if p.is_file())
            log = (run_dir / "daemon.log").read_text()
            m2 = re.search(r"sysfs trees of (\d+) nodes .*refreshed every ([\d.]+) s", log)
            print(f"sysfs: {files} files of {m2.group(1) if m2 else '?'} nodes, "
                  f"refreshed every {m2.group(2) if m2 else '?'} s")
        finally:
            down = ibemu(state, "down")
            if down.returncode != 0:
                print(down.stderr, file=sys.stderr)


if __name__ == "__main__":
    main()
