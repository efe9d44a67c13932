#!/usr/bin/env python3
"""ibemu's SM bringing a k=8 fat-tree up while the agents lose a share of the SMPs (root).

Per run: a fresh live k=8 fat-tree (kernel datapath, no SM), then every agent set to lose
``--loss`` percent of the VL15 frames reaching it (the ``smp_loss`` fault's primitive,
``AgentHost.set_vl15_loss``: the kernel SMA and DR relay step aside on a lossy node, as for the
fault, so every SMP crosses a lossy agent at each hop), then ``python -m ibemu.sm`` on h0 on its
own packet socket, as ``ibemu run`` starts it. Printed per run: time from the SM's start to
SUBNET UP, the cold sweep's own time, SMPs sent, retries, timeouts and failures (the SM's
transport counters for that sweep), SMPs the agents dropped, and whether it converged: every
cabled port Active and every switch's LFT routing every CA's LID (counted from the agents).
A run with ``--loss 0`` first gives the baseline on the same machine.

Run: sudo IBEMU_STATE_DIR=/run/ibemu-campaign .venv/bin/python benchmarks/bench_sm_loss.py [--runs 3] [--loss 10] [--k 8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio
from bench_sm import LiveFabric, start_sm, stop, wait_kind

from ibemu.agents.lft import NO_ROUTE
from ibemu.agents.port import PhysState, PortState
from ibemu.agents.switch import SwitchAgent


def converged(fab: LiveFabric) -> tuple[int, int]:
    """(cabled ports not Active, (switch, CA LID) pairs without a route)."""
    host = fab.rt.host
    assert host is not None

    def scan() -> tuple[int, int]:
        agents = [rt.agent for rt in host.nodes.values()]
        not_active = sum(1 for a in agents for num, p in a.ports.items()
                         if num and p.phys == PhysState.LINK_UP and p.state != PortState.ACTIVE)
        ca_lids = [a.lid(1) for a in agents if not isinstance(a, SwitchAgent)]
        unrouted = sum(1 for a in agents if isinstance(a, SwitchAgent) for lid in ca_lids
                       if not lid or a.lft.lookup(lid) in (NO_ROUTE, 0))
        return not_active, unrouted
    return trio.from_thread.run_sync(scan, trio_token=fab.token)


def one(k: int, loss: float, tmp: Path) -> dict[str, Any]:
    with LiveFabric(k, tmp) as fab:
        host = fab.rt.host
        assert host is not None
        names = list(host.nodes)
        trio.from_thread.run_sync(lambda: [host.set_vl15_loss(n, loss / 100) for n in names], trio_token=fab.token)
        events = tmp / f"sm-loss-{loss:g}-{time.monotonic_ns()}.jsonl"
        t0 = time.monotonic_ns()
        proc = start_sm(fab, events, 128, "ftree", "own")
        try:
            up = wait_kind(events, "subnet_up", proc, 300)
            end = wait_kind(events, "sweep_end", proc, 30)
            not_active, unrouted = converged(fab)
            dropped = trio.from_thread.run_sync(lambda: sum(host.nodes[n].vl15_dropped for n in names),
                                                trio_token=fab.token)
        finally:
            stop(proc)
    smps = end["smps"]
    return {"up_s": (up["t_ns"] - t0) / 1e9, "sweep_s": float(up["seconds"]), "sent": smps.get("sent", 0),
            "retries": smps.get("retries", 0), "timeouts": smps.get("timeouts", 0), "failed": smps.get("failed", 0),
            "dropped": dropped, "not_active": not_active, "unrouted": unrouted}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--loss", type=float, default=10.0, help="percent of SMPs lost at every agent")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-baseline", action="store_true")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root")
        return 2
    print(f"k={args.k} fat-tree, ibemu's SM (ftree, own port), SMP loss {args.loss:g}% at every agent; "
          f"load {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    plan = ([0.0] if not args.no_baseline else []) + [args.loss] * args.runs
    rows: list[dict[str, Any]] = []
    bad = 0
    for i, loss in enumerate(plan):
        with tempfile.TemporaryDirectory(prefix="ibemu-smloss-") as tmp:
            r = one(args.k, loss, Path(tmp))
        r["loss"] = loss
        rows.append(r)
        ok = r["not_active"] == 0 and r["unrouted"] == 0
        bad += not ok
        print(f"run {i + 1} loss {loss:4g}%: SUBNET UP {r['up_s']:.2f} s (sweep {r['sweep_s']:.2f} s), "
              f"SMPs {r['sent']:,}, retries {r['retries']:,}, timeouts {r['timeouts']:,}, failed {r['failed']}, "
              f"dropped by the agents {r['dropped']:,}; ports not Active {r['not_active']}, "
              f"unrouted (switch, LID) {r['unrouted']} -> {'converged' if ok else 'NOT CONVERGED'}", flush=True)
    lossy = [r for r in rows if r["loss"] == args.loss and args.loss]
    if lossy:
        def rng(key: str) -> str:
            vals = [r[key] for r in lossy]
            return f"{min(vals):g}-{max(vals):g} (median {statistics.median(vals):g})"
        print(f"with {args.loss:g}% loss over {len(lossy)} runs: SUBNET UP s {rng('up_s')}, retries {rng('retries')}, "
              f"timeouts {rng('timeouts')}")
    print(f"load {os.getloadavg()[0]:.2f}; RESULT: " + ("every run converged" if not bad else f"{bad} runs did not converge"))
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
