"""The agent host's plumbing on a real fabric: frames in and out, carrier events, the event log."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import trio

from ibemu.device.actions import Action, Event, Send
from ibemu.fabric.plan import FabricPlan
from ibemu.fabric.runtime import FabricRuntime
from ibemu.kernel import ownership
from ibemu.kernel.packet import open_packet_socket
from ibemu.topo import generate
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
                pkt = fast.NativeTemplate(slid=1, dlid=2, destqp=7).packet(0x04, 5, b"ping")
                probe.send(b"\xff" * 6 + b"\x02" * 6 + b"\x88\xb5" + pkt)
                with trio.fail_after(5):
                    while True:
                        await trio.lowlevel.wait_readable(probe)
                        frame = probe.recv(9000)
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
