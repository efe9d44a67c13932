"""The agent host's plumbing on a real fabric: frames in and out, carrier events, the event log."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import trio

from ibemu.agents.actions import Action, Event, Send
from ibemu.fabric.plan import FabricPlan
from ibemu.fabric.runtime import FabricRuntime
from ibemu.kernel import ownership
from ibemu.kernel.packet import ETH_P_IB, open_packet_socket
from ibemu.topo import Endpoint, Topology, generate
from ibemu.wire import fast

pytestmark = pytest.mark.root


class Reflector:
    """A stand-in agent: sends every packet back where it came from; records link events."""

    def __init__(self, guid: int) -> None:
        self.node_guid = guid
        self.links: list[tuple[int, bool]] = []

    def receive(self, port: int, packet: bytes | bytearray | memoryview) -> list[Action]:
        return [Send(port, bytes(packet)), Event("reflected", time.monotonic_ns(), self.node_guid, {"port": port})]

    def link_up(self, port: int) -> list[Action]:
        self.links.append((port, True))
        return []

    def link_down(self, port: int) -> list[Action]:
        self.links.append((port, False))
        return []

    def link_retrained(self, port: int) -> list[Action]:
        return []

    def tick(self, now_ns: int | None = None) -> list[Action]:
        return []


def test_host_moves_frames_and_carrier_events(state_dir: Path, tmp_path: Path) -> None:
    topo = generate("single-switch", hosts=2)
    agents: dict[str, Reflector] = {}

    def make(plan: FabricPlan) -> dict[str, Reflector]:
        for node in plan.cas():
            agents[node.name] = Reflector(topo.node(node.name).guid)
        return agents

    state = ownership.RunState(ownership.new_run_id(), scenario="pytest-host")
    rt = FabricRuntime(topo, make_agents=make, state=state, run_dir=tmp_path, mad_sockets=False)

    async def main() -> None:
        async with rt.running() as host:
            sw = rt.plan.switches()[0]
            h0 = agents["h0"] if "h0" in agents else next(iter(agents.values()))
            h0_name = next(n for n, a in agents.items() if a is h0)
            sw_port = next(p for p, pp in sw.ports.items() if pp.peer_node == h0_name)
            probe = await trio.to_thread.run_sync(open_packet_socket, sw.ns, sw.ports[sw_port].ifname)
            try:
                assert (rt.plan.nodes[h0_name].ports[1].port, True) in [(p, u) for p, u in h0.links]
                # A CA's agent hears QP0/QP1 (here QP1); data QPs belong to the host's transport.
                data = fast.NativeTemplate(slid=1, dlid=2, destqp=7).packet(0x04, 4, b"data")
                probe.send(b"\xff" * 6 + b"\x02" * 6 + b"\x88\xb5" + data)
                pkt = fast.NativeTemplate(slid=1, dlid=2, destqp=1).packet(0x04, 5, b"ping")
                probe.send(b"\xff" * 6 + b"\x02" * 6 + b"\x88\xb5" + pkt)
                with trio.fail_after(5):
                    while True:
                        await trio.lowlevel.wait_readable(probe)
                        frame = probe.recv(9000)
                        assert frame[14:] != data, "a data-QP frame reached the CA's agent"
                        if frame[14:] == pkt:
                            break
                # The reflected frame carries the host port's MAC and its peer's.
                assert frame[6:12] == rt.plan.nodes[h0_name].ports[1].mac
                # Unplug at the switch end: the host's agent hears carrier loss.
                await trio.to_thread.run_sync(host.fabric.links.set_up, sw.ns, sw.ports[sw_port].ifname, False)
                with trio.fail_after(5):
                    while (1, False) not in h0.links:
                        await trio.sleep(0.01)
            finally:
                probe.close()

    trio.run(main)
    assert not any(ownership.netns.exists(n) for n in rt.plan.namespaces)
    records = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    kinds = {r["kind"] for r in records}
    assert {"reflected", "carrier"} <= kinds


class Crasher(Reflector):
    """An agent with a bug: the first packet kills it."""

    def receive(self, port: int, packet: bytes | bytearray | memoryview) -> list[Action]:
        raise RuntimeError("agent bug")


def test_an_agent_crash_is_reported_and_the_fabric_torn_down(state_dir: Path, tmp_path: Path) -> None:
    topo = generate("single-switch", hosts=2)
    state = ownership.RunState(ownership.new_run_id(), scenario="pytest-crash")
    rt = FabricRuntime(topo, make_agents=lambda plan: {n.name: Crasher(1) for n in plan.cas()}, state=state,
                       run_dir=tmp_path, mad_sockets=False)

    async def main() -> None:
        async with rt.running():
            sw = rt.plan.switches()[0]
            probe = await trio.to_thread.run_sync(open_packet_socket, sw.ns, sw.ports[1].ifname)
            probe.send(b"\xff" * 6 + b"\x02" * 6 + b"\x88\xb5" + b"\0" * 30)
            probe.close()
            await trio.sleep(10)  # the crash cancels this

    with pytest.raises(BaseException) as exc:
        trio.run(main)
    assert "agent bug" in repr(exc.value) or any("agent bug" in repr(e) for e in getattr(exc.value, "exceptions", []))
    assert not any(ownership.netns.exists(n) for n in rt.plan.namespaces)
    assert not state.path.exists()


def _dr_frame(hp: int, path: list[int], *, back: bool = False, rp: dict[int, int] | None = None) -> bytes:
    from ibemu.wire import madcodec as mb
    from ibemu.wire.madpacket import frame_mad

    mad = bytearray(mb.dr_smp(mb.GET, 0x11, path=path, tid=7))
    mad[6] = hp
    if back:
        mad[4] |= 0x80
    for i, v in (rp or {}).items():
        mad[192 + i] = v
    return frame_mad(mad, dlid=0xFFFF, slid=0xFFFF, dqp=0, sqp=0, qkey=0, vl=15)


def test_kernel_dr_relay_rewrites_as_the_agent_does() -> None:
    """The eBPF relay's output is the switch agent's relay, byte for byte; what it must not
    relay (the last hop, a bad port, a bad CRC, a disabled switch, an egress without
    carrier) it leaves to the agent."""
    from ibemu.agents.switch import SwitchAgent
    from ibemu.kernel import bpf, dr_relay

    dr_relay._self_check()
    relay = dr_relay.DrRelay()
    mac_in, peer_in = bytes([2, 0x1B, 0, 5, 3, 0]), bytes([2, 0x1B, 0, 9, 1, 0])
    mac_out, peer_out = bytes([2, 0x1B, 0, 5, 4, 0]), bytes([2, 0x1B, 0, 7, 2, 0])
    relay.add_port(5, 3, 1, mac_in, peer_in, up=True)  # test runs see ifindex 1 (lo)
    relay.add_port(5, 4, 1, mac_out, peer_out, up=True)
    sw = SwitchAgent(node_guid=0x1000, num_ports=8, link_up=[True] * 8)
    eth = mac_in + peer_in + b"\x88\xb5"
    try:
        for pkt, relayed in [(_dr_frame(1, [1, 4, 3]), True),
                             (_dr_frame(3, [1, 4, 3], back=True, rp={1: 2, 2: 4}), True),
                             (_dr_frame(2, [1, 4]), False), (_dr_frame(1, [1, 9, 3]), False)]:
            ret, out, _ns = bpf.test_run(relay.prog_fd, eth + pkt)
            sends = [a for a in sw.receive(3, pkt) if isinstance(a, Send)]
            if relayed:
                assert ret == bpf.TC_ACT_REDIRECT
                assert out[14:] == sends[0].packet and out[:12] == peer_out + mac_out
            else:
                assert ret == bpf.TC_ACT_UNSPEC
        bad = bytearray(_dr_frame(1, [1, 4, 3]))
        bad[100] ^= 1
        assert bpf.test_run(relay.prog_fd, eth + bytes(bad))[0] == bpf.TC_ACT_UNSPEC
        relay.set_enabled(5, False)
        assert bpf.test_run(relay.prog_fd, eth + _dr_frame(1, [1, 4, 3]))[0] == bpf.TC_ACT_UNSPEC
        relay.set_enabled(5, True)
        relay.set_carrier(5, 4, False)
        assert bpf.test_run(relay.prog_fd, eth + _dr_frame(1, [1, 4, 3]))[0] == bpf.TC_ACT_UNSPEC
    finally:
        relay.close()


def _up_from_h0(topo: Topology) -> tuple[Endpoint, int, Endpoint, int]:
    """On a fat-tree: h0's edge switch (its port facing h0), an uplink of it, the aggregation
    switch that uplink reaches (its port facing the edge) and an uplink of that."""
    edge = topo.peer("h0", 1)
    assert edge is not None
    up = next(p for p, e in topo.neighbors(edge.node) if (topo.node(e.node).level or 0) > (topo.node(edge.node).level or 0))
    agg = topo.peer(edge.node, up)
    assert agg is not None
    up2 = next(p for p, e in topo.neighbors(agg.node) if (topo.node(e.node).level or 0) > (topo.node(agg.node).level or 0))
    return edge, up, agg, up2


def test_dr_smps_cross_intermediate_switches_in_the_kernel(state_dir: Path, tmp_path: Path) -> None:
    """A DR NodeInfo through 3 switches is answered by the third; the first two relay it in
    the kernel (their agents never see it) unless an SMP-loss fault is set on them; with the
    kernel SMA the third answers it in the kernel too (its agent never sees it)."""
    from ibemu.fabric.agents import make_agents
    from ibemu.hca.umad_client import UmadClient
    from ibemu.wire import madcodec as mb
    from ibemu.wire.umad import SimRequest

    topo = generate("fat-tree", k=4)
    state = ownership.RunState(ownership.new_run_id(), scenario="pytest-dr-relay")
    rt = FabricRuntime(topo, make_agents=make_agents, state=state, run_dir=tmp_path)
    edge, up, agg, up2 = _up_from_h0(topo)

    async def main() -> None:
        async with rt.running() as host:
            assert host.dr_relay is not None or host.kernel_sma is not None
            far = host.nodes[topo.peer(agg.node, up2).node]  # type: ignore[union-attr]
            client = await UmadClient.connect(host.nodes["h0"].plan.ns)
            try:
                for tid, relay_on in ((1, True), (2, False)):
                    host.nodes[edge.node].vl15_loss = 0.0 if relay_on else 1e-9
                    host._sync_relay(edge.node, host.nodes[edge.node])
                    seen = host.nodes[edge.node].agent.ports[edge.port].counters.rcv_pkts  # type: ignore[attr-defined]
                    answered = far.agent.stats["smp_answered"]  # type: ignore[attr-defined]
                    client.send(SimRequest(dlid=0xFFFF, slid=0xFFFF, dqp=0, sqp=0,
                                           mad=mb.dr_smp(mb.GET, 0x11, path=[1, up, up2], tid=tid)))
                    with trio.fail_after(5):
                        resp = await client.recv()
                    assert resp.status == 0 and resp.mad[4] & 0x80 and resp.mad[3] == 0x81
                    assert int.from_bytes(resp.mad[64 + 12 : 64 + 20], "big") == topo.node(
                        topo.peer(agg.node, up2).node).guid  # type: ignore[union-attr]
                    now = host.nodes[edge.node].agent.ports[edge.port].counters.rcv_pkts  # type: ignore[attr-defined]
                    assert (now == seen) == relay_on
                    if host.kernel_sma is not None:  # the last hop answered in the kernel
                        assert far.agent.stats["smp_answered"] == answered  # type: ignore[attr-defined]
            finally:
                client.close()

    trio.run(main)
    assert not any(ownership.netns.exists(n) for n in rt.plan.namespaces)


def test_walked_smps_count_on_every_cable_they_cross(state_dir: Path, tmp_path: Path) -> None:
    """DR NodeInfos through 3 switches, walked by the kernel SMA (no frame crosses the cables
    beyond the first switch): each cable end they would have crossed counts them, sent and
    received, in its PortCounters as in the walks' own counts; with the cable kept on the wire
    (a capture of it), they cross it as frames and its interface counts them."""
    from ibemu.fabric.agents import make_agents
    from ibemu.hca.umad_client import UmadClient
    from ibemu.wire import madcodec as mb
    from ibemu.wire.umad import SimRequest

    n = 20
    topo = generate("fat-tree", k=4)
    state = ownership.RunState(ownership.new_run_id(), scenario="pytest-sma-walk")
    rt = FabricRuntime(topo, make_agents=make_agents, state=state, run_dir=tmp_path)
    edge, up, agg, up2 = _up_from_h0(topo)
    core = topo.peer(agg.node, up2)
    assert core is not None
    ends = [(edge.node, up), (agg.node, agg.port), (agg.node, up2), (core.node, core.port)]

    async def main() -> None:
        async with rt.running() as host:
            ksma = host.kernel_sma
            if ksma is None or not ksma.walk:
                pytest.skip("no kernel SMA with walks here")

            def counts() -> dict[tuple[str, int], tuple[int, int, int, int]]:
                out = {}
                for name, port in ends:
                    agent = host.nodes[name].agent
                    agent.link_counters([port])  # type: ignore[attr-defined]
                    c = agent.ports[port].counters  # type: ignore[attr-defined]
                    out[(name, port)] = (c.xmit_pkts, c.rcv_pkts, *ksma.walked(host._relay_ids[name], port))
                return out

            client = await UmadClient.connect(host.nodes["h0"].plan.ns)
            try:
                for wire in (False, True):
                    if wire:  # as a capture of the agg-core cable does
                        host.keep_on_wire(agg.node, up2)
                    before = counts()
                    for tid in range(n):
                        client.send(SimRequest(dlid=0xFFFF, slid=0xFFFF, dqp=0, sqp=0,
                                               mad=mb.dr_smp(mb.GET, 0x11, path=[1, up, up2], tid=100 * wire + tid)))
                        with trio.fail_after(5):
                            resp = await client.recv()
                        assert resp.status == 0 and resp.mad[3] == 0x81
                    after = counts()
                    for end in ends:
                        xmit, rcv, wtx, wrx = (a - b for a, b in zip(after[end], before[end], strict=True))
                        assert xmit >= n and rcv >= n, (wire, end, xmit, rcv)
                        assert (wtx, wrx) == ((0, 0) if wire else (n, n)), (wire, end)
            finally:
                client.close()

    trio.run(main)
    assert not any(ownership.netns.exists(n) for n in rt.plan.namespaces)


def test_a_live_mad_socket_passes_the_mad_port_conformance_checks(state_dir: Path, tmp_path: Path) -> None:
    """``UmadPort`` over a host's MAD socket keeps the rules ``InMemoryPort`` is held to."""
    from ibemu.fabric.agents import make_agents
    from ibemu.hca.umad_client import UmadClient
    from ibemu.sm.transport import UmadPort
    from ibemu.testing.madport import check_mad_port

    topo = generate("leaf-spine", leaves=2, spines=1, hosts_per_leaf=1)
    state = ownership.RunState(ownership.new_run_id(), scenario="pytest-madport")
    rt = FabricRuntime(topo, make_agents=make_agents, state=state, run_dir=tmp_path)
    host_port = 1
    leaf = topo.peer("h0", host_port)
    assert leaf is not None
    spine_port = next(p for p, e in topo.neighbors(leaf.node) if topo.node(e.node).is_switch)

    async def main() -> None:
        async with rt.running() as host:
            client = await UmadClient.connect(host.nodes["h0"].plan.ns)
            try:
                await check_mad_port(UmadPort(client), far=(host_port,))
                await check_mad_port(UmadPort(client), far=(host_port, spine_port), tid_base=0x7000)
            finally:
                client.close()

    trio.run(main)
    assert not any(ownership.netns.exists(n) for n in rt.plan.namespaces)


def test_a_kernel_get_right_after_a_set_response_sees_the_set(state_dir: Path, tmp_path: Path) -> None:
    """The agents answer a burst of PortInfo Sets as one batch (``AgentHost._serve_batch``);
    a Get that the kernel SMA answers, sent the moment each Set's response arrives, must
    see that Set (the images are republished before any response of the batch leaves).
    The client is a thread of its own on a packet socket of h0's cable, as an SM's own port
    is, so it reads each response while the host may still be sending the others."""
    import threading

    from ibemu.agents import dr
    from ibemu.fabric.agents import make_agents
    from ibemu.kernel import sockfilter
    from ibemu.wire import madcodec as mb
    from ibemu.wire.madpacket import MAD_OFFSET, QP0_QKEY, frame_mad

    topo = generate("fat-tree", k=4)
    state = ownership.RunState(ownership.new_run_id(), scenario="pytest-sma-batch")
    rt = FabricRuntime(topo, make_agents=make_agents, state=state, run_dir=tmp_path)
    pp = rt.plan.nodes["h0"].ports[1]
    edge, ports = pp.peer_node, sorted(rt.plan.nodes[pp.peer_node].ports)
    tag = sockfilter.SM_OWN_TID_TAG << 48  # the CA agent on h0 leaves these responses alone
    data_at = MAD_OFFSET + 64
    vl_high_limit = 38  # PortInfo byte
    rounds = 40  # a reorder shows in most rounds, not all: the client must win the race
    stale: list[tuple[int, int, int]] = []
    errors: list[BaseException] = []

    def client(ns: str) -> None:
        sock = open_packet_socket(ns, pp.ifname, bpf=sockfilter.SM_REPLIES)
        sock.setblocking(True)
        sock.settimeout(5)
        head = pp.peer_mac + pp.mac + ETH_P_IB.to_bytes(2, "big")

        def send(method: int, port: int, tid: int, data: bytes = b"") -> None:
            mad = bytearray(mb.dr_smp(method, 0x15, path=[1], modifier=port, tid=tag | tid, data=data))
            dr.on_originate(mad, 0, 1)  # as an HCA sends it (hop pointer 1)
            sock.send(head + frame_mad(mad, dlid=0xFFFF, slid=0xFFFF, dqp=0, sqp=0, qkey=QP0_QKEY, vl=15))

        def recv() -> tuple[int, bytes]:
            while True:
                frame = sock.recv(9216)[14:]
                tid = int.from_bytes(frame[MAD_OFFSET + 8:MAD_OFFSET + 16], "big")
                if tid >> 48 == tag >> 48:
                    return tid & 0xFFFF_FFFF, frame[data_at:data_at + 64]

        try:
            now: dict[int, bytes] = {}
            for port in ports:  # PortInfo as it is (answered by the kernel)
                send(mb.GET, port, port)
                now[port] = recv()[1]
            for rnd in range(1, rounds + 1):
                want = {}
                for port in ports:  # a burst of Sets: only VLHighLimit changes
                    data = bytearray(now[port])
                    data[32] &= 0xF0  # PortState: no change
                    data[33] &= 0x0F  # PortPhysicalState: no change
                    data[vl_high_limit] = want[port] = (rnd * 16 + port) & 0xFF
                    send(mb.SET, port, 1000 * rnd + port, bytes(data))
                left = 2 * len(ports)
                while left:
                    tid, data = recv()
                    left -= 1
                    if tid < 100_000:  # a Set's response: at once, the kernel's Get of that port
                        send(mb.GET, tid % 1000, 100_000 + tid)
                    elif data[vl_high_limit] != want[tid % 1000]:
                        stale.append((rnd, tid % 1000, data[vl_high_limit]))
        except BaseException as exc:
            errors.append(exc)
        finally:
            sock.close()

    async def main() -> None:
        async with rt.running() as host:
            if host.kernel_sma is None:
                pytest.skip("no kernel SMA here")
            agent = host.nodes[edge].agent
            answered = agent.stats["smp_answered"]  # type: ignore[attr-defined]
            thread = threading.Thread(target=client, args=(rt.plan.nodes["h0"].ns,))
            thread.start()
            while thread.is_alive():
                await trio.sleep(0.01)
            assert not errors, errors
            assert not stale, f"the kernel answered from an old image: {stale[:5]}"
            # the Sets went to the agent, every Get was the kernel's
            assert agent.stats["smp_answered"] - answered == rounds * len(ports)  # type: ignore[attr-defined]
            assert [p.vl_high_limit for n, p in sorted(agent.ports.items()) if n] == [  # type: ignore[attr-defined]
                (rounds * 16 + n) & 0xFF for n in ports]

    trio.run(main)
