#!/usr/bin/env python3
"""The SM process's start-up: what ``python -m ibemu.sm`` spends before its first SMP.

Each run is a fresh interpreter that imports ``ibemu.sm.__main__`` (everything the SM loads
before it parses its arguments) and prints the CPU seconds it has used (``time.process_time``:
the interpreter's own start-up and the imports, which other processes on the machine inflate
far less than wall time) and the wall time from its start. A bare interpreter (``-c pass``)
is measured the same way, for the floor. The modules the SM imports are listed with
``--modules``. ``--root`` measures another checkout (its ibemu on PYTHONPATH).

Run: .venv/bin/python benchmarks/bench_sm_startup.py [--runs 9] [--root DIR] [--modules]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

PROBE = ("import time, sys; t = time.perf_counter(); {body}; "
         "print(time.process_time(), time.perf_counter() - t, "
         "len([m for m in sys.modules if m.startswith('ibemu')]))")


def one(root: Path, body: str) -> tuple[float, float, int]:
    out = subprocess.run([sys.executable, "-c", PROBE.format(body=body)], capture_output=True, text=True,
                         check=True, cwd=root, env={**os.environ, "PYTHONPATH": str(root)}).stdout.split()
    return float(out[0]), float(out[1]), int(out[2])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--modules", action="store_true", help="list the ibemu modules the SM imports")
    args = ap.parse_args()
    print(f"checkout {args.root}; load {os.getloadavg()[0]:.1f}")
    for label, body in (("bare interpreter", "pass"), ("import ibemu.sm.__main__", "import ibemu.sm.__main__")):
        runs = [one(args.root, body) for _ in range(args.runs)]
        cpu = sorted(r[0] * 1e3 for r in runs)
        imp = sorted(r[1] * 1e3 for r in runs)
        print(f"{label:26s} CPU {statistics.median(cpu):6.0f} ms (range {cpu[0]:.0f}-{cpu[-1]:.0f}), "
              f"imports' wall {statistics.median(imp):6.0f} ms (range {imp[0]:.0f}-{imp[-1]:.0f}), "
              f"{runs[0][2]} ibemu modules; {args.runs} runs")
    if args.modules:
        code = "import sys, ibemu.sm.__main__; print(' '.join(sorted(m for m in sys.modules if m.startswith('ibemu'))))"
        print(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=args.root,
                             env={**os.environ, "PYTHONPATH": str(args.root)}).stdout)


if __name__ == "__main__":
    main()
