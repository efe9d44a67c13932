"""Live traffic on the IB user datapath's link model, without an SM: for the live tests and
``benchmarks/bench_physics_live.py`` (head-of-line blocking, credit loops).

- :func:`routes`: the LIDs and LFTs ibemu's routing engines give a topology (``minhop``,
  ``updn`` ...), as ibemu's SM would program them (the graph discovery would build:
  ``testing.fromtopo``); :func:`program` writes them straight into a running fabric's switch
  agents (port 0's LID, LFT blocks, every cabled port Active).
- :func:`program_qos`: a scenario's ``fabric.qos`` (``ibemu.sm.qos.SmQos``) into every agent
  through the agents' own SMA, as directed-route SubnSet SMPs arriving on a port
  (PortInfo.OperationalVLs and VLHighLimit, SLtoVLMappingTable per port pair,
  VLArbitrationTable blocks 1 and 3): what ibemu's SM writes (``ibemu.sm.qos``), not sent
  over the cables. The link model re-reads them within a second (``LinkPlane.sync_qos``).
- :func:`native_frames`: valid RDMA WRITE frames (4 KiB payload by default, right ICRC/VCRC)
  from a host to others on a given SL, with their Ethernet header for the host's cable.
- A sender / receiver child process (``python -m ibemu.testing.livephysics SPEC``, driven by
  :func:`run_traffic`): every flow paced at its real frame rate from a raw socket on a host's
  cable, every receiver stamping frames in its kernel (``SO_TIMESTAMPNS``) with the frame's
  SLID; apart from the fabric's process, so the two do not share one interpreter lock.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ibemu.agents.port import PortState
from ibemu.sm.qos import ATTR_SL2VL, ATTR_VL_ARB, BLOCK_HIGH, BLOCK_LOW, SmQos
from ibemu.sm.routing import compute
from ibemu.testing.fromtopo import graph_of
from ibemu.topo.model import Topology
from ibemu.wire import fast
from ibemu.wire import madcodec as mb
from ibemu.wire.madattrs import sl2vl_table, vl_arb_block
from ibemu.wire.madpacket import frame_mad

PAYLOAD = 4096
ATTR_PORT_INFO = 0x0015
ETH = 14


def routes(topo: Topology, engine: str = "minhop") -> tuple[dict[str, int], dict[str, dict[int, int]]]:
    """Every node's LID (switch: port 0's; CA: port 1's) and every switch's LFT (LID -> port)
    as ``engine`` routes ``topo``."""
    graph = graph_of(topo)
    r = compute(graph, engine)
    lids = {name: graph.nodes[n.guid].lid for name, n in topo.nodes.items()}
    lfts = {name: dict(r.lfts[n.guid]) for name, n in topo.nodes.items() if n.is_switch}
    return lids, lfts


def program(host: Any, lids: Mapping[str, int], lfts: Mapping[str, Mapping[int, int]]) -> None:
    """Write ``lids`` and ``lfts`` into the agent host's switch agents, every cabled port
    Active (on the fabric's loop)."""
    for name, table in lfts.items():
        agent = host.nodes[name].agent
        agent.ports[0].lid = lids[name]
        blocks: dict[int, bytearray] = {}
        for lid, port in table.items():
            blocks.setdefault(lid // 64, bytearray(agent.lft.get_block(lid // 64)))[lid % 64] = port
        for b, data in blocks.items():
            agent.lft.set_block(b, bytes(data))
        agent.lft.set_top(max(lids.values()))
        for num, p in agent.ports.items():
            if num and p.link_is_up:
                p.state = PortState.ACTIVE


def _set(agent: Any, ingress: int, attr: int, mod: int, data: bytes) -> None:
    """A directed-route SubnSet that reached ``agent`` on ``ingress``; raises unless answered
    with status 0."""
    mad = bytearray(mb.dr_smp(mb.SET, attr, path=[ingress], modifier=mod, tid=0x1B, data=data))
    mad[6] = 1  # hop pointer: arrived
    for act in agent.receive(ingress, frame_mad(mad, dlid=0xFFFF, slid=0xFFFF, dqp=0, sqp=0, qkey=0, vl=15)):
        packet = getattr(act, "packet", None)
        if packet is not None:
            status = struct.unpack_from("!H", packet, 8 + 12 + 8 + 4)[0] & 0x7FFF  # LRH, BTH, DETH; MAD status
            if status:
                raise ValueError(f"{agent!r}: SubnSet {attr:#x} mod {mod:#x} answered status {status:#x}")


def program_qos(host: Any, qos: SmQos) -> None:
    """``qos`` into every agent of the agent host, as ibemu's SM programs it (the module
    docstring; on the fabric's loop)."""
    from ibemu.physics.qos import code_of_vls

    table = sl2vl_table(qos.sl_to_vl())
    high, low = qos.tables()
    for rt in host.nodes.values():
        agent = rt.agent
        live = sorted(num for num, p in agent.ports.items() if num and p.link_is_up)
        if not live:
            continue
        is_switch = 0 in agent.ports
        for num in live:
            ingress = live[0] if is_switch else num  # a CA's SMA answers for the port the SMP came in on
            mod = num if is_switch else 0
            pi = agent.ports[num].encode(num)
            _set(agent, ingress, ATTR_PORT_INFO, mod,
                 mb.port_info_set(pi, operational_vls=code_of_vls(qos.vls), vl_high_limit=qos.vl_high_limit))
            for block, entries in ((BLOCK_LOW, low), (BLOCK_HIGH, high)):
                _set(agent, ingress, ATTR_VL_ARB, (block << 16) | mod, vl_arb_block(list(entries)))
            if not is_switch:
                _set(agent, ingress, ATTR_SL2VL, 0, table)
                continue
            for i in [0, *live]:
                if i != num:
                    _set(agent, ingress, ATTR_SL2VL, (i << 8) | num, table)


def native_frames(plan: Any, lids: Mapping[str, int], src: str, dsts: Sequence[str], *, sl: int = 0,
                  n: int = 64, payload: int = PAYLOAD) -> list[bytes]:
    """``n`` RDMA WRITE frames from ``src`` to ``dsts`` in turn (PSNs 0..n-1), on ``sl``."""
    pp = plan.nodes[src].ports[1]
    eth = fast.ethernet_header(pp.peer_mac, pp.mac)
    tpls = [fast.NativeTemplate(slid=lids[src], dlid=lids[d], destqp=0x100, sl=sl, eth=eth) for d in dsts]
    return [tpls[i % len(tpls)].packet(0x0A, i, bytes(payload), ext=fast.reth(0, 0, payload)) for i in range(n)]


def wire_bytes(frame: bytes) -> int:
    """A native frame's bytes on an IB cable (LRH .. VCRC), without the veth's Ethernet header."""
    return len(frame) - ETH


# ------------------------------------------------------------------ head-of-line blocking

HOL_FLOWS = {"hot": ("h0", "h3"), "local": ("h4", "h3"), "victim": ("h1", "h5")}
"""The congestion-spreading case on :func:`hol_topology`: ``hot`` (h0 on leaf0 to h3 on leaf1,
across the spine) and ``local`` (h4, h3's neighbour on leaf1) share h3's port, 2:1; the
``victim`` (h1 on leaf0 to h5 on leaf1) shares the hot flow's leaf0 -> spine -> leaf1 ports,
not its destination."""


def hol_flows(plan: Any, lids: Mapping[str, int], host_link: Any, dilation: float, *, victim_sl: int,
              n: int = 64) -> list[dict[str, Any]]:
    """:data:`HOL_FLOWS` as ``run_traffic`` flows: each offered at 1.05x the host cable's rate
    (``host_link``: its ``LinkModel``) in emulated time, the victim on ``victim_sl``, the others
    on SL 0."""
    flows = []
    for name, (src, dst) in HOL_FLOWS.items():
        frames = native_frames(plan, lids, src, [dst], sl=victim_sl if name == "victim" else 0, n=n)
        fps = 1.05 * host_link.gbps * 1e9 / ((wire_bytes(frames[0]) + host_link.framing_bytes) * 8)
        flows.append({"ns": plan.nodes[src].ns, "if": plan.nodes[src].ports[1].ifname, "frames": frames,
                      "fps": fps / dilation})
    return flows


def hol_topology(host_rate: str, switch_rate: str) -> Topology:
    """Two leaves under one spine, three hosts each, the hosts' cables at ``host_rate`` and the
    leaf-spine cables at ``switch_rate`` (twice as fast: the victim alone would not be limited
    by the shared cables, the hot flow's half of h3's port and the victim's whole line fit)."""
    from ibemu.topo import generate
    from ibemu.topo.rates import parse_rate

    topo = generate("leaf-spine", leaves=2, spines=1, hosts_per_leaf=3)
    topo.defaults = replace(topo.defaults, rate=parse_rate(host_rate))
    fast_rate = parse_rate(switch_rate)
    for link in topo.links:
        if topo.node(link.a.node).is_switch and topo.node(link.b.node).is_switch:
            link.rate = fast_rate
    return topo


def simulate_hol(topo: Topology, *, victim_sl: int, qos: SmQos | None, switch: Any,
                 until_ns: int = 2_000_000, size: int = PAYLOAD + 42) -> dict[str, float]:
    """The model's expectation for :data:`HOL_FLOWS` on ``topo`` (``physics.sim``, the same
    nodes the live plane builds, minhop routes, saturating senders): each flow's rate as a
    fraction of its host cable's data rate, after a warm-up of a quarter of the run."""
    from ibemu.physics.link import LinkModel
    from ibemu.physics.plan import build_nodes
    from ibemu.physics.qos import Sl2Vl, VlArb
    from ibemu.physics.sim import Flow, Simulator

    lids, lfts = routes(topo, "minhop")

    def route(sw: str, frame: Any) -> int:
        return lfts[sw][frame.dst]

    sim = Simulator("ib", route)
    kw: dict[str, Any] = {}
    if qos is not None:
        high, low = qos.tables()
        kw = {"data_vls": qos.vls, "sl2vl": Sl2Vl(qos.sl_to_vl()),
              "vlarb": VlArb(high=high, low=low, high_limit=qos.vl_high_limit)}
    sim.adopt(build_nodes(topo, kind="ib", switch=switch, **kw), {h: lids[h] for h in topo.nodes})
    warm = until_ns // 4
    flows = {name: sim.add_flow(Flow(src, lids[dst], size=size, sl=victim_sl if name == "victim" else 0, backlog=8))
             for name, (src, dst) in HOL_FLOWS.items()}
    sim.run(warm)
    before = {k: f.delivered_bytes for k, f in flows.items()}
    sim.run(until_ns)
    host_gbps = LinkModel.of(topo.defaults.rate).gbps
    framing = LinkModel.of(topo.defaults.rate).framing_bytes
    return {k: (f.delivered_bytes - before[k]) * (size + framing) / size * 8 / (until_ns - warm) / host_gbps
            for k, f in flows.items()}


# ------------------------------------------------------------------ the traffic child

def _child(spec_path: str) -> None:
    from ibemu.kernel.packet import kernel_stamp, open_packet_socket, stamp_received

    spec = json.loads(Path(spec_path).read_text())
    flows = []
    for f in spec["flows"]:
        sk = open_packet_socket(f["ns"], f["if"], 0x0003, buffer_bytes=4 << 20)
        sk.setblocking(False)
        flows.append((sk, [bytes.fromhex(x) for x in f["frames"]], f["fps"] / 1000.0))
    receivers = []
    for r in spec["receivers"]:
        rx = open_packet_socket(r["ns"], r["if"], 0x88B5, buffer_bytes=32 << 20)
        stamp_received(rx)
        rx.settimeout(0.1)
        receivers.append(rx)
    got: list[list[tuple[int, int, int]]] = [[] for _ in receivers]  # (kernel stamp, SLID, bytes)
    stop = threading.Event()

    def receive(i: int, rx: socket.socket) -> None:
        while not stop.is_set():
            try:
                data, anc, _, _ = rx.recvmsg(9216, 64)
            except TimeoutError:
                continue
            except OSError:
                return
            stamp = kernel_stamp(anc) or 0
            if len(data) >= ETH + 8 and data[ETH] >> 4 != 15:
                got[i].append((stamp, int.from_bytes(data[ETH + 6:ETH + 8], "big"), len(data) - ETH))

    threads = [threading.Thread(target=receive, args=(i, rx), daemon=True) for i, rx in enumerate(receivers)]
    for th in threads:
        th.start()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    sys.stdin.readline()
    sent = [0] * len(flows)
    owed = [0.0] * len(flows)
    failed = 0
    t0 = time.perf_counter()
    end = t0 + spec["seconds"]
    tick = t0
    while time.perf_counter() < end:
        for k, (sk, frames, per_ms) in enumerate(flows):
            owed[k] += per_ms
            while owed[k] >= 1:
                try:
                    sk.send(frames[sent[k] % len(frames)])
                    sent[k] += 1
                except OSError:
                    failed += 1
                owed[k] -= 1
        tick += 0.001
        delay = tick - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
    time.sleep(spec["drain_s"])
    stop.set()
    for th in threads:
        th.join(2)
    offset = time.clock_gettime_ns(time.CLOCK_REALTIME) - time.monotonic_ns()
    sys.stdout.write(json.dumps({"got": got, "sent": sent, "failed": failed, "offset": offset}) + "\n")
    sys.stdout.flush()


def run_traffic(flows: Sequence[Mapping[str, Any]], receivers: Sequence[Mapping[str, str]], *, seconds: float,
                drain_s: float, workdir: Path) -> dict[str, Any]:
    """Run the traffic child: ``flows`` ({ns, if, frames: [bytes], fps: real frames/s}) for
    ``seconds``, ``receivers`` ({ns, if}) until ``drain_s`` after. Returns what it received per
    receiver (``got[i]``: [kernel stamp in real-time ns, SLID, wire bytes]), the frames each
    flow sent, sends refused, and ``offset`` (CLOCK_REALTIME - CLOCK_MONOTONIC, to turn the
    stamps into monotonic ns: ``stamp - offset``)."""
    spec = {"flows": [{**f, "frames": [bytes(x).hex() for x in f["frames"]]} for f in flows],
            "receivers": list(receivers), "seconds": seconds, "drain_s": drain_s}
    return child_run([sys.executable, "-m", "ibemu.testing.livephysics"], spec, workdir / "livephysics-spec.json")


def child_run(argv: Sequence[str], spec: Mapping[str, Any], path: Path) -> dict[str, Any]:
    """A traffic child's run: ``spec`` written to ``path``, ``argv + [path]`` started with this
    checkout on its path; once it says ``ready`` it is told ``go``, and its one JSON line of
    results is returned (ended by PID if it does not exit within 30 s after)."""
    path.write_text(json.dumps(spec))
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.Popen([*argv, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the traffic child did not start")
        proc.stdin.write("go\n")
        proc.stdin.flush()
        return dict(json.loads(proc.stdout.readline()))
    finally:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

if __name__ == "__main__":
    _child(sys.argv[1])
