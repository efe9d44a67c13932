#!/usr/bin/env python3
"""Trust figures on live fabrics: a rogue SM without the M_Key, and cross-partition delivery.
Needs root.

1. Rogue SM. ibemu's SM brings a 2-leaf, 1-spine fabric (4 hosts) up with an M_Key at
   protection level 2 (kernel datapath, the kernel SMA on). From h3 (not the SM's host) a rogue
   SM, with ibemu's SM transport through h3's MAD socket and a wrong key, tries in every round:
   an LFT block Set on every switch (everything to port 1), a PortInfo Set taking every port
   Down (switch ports and CA ports), a SwitchInfo Set (LinearFDBTop 0), and Gets of NodeInfo
   and PortInfo (refused at level 2), LID-routed and directed-route. Printed: attempts, the
   ones answered (must be 0: a refused SMP gets no answer), LFT entries and port states changed
   (must be 0), M_KeyViolations counted by the ports, and traps 256 seen by the SM (its
   ``mkey_violation`` events naming the rogue's LID).
2. Partitions. ibemu's SM with partitions a = {h1, h2} and b = {h0, h3} (full members, enforced
   both ways), on the user and the kernel datapath: frames sent on the hosts' cables with a
   partition's P_Key they may not use (h1 -> h3 with b's key, entering; h2 -> h3 with a's key,
   leaving), and members' frames for comparison. Printed: frames sent and delivered, and the
   PortRcv/XmitConstraintErrors counted.

Run: sudo IBEMU_STATE_DIR=/run/ibemu-campaign .venv/bin/python benchmarks/bench_trust.py [--runs 3] [--frames 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio
from harness import LiveFabric

from ibemu.agents.port import PortState
from ibemu.agents.switch import SwitchAgent
from ibemu.fabric.probe import send_and_count
from ibemu.hca.umad_client import UmadClient
from ibemu.sm.partitions import Partition, SmPartitions
from ibemu.sm.transport import Request, Transport, UmadPort
from ibemu.topo import generate
from ibemu.wire import madcodec as mb

KEY = 0x5EC12E7000000001
WRONG = 0x0BADC0DE
ROGUE = "h3"


def _topo() -> Any:
    return generate("leaf-spine", leaves=2, spines=1, hosts_per_leaf=2)


def dr_path(topo: Any, src: str, dst: str) -> list[int]:
    """The directed route (InitialPath[1..n], egress ports) from host ``src`` to ``dst``, by BFS."""
    prev: dict[str, tuple[str, int]] = {}
    queue, seen = [src], {src}
    while queue:
        node = queue.pop(0)
        if node == dst:
            break
        if node != src and not topo.nodes[node].is_switch:
            continue  # a CA relays nothing
        for port, far in topo.neighbors(node):
            if far.node not in seen:
                seen.add(far.node)
                prev[far.node] = (node, port)
                queue.append(far.node)
    path: list[int] = []
    node = dst
    while node != src:
        node, port = prev[node]
        path.insert(0, port)
    return path


def on_loop(lf: LiveFabric, fn: Any) -> Any:
    return trio.from_thread.run_sync(fn, trio_token=lf.token)


def agents(lf: LiveFabric) -> dict[str, Any]:
    assert lf.rt.host is not None
    return {name: rt.agent for name, rt in lf.rt.host.nodes.items()}


def snapshot(lf: LiveFabric) -> dict[str, Any]:
    """Every switch's LFT (effective entries) and every port's state, M_Key and violations."""
    def scan() -> dict[str, Any]:
        out: dict[str, Any] = {"lft": {}, "state": {}, "keys": {}, "violations": 0}
        for name, a in agents(lf).items():
            if isinstance(a, SwitchAgent):
                out["lft"][name] = dict(a.lft.effective())
            for num, p in a.ports.items():
                out["state"][(name, num)] = (p.state, p.phys)
                if (num == 0) == isinstance(a, SwitchAgent):
                    out["keys"][(name, num)] = (p.m_key, p.m_key_protect)
                    out["violations"] += p.m_key_violations
        return out
    return on_loop(lf, scan)


async def rogue_round(ns: str, targets: list[tuple[str, int, bool, list[int]]], key: int) -> tuple[int, int]:
    """One round of the rogue's attempts; (attempts, answered)."""
    client = await UmadClient.connect(ns)
    attempts = answered = 0
    try:
        t = Transport(UmadPort(client), timeout_s=0.2, retries=0, m_key=key)
        async with trio.open_nursery() as n:
            await n.start(t.serve)
            for _name, lid, is_switch, path in targets:
                pi = bytes(64)
                mads = [mb.lr_smp(mb.GET, 0x11), mb.lr_smp(mb.GET, 0x15, modifier=0 if is_switch else 1)]
                ports = range(0, 4) if is_switch else (1,)
                mads += [mb.lr_smp(mb.SET, 0x15, modifier=p, data=mb.port_info_set(pi, port_state=1, phys_state=3))
                         for p in ports]
                if is_switch:
                    mads += [mb.lr_smp(mb.SET, 0x19, modifier=0, data=bytes([1]) * 64),
                             mb.lr_smp(mb.SET, 0x12, data=mb.switch_info_set(bytes(64), linear_fdb_top=0))]
                reqs: list[Request] = [Request(m, dlid=lid) for m in mads]
                # and the same Sets by directed route, the way an SM reaches an unconfigured port
                reqs += [Request(mb.dr_smp(mb.SET, 0x15, path=path, modifier=p,
                                           data=mb.port_info_set(pi, port_state=1, phys_state=3))) for p in ports]
                if is_switch:
                    reqs.append(Request(mb.dr_smp(mb.SET, 0x19, path=path, modifier=0, data=bytes([1]) * 64)))
                replies = await t.request_all(reqs)
                attempts += len(reqs)
                answered += sum(r is not None for r in replies)
            n.cancel_scope.cancel()
    finally:
        client.close()
    return attempts, answered


def sm_violations(run_dir: Path, rogue_lid: int) -> tuple[int, int]:
    """Traps 256 the SM logged: (all, those naming the rogue's LID; a directed-route SMP's
    trap names the permissive DR SLID instead)."""
    path = run_dir / "ibemu" / "events.jsonl"
    if not path.exists():
        return 0, 0
    n = by_lid = 0
    for line in path.read_text().splitlines():
        if '"mkey_violation"' in line:
            e = json.loads(line)
            n += 1
            by_lid += e.get("lidaddr") == rogue_lid
    return n, by_lid


def rogue_sm(tmp: Path, rounds: int) -> dict[str, Any]:
    lf = LiveFabric(_topo(), tmp, scenario="bench-trust-rogue", sm="ibemu", sm_host="h0",
                    sm_keys={"m_key": KEY, "m_key_protect": 2, "m_key_lease_s": 600})
    with lf:
        ag = agents(lf)
        lids = on_loop(lf, lambda: {n: (a.lid if isinstance(a, SwitchAgent) else a.lid(1)) for n, a in ag.items()})
        before = snapshot(lf)
        keyed = sum(1 for k, p in before["keys"].values() if k == KEY and p == 2)
        targets = [(name, lids[name], isinstance(ag[name], SwitchAgent), dr_path(lf.rt.topo, ROGUE, name))
                   for name in ("leaf1", "spine0", "leaf0", "h0", "h2")]
        attempts = answered = 0
        t0 = time.monotonic()
        for _ in range(rounds):
            a, r = trio.run(rogue_round, lf.ns(ROGUE), targets, WRONG)
            attempts += a
            answered += r
        elapsed = time.monotonic() - t0
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and on_loop(lf, lambda: sum(len(a.traps) for a in ag.values())):
            time.sleep(0.2)  # until the SM repressed every trap (each reached its log)
        time.sleep(0.5)
        after = snapshot(lf)
        lft_changed = sum(1 for sw, lft in before["lft"].items() for lid, port in lft.items()
                          if after["lft"][sw].get(lid) != port)
        lft_changed += sum(1 for sw, lft in after["lft"].items() for lid in lft if lid not in before["lft"][sw])
        states_changed = sum(1 for k, v in before["state"].items() if after["state"][k] != v)
        keys_changed = sum(1 for k, v in before["keys"].items() if after["keys"][k] != v)
        not_active = sum(1 for (name, num), (st, _ph) in after["state"].items() if num and st != PortState.ACTIVE
                         and before["state"][(name, num)][0] == PortState.ACTIVE)
        traps = sm_violations(lf.rt.run_dir or tmp, lids[ROGUE])
        unrepressed = on_loop(lf, lambda: sum(len(a.traps) for a in ag.values()))
    return {"keyed ports": keyed, "attempts": attempts, "answered": answered, "lft entries changed": lft_changed,
            "port states changed": states_changed, "keys changed": keys_changed, "ports no longer Active": not_active,
            "M_KeyViolations": after["violations"] - before["violations"], "traps 256 at the SM": traps[0],
            "of them naming the rogue's LID": traps[1], "traps unrepressed": unrepressed,
            "seconds": round(elapsed, 2)}


def partitions(tmp: Path, datapath: str, frames: int) -> dict[str, Any]:
    topo = _topo()
    g = {n.name: n.guid for n in topo.cas()}
    parts = SmPartitions((Partition("a", 0x0001, ((g["h1"], True), (g["h2"], True))),
                          Partition("b", 0x0002, ((g["h0"], True), (g["h3"], True)))))
    lf = LiveFabric(topo, tmp, scenario="bench-trust-pkey", sm="ibemu", sm_host="h0", datapath=datapath,
                    sm_partitions=parts.to_json())
    with lf:
        ag = agents(lf)
        lids = on_loop(lf, lambda: {n: a.lid(1) for n, a in ag.items() if not isinstance(a, SwitchAgent)})

        def blast(src: str, dst: str, pkey: int) -> int:
            return send_and_count(lf.rt.plan, src, dst, lids[src], lids[dst], frames, size=64, wait_s=3.0, pkey=pkey)

        def constraint() -> tuple[int, int]:
            return on_loop(lf, lambda: (sum(p.counters.port_rcv_constraint_errors for a in ag.values()
                                            if isinstance(a, SwitchAgent) for p in a.ports.values()),
                                        sum(p.counters.port_xmit_constraint_errors for a in ag.values()
                                            if isinstance(a, SwitchAgent) for p in a.ports.values())))
        members = blast("h1", "h2", 0x8001) + blast("h0", "h3", 0x8002)
        c0 = constraint()
        cross = blast("h1", "h3", 0x8002) + blast("h2", "h3", 0x8001) + blast("h0", "h2", 0x8002) \
            + blast("h3", "h1", 0x8001)
        c1 = constraint()
    return {"datapath": datapath, "member frames": 2 * frames, "member delivered": members,
            "cross-partition frames": 4 * frames, "cross-partition delivered": cross,
            "PortRcvConstraintErrors": c1[0] - c0[0], "PortXmitConstraintErrors": c1[1] - c0[1]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=20, help="rogue rounds per run")
    ap.add_argument("--frames", type=int, default=1000, help="frames per partition probe")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root")
        return 2
    print(f"load {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    bad = 0
    for run in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="ibemu-trust-") as tmp:
            r = rogue_sm(Path(tmp), args.rounds)
        print(f"rogue SM, run {run + 1}: " + ", ".join(f"{k} {v}" for k, v in r.items()), flush=True)
        bad += r["answered"] + r["lft entries changed"] + r["port states changed"] + r["keys changed"]
        bad += r["traps 256 at the SM"] == 0
        for dp in ("user", "kernel"):
            with tempfile.TemporaryDirectory(prefix="ibemu-trust-") as tmp:
                p = partitions(Path(tmp), dp, args.frames)
            print(f"partitions, run {run + 1}: " + ", ".join(f"{k} {v}" for k, v in p.items()), flush=True)
            bad += p["cross-partition delivered"] + (p["member delivered"] != p["member frames"])
    print(f"load {os.getloadavg()[0]:.2f}; RESULT: " + ("rogue SM changed nothing, 0 cross-partition frames"
                                                        if not bad else f"{bad} findings"))
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
