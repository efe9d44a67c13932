#!/usr/bin/env python3
"""ibemu's SM bringing a k=8 fat-tree up while the agents lose a share of the SMPs (root).

Per run: a fresh live k=8 fat-tree (kernel datapath, no SM), then the SM's leaf switch (or
with ``--where all`` every agent) set to lose ``--loss`` percent of the VL15 frames reaching
it (the ``smp_loss`` fault's primitive, ``AgentHost.set_vl15_loss``: the kernel SMA and DR
relay step aside on a lossy node, as for the fault). On the leaf every request of the SM and
every answer crosses the lossy agent once: each is lost with that probability, the model of
``tests/unit/sm/test_manager.py``'s 10% test. Then ``python -m ibemu.sm`` on h0 on its own
packet socket, as ``ibemu run`` starts it. Printed per run: time from the SM's start to
SUBNET UP, the last cold sweep's own time, the cold sweeps it took (one with SMPs unanswered
after every retry is followed by another, up to three), SMPs sent, retries, timeouts and
failures (the SM's transport counters, summed over those sweeps), SMPs the agents dropped,
and whether and when it converged: every cabled port Active and every switch's LFT routing
every CA's LID (counted from the agents), at SUBNET UP or, within ``--settle`` seconds, after
the SM's light sweeps (every 5 s here). The machine's load makes SMPs time out too: the
baseline shows how many.
A run with ``--loss 0`` first gives the baseline on the same machine.

Run: sudo IBEMU_STATE_DIR=/run/ibemu-campaign .venv/bin/python benchmarks/bench_sm_loss.py [--runs 3] [--loss 10] [--k 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio
from bench_sm import REPO, LiveFabric, stop, wait_for, wait_kind

from ibemu.agents.lft import NO_ROUTE
from ibemu.agents.port import PhysState, PortState
from ibemu.agents.switch import SwitchAgent
from ibemu.kernel import cpus


def start_sm(fab: LiveFabric, events: Path, log: Path, retries: int | None,
             timeout_s: float | None) -> subprocess.Popen[bytes]:
    """ibemu's SM on h0's own port (as ``ibemu run`` starts it), its stderr kept in ``log``."""
    argv = [sys.executable, "-m", "ibemu.sm", "--ns", fab.ns("h0"), "--events", str(events), "--engine", "ftree",
            "--sweep-interval", "5", *fab.rt.sm_direct_args(),
            *(["--retries", str(retries)] if retries is not None else []),
            *(["--timeout", str(timeout_s)] if timeout_s is not None else [])]
    with open(log, "wb") as err:
        proc = subprocess.Popen(argv, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                                stdout=subprocess.DEVNULL, stderr=err)
    cpus.pin_process(proc.pid, fab.rt.placement.sm)
    return proc


def _tails_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


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


def one(k: int, loss: float, tmp: Path, where: str, retries: int | None, timeout_s: float | None,
        settle_s: float) -> dict[str, Any]:
    with LiveFabric(k, tmp) as fab:
        host = fab.rt.host
        assert host is not None
        leaf = fab.rt.topo.link_at("h0", 1).other("h0").node
        names = list(host.nodes) if where == "all" else [leaf]
        trio.from_thread.run_sync(lambda: [host.set_vl15_loss(n, loss / 100) for n in names], trio_token=fab.token)
        events = tmp / f"sm-loss-{loss:g}-{time.monotonic_ns()}.jsonl"
        t0 = time.monotonic_ns()
        proc = start_sm(fab, events, tmp / "sm.log", retries, timeout_s)
        try:
            try:
                up = wait_kind(events, "subnet_up", proc, 300)
            except RuntimeError:
                print((tmp / "sm.log").read_text()[-3000:])
                raise
            wait_for(events, lambda r: r["kind"] == "sweep_end" and r.get("t_ns", 0) >= up["t_ns"],
                     "the sweep's end", proc, 30)
            sweeps = [r for r in _tails_of(events) if r["kind"] == "sweep_end" and r["t_ns"] <= up["t_ns"] + 10**9]
            not_active, unrouted = converged(fab)
            t_conv = (up["t_ns"] - t0) / 1e9 if not (not_active or unrouted) else None
            deadline = time.monotonic() + settle_s
            while t_conv is None and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.5)  # the light sweeps (every 5 s) finish what the cold ones left
                if converged(fab) == (0, 0):
                    t_conv = (time.monotonic_ns() - t0) / 1e9
            dropped = trio.from_thread.run_sync(lambda: sum(host.nodes[n].vl15_dropped for n in names),
                                                trio_token=fab.token)
        finally:
            stop(proc)
    smps: dict[str, int] = {}
    for sw in sweeps:  # every cold sweep until SUBNET UP (one more after one with SMPs unanswered)
        for key, v in sw["smps"].items():
            smps[key] = smps.get(key, 0) + v
    return {"sweeps": len(sweeps), "nodes_seen": up.get("nodes", 0), "nodes": len(fab.topo.nodes), "up_s": (up["t_ns"] - t0) / 1e9, "sweep_s": float(up["seconds"]), "sent": smps.get("sent", 0),
            "retries": smps.get("retries", 0), "timeouts": smps.get("timeouts", 0), "failed": smps.get("failed", 0),
            "dropped": dropped, "not_active": not_active, "unrouted": unrouted, "converged_s": t_conv}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--loss", type=float, default=10.0, help="percent of SMPs lost at every agent")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--where", choices=("leaf", "all"), default="leaf",
                    help="leaf: the SM's own leaf switch loses the SMPs (every request and every answer "
                         "crosses it once: the SM sees each lost with --loss %%, as the unit test's model); "
                         "all: every agent does (a DR SMP of n hops crosses ~2n lossy agents)")
    ap.add_argument("--retries", type=int, default=None, help="the SM's retries per SMP (default: its own, 3)")
    ap.add_argument("--settle", type=float, default=60.0,
                    help="seconds after SUBNET UP to wait for the light sweeps to finish the fabric")
    ap.add_argument("--timeout", type=float, default=None, help="the SM's seconds per SMP attempt (default: its own, 0.2)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root")
        return 2
    print(f"k={args.k} fat-tree, ibemu's SM (ftree, own port, retries {args.retries or 'default'}), SMP loss "
          f"{args.loss:g}% at {'the SM leaf' if args.where == 'leaf' else 'every agent'}; "
          f"load {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    plan = ([0.0] if not args.no_baseline else []) + [args.loss] * args.runs
    rows: list[dict[str, Any]] = []
    bad = 0
    for i, loss in enumerate(plan):
        with tempfile.TemporaryDirectory(prefix="ibemu-smloss-") as tmp:
            r = one(args.k, loss, Path(tmp), args.where, args.retries, args.timeout, args.settle)
        r["loss"] = loss
        rows.append(r)
        ok = r["converged_s"] is not None
        bad += not ok
        print(f"run {i + 1} loss {loss:4g}%: nodes {r['nodes_seen']}/{r['nodes']}, cold sweeps {r['sweeps']}, SUBNET UP {r['up_s']:.2f} s (sweep {r['sweep_s']:.2f} s), "
              f"SMPs {r['sent']:,}, retries {r['retries']:,}, timeouts {r['timeouts']:,}, failed {r['failed']}, "
              f"dropped by the agents {r['dropped']:,}; ports not Active {r['not_active']}, "
              f"unrouted (switch, LID) {r['unrouted']} at SUBNET UP -> "
              + (f"converged {r['converged_s']:.2f} s after the SM's start" if ok else "NOT CONVERGED"), flush=True)
    lossy = [r for r in rows if r["loss"] == args.loss and args.loss]
    if lossy:
        def rng(key: str) -> str:
            vals = [r[key] for r in lossy]
            return f"{min(vals):g}-{max(vals):g} (median {statistics.median(vals):g})"
        conv = [r for r in lossy if r["converged_s"] is not None]
        print(f"with {args.loss:g}% loss over {len(lossy)} runs: SUBNET UP s {rng('up_s')}, retries {rng('retries')}, "
              f"timeouts {rng('timeouts')}, converged in {len(conv)} of {len(lossy)}"
              + (f" ({min(r['converged_s'] for r in conv):.2f}-{max(r['converged_s'] for r in conv):.2f} s)"
                 if conv else ""))
    print(f"load {os.getloadavg()[0]:.2f}; RESULT: " + ("every run converged" if not bad else f"{bad} runs did not converge"))
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
