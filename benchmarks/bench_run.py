#!/usr/bin/env python3
"""Scenario-run figures: each named scenario through `ibemu run` as a user runs it.

Prints per scenario the wall time end to end (target: default <= 30 s, k8-failover <= 60 s),
the bring-up, every fault's reroute phases (ms since it was injected) and every flow's
blackout across it. Run: sudo .venv/bin/python benchmarks/bench_run.py [SCENARIO ...]
(default: default k8-failover switch-failure)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenarios", nargs="*", default=["default", "k8-failover", "switch-failure"])
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root: sudo .venv/bin/python benchmarks/bench_run.py")
    tmp = Path(tempfile.mkdtemp(prefix="ibemu-bench-run-"))
    env = {**os.environ, "IBEMU_STATE_DIR": str(tmp / "state")}
    print(f"load before: {os.getloadavg()[0]:.2f}")
    for name in args.scenarios:
        out = tmp / f"{name}.json"
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "ibemu.cli.main", "run", str(REPO / "scenarios" / f"{name}.yaml"),
                               "--out", str(tmp / name), "--json", str(out), "--no-plots", "--quiet"],
                              env=env, capture_output=True, text=True)
        wall = time.monotonic() - t0
        if proc.returncode != 0:
            print(f"{name}: failed ({proc.returncode}): {proc.stderr[-1500:]}")
            continue
        r = json.loads(out.read_text())
        print(f"\n{name}: {wall:.1f} s end to end (command), fabric up {r['bringup']['fabric_s']} s, "
              f"SUBNET UP {r['bringup']['sm_s']} s")
        for f in r["faults"]:
            ph = f["phases_ms"]
            print(f"  {f['action']} {f['target']} at {f['at_s']} s: detect {ph['detect']} trap {ph['trap']} "
                  f"routed {ph['routed']} programmed {ph['programmed']} ms")
            for fl in f["flows"]:
                print(f"    {fl['flow']:<10} blackout {fl['blackout_ms']} ms, resume {fl['resume_ms']} ms, "
                      f"lost {fl['lost']}, retransmitted {fl['retransmitted']}")
        for t in r["traffic"]:
            if "error" in t["extra"]:
                print(f"  flow {t['name']}: {t['extra']['error']}")


if __name__ == "__main__":
    main()
