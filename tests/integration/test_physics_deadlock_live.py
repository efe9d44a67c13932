"""A credit loop on the live IB user datapath: minhop on a ring under all-to-all stops the
traffic and the link plane's detection names the ring's ports and VL; updn on the same ring
keeps it moving.

A ring of 5 switches with 2 hosts each, 1x SDR cables (2 Gb/s), 4 KiB of input buffer per VL
(two 2 KiB packets; ``fabric.switch.buffer_kb: 4``), at dilation 200. Every host sends 2 KiB
RDMA WRITE frames to the 9 others in turn, at 40% of its line rate, from a raw socket. First updn's
LFTs (no cycle in the channel dependencies: frames flow to the end), then minhop's (every
two-hop path one way round: the clockwise cables wait on each other, as in the model's
reference simulation, ``benchmarks/bench_physics.py``). The loop is reported as a
``credit_loop`` event in the fabric log (``LinkPlane.check_loops``, what the agent host's ticker
runs every 50 ms of emulated time, 10 s of real time apart at this dilation: called here after
updn's traffic, and for minhop left to the agent host's last look when the fabric stops).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest

from ibemu import clock
from ibemu.fabric.agents import make_agents
from ibemu.fabric.runtime import FabricRuntime
from ibemu.kernel import ownership
from ibemu.physics.link import LinkModel, default_switch_model
from ibemu.testing.livephysics import native_frames, program, routes, run_traffic, wire_bytes
from ibemu.topo import generate
from ibemu.topo.rates import parse_rate
from tests.integration.live import fabric_in_thread

pytestmark = pytest.mark.root

DILATION = 200
SIZE = 2048
OFFER = 0.4
"""Of each host's line rate: more than the ring carries under all-to-all (~20% in the model), so
the hosts' queues (the HCAs', in the model) never run dry, and few enough frames for the datapath."""


def _all_to_all(rt: FabricRuntime, lids: dict[str, int], hosts: list[str]) -> list[dict[str, Any]]:
    link = LinkModel.of(rt.topo.defaults.rate)
    flows = []
    for h in hosts:
        frames = native_frames(rt.plan, lids, h, [d for d in hosts if d != h], n=63, payload=SIZE)
        fps = link.gbps * 1e9 / ((wire_bytes(frames[0]) + link.framing_bytes) * 8)
        flows.append({"ns": rt.plan.nodes[h].ns, "if": rt.plan.nodes[h].ports[1].ifname, "frames": frames,
                      "fps": OFFER * fps / DILATION})
    return flows


def test_minhop_on_a_ring_deadlocks_and_is_detected_updn_does_not(state_dir: Path, tmp_path: Path) -> None:
    topo = generate("ring", switches=5, hosts_per_switch=2)
    topo.defaults = dataclasses.replace(topo.defaults, rate=parse_rate("1x SDR"))
    model = dataclasses.replace(default_switch_model(topo.defaults.rate, ethernet=False), buffer_bytes=4096)
    hosts = [n.name for n in topo.cas()]
    state = ownership.RunState(ownership.new_run_id(), scenario="pytest-physics-deadlock")
    clock.configure(DILATION)
    found: dict[str, list[Any]] = {}
    delivered: dict[str, tuple[int, int]] = {}
    try:
        rt = FabricRuntime(topo, make_agents=make_agents, datapath="user", state=state, run_dir=tmp_path,
                           mad_sockets=False, switch_model=model)
        with fabric_in_thread(rt, emulated_clock=True) as live:
            time.sleep(0.3)  # every carrier seen
            host = live.host
            assert host is not None and host.links is not None
            links = host.links
            receivers = [{"ns": rt.plan.nodes[h].ns, "if": rt.plan.nodes[h].ports[1].ifname} for h in hosts]
            for engine in ("updn", "minhop"):
                lids, lfts = routes(topo, engine)
                live.on_loop(program, host, lids, lfts)
                seconds = 0.7 if engine == "updn" else 1.2
                out = run_traffic(_all_to_all(rt, lids, hosts), receivers, seconds=seconds, drain_s=0.3,
                                  workdir=tmp_path)
                if engine == "updn":  # minhop's is left to the agent host's last look, at teardown
                    live.on_loop(links.check_loops)
                found[engine] = live.on_loop(lambda: links.plane.credit_loops(1_000_000))
                stamps = sorted(s for got in out["got"] for s, _, n in got if n > SIZE)
                t0 = min(stamps) if stamps else 0
                half = t0 + seconds * 0.5e9  # frames received in the second half of the sending
                delivered[engine] = (len(stamps), sum(1 for s in stamps if s > half))
    finally:
        clock.configure(1)
    assert not found["updn"], found["updn"]
    assert delivered["updn"][1] > 200, delivered  # still flowing at the end
    assert delivered["minhop"][1] < delivered["updn"][1] / 20, delivered  # stopped
    (loop,) = found["minhop"]
    ring = {(f"sw{i}", p) for i in range(5) for p in (3, 4)}
    assert len(loop.hops) == 5 and all((n, p) in ring and vl == 0 for n, p, vl in loop.hops), loop.describe()
    assert len({p for _, p, _ in loop.hops}) == 1  # one way round the ring
    events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines() if x.strip()]
    reported = [e for e in events if e["kind"] == "credit_loop"]
    assert len(reported) == 1, reported
    assert {(h["switch"], h["port"], h["vl"]) for h in reported[0]["hops"]} == set(loop.hops)
    assert reported[0]["stalled_us"] >= 1000
