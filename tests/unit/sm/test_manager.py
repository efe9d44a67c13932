"""ibemu's SM over real device agents in memory: bring-up, reroute, bad input."""

from __future__ import annotations

import gc
import random
from collections.abc import Callable, Iterator

import pytest
import trio

from ibemu import clock
from ibemu.agents.port import PhysState, PortState
from ibemu.agents.switch import SwitchAgent
from ibemu.sm.manager import SmConfig, SubnetManager
from ibemu.testing.madport import InMemoryPort
from ibemu.testing.wiring import InMemoryFabric, WireRecord
from ibemu.topo import Node, Topology
from ibemu.wire.umad import SimRequest
from tests.unit.sm.helpers import fat_tree, minhop, run, unreachable_pairs


def make_sm(fab: InMemoryFabric, **cfg: object) -> tuple[SubnetManager, InMemoryPort]:
    port = InMemoryPort(fab, "h0")
    return SubnetManager(port, SmConfig(**cfg), route_fn=minhop), port  # type: ignore[arg-type]


async def settle(port: InMemoryPort) -> None:
    """Hand what the fabric delivered to the SM and let its tasks run."""
    port.pump()
    for _ in range(5):
        await trio.sleep(0)


def link_ports_active(fab: InMemoryFabric) -> bool:
    for (name, num), _peer in fab.links.items():
        p = fab.agents[name].ports[num]
        if p.phys == PhysState.LINK_UP and p.state != PortState.ACTIVE:
            return False
    return True


def lids(fab: InMemoryFabric) -> dict[tuple[str, int], int]:
    out = {}
    for name, a in fab.agents.items():
        if isinstance(a, SwitchAgent):
            out[(name, 0)] = a.lid
        else:
            out.update({(name, n): p.lid for n, p in a.ports.items()})
    return out


def test_cold_bring_up_activates_every_port_and_every_ca_reaches_every_ca() -> None:
    _topo, fab = fat_tree(4)
    sm, _port = make_sm(fab)

    async def main() -> None:
        async with sm.running():
            assert await sm.full_sweep("cold")
        assert sm.up.is_set() and sm.events.counts["subnet_up"] == 1
        table = lids(fab)
        assert all(table.values()) and len(set(table.values())) == len(table) == 36
        assert table[("h0", 1)] == sm.sm_lid == 1
        assert link_ports_active(fab)
        assert not unreachable_pairs(fab)
        assert sm.transport.stats["timeouts"] == 0
        assert sm.events.counts["lft_block_acked"] == 20  # one block per switch (36 LIDs)
        for a in fab.agents.values():
            if isinstance(a, SwitchAgent):
                assert a.switch_info.linear_fdb_top == 36 and not a.switch_info.port_state_change
                assert a.ports[0].master_sm_lid == 1

    run(main)


def test_a_second_sweep_changes_nothing_and_writes_no_block() -> None:
    _topo, fab = fat_tree(4)
    sm, _port = make_sm(fab)

    async def main() -> None:
        async with sm.running():
            await sm.full_sweep("cold")
            before = lids(fab)
            acked = sm.events.counts["lft_block_acked"]
            updates = sum(len(v) for v in fab.lft_updates.values())
            await sm.full_sweep("heavy")
            await sm.light_sweep()
            assert lids(fab) == before
            assert sm.events.counts["lft_block_acked"] == acked
            assert sum(len(v) for v in fab.lft_updates.values()) == updates
            assert sm.events.counts["reroute"] == 0

    run(main)


def test_link_failure_trap_reroutes_with_only_changed_blocks_then_restoration_rebalances() -> None:
    _topo, fab = fat_tree(4)
    sm, port = make_sm(fab)

    async def main() -> None:
        async with sm.running():
            await sm.full_sweep("cold")
            routes_before = {g: dict(lft) for g, lft in sm.routes.lfts.items()}  # type: ignore[union-attr]
            acked = sm.events.counts["lft_block_acked"]
            fab.link_down("edge1_0", 3)  # edge1_0:3 - agg1_0:1, away from the SM
            await settle(port)
            assert sm.stats["traps"] >= 1 and sm._dirty
            await sm.step()
            await settle(port)
            assert sm.stats["trap_repress"] == sm.stats["traps"]
            assert not unreachable_pairs(fab)
            rr = sm.events.of("reroute")[-1]
            assert rr["t_trap"] <= rr["t_rediscovered"] <= rr["t_routed"] <= rr["t_programmed"]
            assert 0 < rr["cpu_ms"] < 60_000  # this process's CPU from the trap to the last ack
            changed = {g for g, lft in sm.routes.lfts.items() if lft != routes_before[g]}  # type: ignore[union-attr]
            written = sm.events.counts["lft_block_acked"] - acked
            assert 0 < written == len(changed) < 20  # one block per switch whose routes moved
            # the traps stop: every switch that sent one saw a repress
            assert not any(a.traps.pending() for a in fab.agents.values() if isinstance(a, SwitchAgent)
                           if a.lid in {r["issuer_lid"] for r in sm.events.of("trap")})
            # restoration: the cable comes back and the original routes return
            fab.link_up("edge1_0", 3)
            await settle(port)
            await sm.step()
            await settle(port)
            if sm._dirty:
                await sm.step()
            assert link_ports_active(fab) and not unreachable_pairs(fab)
            assert {g: dict(lft) for g, lft in sm.routes.lfts.items()} == routes_before  # type: ignore[union-attr]

    run(main)


def test_a_lost_trap_is_caught_by_the_light_sweep() -> None:
    _topo, fab = fat_tree(4)
    sm, port = make_sm(fab)

    def no_traps(rec: WireRecord) -> bytes | None:
        pkt = rec.packet
        return None if len(pkt) > 40 and pkt[28 + 3] == 0x05 else pkt

    async def main() -> None:
        async with sm.running():
            await sm.full_sweep("cold")
            fab.impair = no_traps
            fab.link_down("edge2_1", 3)
            await settle(port)
            assert sm.stats["traps"] == 0
            assert unreachable_pairs(fab)
            await sm.step()  # nothing dirty: a light sweep
            assert sm.events.counts["reroute"] == 1
            assert "cpu_ms" not in sm.events.of("reroute")[-1]  # no trap to count from
            assert not unreachable_pairs(fab)

    run(main)


class Lossy:
    """Loses a share of the SM's requests and of the answers."""

    def __init__(self, inner: InMemoryPort, loss: float, seed: int = 5) -> None:
        self.inner, self.loss, self.rng = inner, loss, random.Random(seed)

    async def send(self, req: SimRequest) -> None:
        if self.rng.random() < self.loss:
            await trio.lowlevel.checkpoint()
            return
        await self.inner.send(req)

    async def recv(self) -> SimRequest:
        while True:
            got = await self.inner.recv()
            if self.rng.random() >= self.loss:
                return got


def test_ten_percent_smp_loss_still_converges_with_retries_counted() -> None:
    _topo, fab = fat_tree(4)
    lossy = Lossy(InMemoryPort(fab, "h0"), 0.10)
    sm = SubnetManager(lossy, SmConfig(timeout_s=0.05, retries=10), route_fn=minhop)

    async def main() -> None:
        async with sm.running():
            assert await sm.full_sweep("cold")
        assert sm.transport.stats["retries"] > 20 and sm.transport.stats["failed"] == 0
        assert link_ports_active(fab) and not unreachable_pairs(fab)
        assert sm.events.of("sweep_end")[-1]["smps"]["retries"] == sm.transport.stats["retries"]

    run(main)


class Deaf:
    """Loses every request from the ``first``-th to the ``last``-th (a path to the fabric gone
    for a while: SMPs unanswered after every retry)."""

    def __init__(self, inner: InMemoryPort, first: int, last: int) -> None:
        self.inner, self.first, self.last, self.sent = inner, first, last, 0

    async def send(self, req: SimRequest) -> None:
        self.sent += 1
        if self.first <= self.sent <= self.last:
            await trio.lowlevel.checkpoint()
            return
        await self.inner.send(req)

    async def recv(self) -> SimRequest:
        return await self.inner.recv()


async def _up_after_an_unclean_cold_sweep(sm: SubnetManager) -> None:
    """Serve until SUBNET UP (30 s at most); the first cold sweep had SMPs unanswered for good,
    and the subnet came up once, whole (k=4: 36 nodes)."""
    with trio.fail_after(30):
        async with trio.open_nursery() as n:
            await n.start(sm.serve)
            await sm.up.wait()
            n.cancel_scope.cancel()
    sweeps = sm.events.of("sweep_end")
    assert len(sweeps) >= 2 and sweeps[0]["smps"].get("failed", 0) > 0
    assert sm.events.counts["subnet_up"] == 1 and sm.events.of("subnet_up")[0]["nodes"] == 36


def test_no_subnet_up_after_a_cold_sweep_with_unanswered_smps() -> None:
    """A cold sweep whose SMPs failed after every retry (nodes left undiscovered, ports not
    Active) is not SUBNET UP: the SM sweeps again and comes up whole (the chaos campaign's
    k=8 SM once said SUBNET UP having discovered 1 node of 208)."""
    _topo, fab = fat_tree(4)
    deaf = Deaf(InMemoryPort(fab, "h0"), 3, 40)
    sm = SubnetManager(deaf, SmConfig(timeout_s=0.01, retries=1, sweep_interval_s=0.05), route_fn=minhop)

    async def main() -> None:
        await _up_after_an_unclean_cold_sweep(sm)
        assert link_ports_active(fab) and not unreachable_pairs(fab)

    run(main)


def test_after_an_unclean_sweep_the_next_periodic_sweep_is_heavy_and_repairs_it() -> None:
    """SUBNET UP at once after a cold sweep with SMPs unanswered (``unclean_cold_sweeps=0``):
    what it missed (nodes undiscovered, ports left in Init) has no PortStateChange for a light
    sweep to see, so the next periodic sweep is a heavy one ("repair") and makes it whole."""
    _topo, fab = fat_tree(4)
    deaf = Deaf(InMemoryPort(fab, "h0"), 3, 40)
    sm = SubnetManager(deaf, SmConfig(timeout_s=0.01, retries=1, sweep_interval_s=0.05,
                                      unclean_cold_sweeps=0), route_fn=minhop)

    async def main() -> None:
        with trio.fail_after(30):
            async with trio.open_nursery() as n:
                await n.start(sm.serve)
                await sm.up.wait()
                assert sm.events.of("subnet_up")[0]["nodes"] < 36  # up, but not whole
                assert not link_ports_active(fab)
                while not any(e["reason"] == "repair" and e.get("ok") for e in sm.events.of("sweep_end")):
                    await trio.sleep(0.05)
                n.cancel_scope.cancel()
        assert link_ports_active(fab) and not unreachable_pairs(fab)
        assert len(sm.graph.nodes) == 36

    run(main)


class KillAfter:
    """Kills a switch (every cable unplugged) after ``n`` SMPs."""

    def __init__(self, inner: InMemoryPort, n: int, kill: Callable[[], None]) -> None:
        self.inner, self.n, self.kill, self.sent = inner, n, kill, 0

    async def send(self, req: SimRequest) -> None:
        self.sent += 1
        if self.sent == self.n:
            self.kill()
        await self.inner.send(req)

    async def recv(self) -> SimRequest:
        return await self.inner.recv()


def _kill(fab: InMemoryFabric, topo: Topology, name: str) -> Callable[[], None]:
    def kill() -> None:
        for num in topo.node(name).port_range:
            if fab.peer(name, num) is not None:
                fab.link_down(name, num)

    return kill


def _reboot(fab: InMemoryFabric, node: Node) -> None:
    """A fresh agent (no LID, empty LFT) behind the same cables, which come up again."""
    fab.agents[node.name] = SwitchAgent(node_guid=node.guid, num_ports=node.num_ports,
                                        description=node.desc, clock=fab.clock)
    for num in node.port_range:
        if fab.peer(node.name, num) is not None:
            fab.link_up(node.name, num)


def test_a_switch_dying_mid_sweep_is_left_out_and_the_rest_comes_up() -> None:
    topo, fab = fat_tree(4)
    inner = InMemoryPort(fab, "h0")
    sm = SubnetManager(KillAfter(inner, 60, _kill(fab, topo, "agg1_1")), SmConfig(timeout_s=0.05, retries=1),
                       route_fn=minhop)

    async def main() -> None:
        async with sm.running():
            await sm.full_sweep("cold")
            assert topo.node("agg1_1").guid not in sm.graph.nodes or sm.transport.stats["timeouts"] >= 0
            await settle(inner)
            while sm._dirty or sm._trap_unknown:
                await sm.step()
            await sm.light_sweep()
        assert topo.node("agg1_1").guid not in sm.graph.nodes
        assert len(sm.graph.nodes) == 35
        assert not unreachable_pairs(fab)

    run(main)


def test_a_flapping_port_stays_bounded_and_ends_correct() -> None:
    _topo, fab = fat_tree(4)
    sm, port = make_sm(fab, outbox=16)

    async def main() -> None:
        async with sm.running():
            await sm.full_sweep("cold")
            sweeps = sm.sweeps
            for i in range(200):
                if i % 2:
                    fab.link_up("edge3_0", 4)
                else:
                    fab.link_down("edge3_0", 4)
                port.pump()
                if i % 20 == 19:  # the SM gets a turn now and then: traps coalesce meanwhile
                    await trio.sleep(0)
                    await sm.step()
            await settle(port)
            while sm._dirty:
                await sm.step()
                await settle(port)
            assert len(sm._dirty) == 0 and sm.sweeps - sweeps <= 40
            assert sm.stats["traps"] >= 100
            assert len(sm.transport._pending) == 0
            assert link_ports_active(fab) and not unreachable_pairs(fab)

    run(main)


def test_a_partition_is_reported_not_hung_on() -> None:
    topo, fab = fat_tree(4)
    sm, port = make_sm(fab, timeout_s=0.05, retries=1)

    async def main() -> None:
        async with sm.running():
            await sm.full_sweep("cold")
            for num in (3, 4):  # both uplinks of edge2_0: it and its hosts are cut off
                fab.link_down("edge2_0", num)
            await settle(port)
            with trio.fail_after(30):
                while sm._dirty or sm._trap_unknown:
                    await sm.step()
                    await settle(port)
            parts = sm.events.of("partition")
            assert parts
            lost = {x for p in parts for x in p["lost"]}
            hosts = {topo.node(h).desc for h in ("h8", "h9")}
            assert lost == hosts
            assert parts[-1]["peers_lost"][topo.node("h0").desc] == sorted(hosts)
            assert set(sm.lost.values()) >= hosts
            pairs = unreachable_pairs(fab)
            assert pairs and all({"h8", "h9"} & {a.split(":")[0], b.split(":")[0]} for a, b in pairs)
            # healed: the cable is back, the hosts return with the same LIDs
            lid8 = fab.agents["h8"].ports[1].lid
            fab.link_up("edge2_0", 3)
            await settle(port)
            await sm.step()
            await sm.light_sweep()
            assert not unreachable_pairs(fab) and fab.agents["h8"].ports[1].lid == lid8
            assert sm.events.counts["partition_healed"] >= 1

    run(main)


def test_sm_info_from_another_node_is_answered_as_master() -> None:
    _topo, fab = fat_tree(4)
    sm, port = make_sm(fab)

    async def main() -> None:
        async with sm.running():
            await sm.full_sweep("cold")
            from ibemu.wire import madcodec as mb
            got = fab.send_mad("h5", 1, sm.sm_lid, 0, 0, mb.lr_smp(mb.GET, 0x0020, tid=0x77))
            assert got == []  # nothing yet: the request went to the SM
            await settle(port)
            answers = [d for d in fab.delivered["h5"] if mb.tid(d.mad) == 0x77]
            assert len(answers) == 1 and answers[0].mad[3] == mb.GET_RESP
            data = mb.smp_data(answers[0].mad)
            # SMInfo's GUID is the SM's port GUID (OpenSM finds the port to poll by it)
            assert int.from_bytes(data[0:8], "big") == fab.agents["h0"].port_guid(1) and data[20] & 0x0F == 3
            assert sm.events.of("sm_info")[-1]["answered"]

    run(main)


def test_a_dual_ported_ca_gets_a_lid_per_port_and_both_are_reachable() -> None:
    from tests.unit.devices.fabrics import tree

    fab = tree()
    port = InMemoryPort(fab, "sm")
    sm = SubnetManager(port, SmConfig(), route_fn=minhop)

    async def main() -> None:
        async with sm.running():
            assert await sm.full_sweep("cold")
        dual = fab.agents["dual"]
        assert dual.ports[1].lid and dual.ports[2].lid and dual.ports[1].lid != dual.ports[2].lid
        assert link_ports_active(fab) and not unreachable_pairs(fab)

    run(main)


def test_the_sms_own_cable_going_down_and_back_is_recovered_by_the_light_sweep() -> None:
    _topo, fab = fat_tree(4)
    sm, port = make_sm(fab, timeout_s=0.05, retries=1)

    async def main() -> None:
        async with sm.running():
            await sm.full_sweep("cold")
            lids_before = lids(fab)
            fab.link_down("h0", 1)
            await settle(port)
            await sm.step()  # nothing reaches us: the light sweep finds our port cut off
            assert len(sm.graph.nodes) == 1 and sm.events.of("partition")
            fab.link_up("h0", 1)
            await settle(port)
            await sm.step()
            assert len(sm.graph.nodes) == 36 and lids(fab) == lids_before
            assert link_ports_active(fab) and not unreachable_pairs(fab)

    run(main)


@pytest.mark.parametrize("engine", ["minhop", "updn", "ftree"])
def test_with_the_routing_engines_bring_up_and_incremental_reroute_keep_every_ca_connected(engine: str) -> None:
    routing = pytest.importorskip("ibemu.sm.routing")
    pytest.importorskip("ibemu.sm.reroute")
    if engine not in routing.ENGINES:
        pytest.skip(f"no {engine} engine yet")
    _topo, fab = fat_tree(4)
    port = InMemoryPort(fab, "h0")
    sm = SubnetManager(port, SmConfig(engine=engine))  # ibemu.sm.routing + ibemu.sm.reroute

    async def main() -> None:
        async with sm.running():
            assert await sm.full_sweep("cold")
            assert not unreachable_pairs(fab)
            total = sm.events.counts["lft_block_acked"]
            fab.link_down("edge1_1", 4)
            await settle(port)
            while sm._dirty or sm._trap_unknown:
                await sm.step()
                await settle(port)
            assert not unreachable_pairs(fab)
            assert 0 < sm.events.counts["lft_block_acked"] - total < total
            fab.link_up("edge1_1", 4)
            await settle(port)
            for _ in range(3):
                await sm.step()
                await settle(port)
            assert link_ports_active(fab) and not unreachable_pairs(fab)

    run(main)


@pytest.mark.parametrize("engine", ["ftree_ar", "updn_ar"])
def test_an_adaptive_engine_writes_its_alternates_to_the_switches(engine: str) -> None:
    """ftree_ar/updn_ar: the base engine's LFTs and, through the vendor attribute
    AlternatePorts, the checked alternates in every switch agent (only what changed: a
    second pass with the same routes writes none but the fault-notice settings)."""
    from ibemu.agents.switch import ALT_LIDS, ALT_SLOT
    from ibemu.sm.program import alt_blocks
    from ibemu.sm.routing.alternates import compute_ar

    _topo, fab = fat_tree(4)
    port = InMemoryPort(fab, "h0")
    sm = SubnetManager(port, SmConfig(engine=engine))

    async def main() -> None:
        async with sm.running():
            assert await sm.full_sweep("cold")
            assert not unreachable_pairs(fab)
            assert sm.routes is not None and sm.routes.engine == engine and sm.routes.alternates
            want = compute_ar(sm.graph, engine).alternates
            assert sm.routes.alternates == want
            n = 0
            for agent in fab.agents.values():
                if isinstance(agent, SwitchAgent):
                    blocks = alt_blocks(want.get(agent.node_guid, {}), sm.lids.top)
                    assert agent.alternates == blocks
                    n += sum(any(b[i:i + ALT_SLOT]) for b in blocks.values() for i in range(0, ALT_LIDS * ALT_SLOT, 4))
            assert n > 0 and sm.stats["alt_blocks"] > 0 and not sm.stats["alt_blocks_failed"]
            sent = sm.stats["alt_blocks"]
            assert await sm._route_and_program(None, recompute=False)
            switches = [a for a in fab.agents.values() if isinstance(a, SwitchAgent)]
            # no AlternatePorts block changed: only each switch's FailoverConfig of a new generation
            assert sm.stats["alt_blocks"] == sent + len(switches)
            assert {a._generation for a in switches} == {2} and all(a.notices for a in switches)

    run(main)


def test_a_dead_switch_comes_back_fresh_and_is_brought_up_again() -> None:
    topo, fab = fat_tree(4)
    sm, port = make_sm(fab, timeout_s=0.05, retries=1)
    name = "agg2_1"
    node = topo.node(name)

    async def main() -> None:
        async with sm.running():
            await sm.full_sweep("cold")
            old = fab.agents[name]
            assert isinstance(old, SwitchAgent)
            lid = old.lid
            _kill(fab, topo, name)()
            await settle(port)
            while sm._dirty or sm._trap_unknown:
                await sm.step()
                await settle(port)
            assert node.guid not in sm.graph.nodes and not unreachable_pairs(fab)
            n_acked = len(sm.events.of("lft_block_acked"))
            _reboot(fab, node)
            await settle(port)
            for _ in range(4):
                await sm.step()
                await settle(port)
            agent = fab.agents[name]
            assert isinstance(agent, SwitchAgent)
            assert node.guid in sm.graph.nodes and agent.lid == lid
            assert agent.switch_info.linear_fdb_top == 36 and agent.lft.lookup(1) not in (0, 0xFF)
            assert link_ports_active(fab) and not unreachable_pairs(fab)
            # Make before break: the switch back from its reboot had its tables before any
            # other switch was given routes through it.
            acked = sm.events.of("lft_block_acked")[n_acked:]
            mine = [i for i, e in enumerate(acked) if e["switch"] == f"{node.guid:#018x}"]
            others = [i for i, e in enumerate(acked) if e["switch"] != f"{node.guid:#018x}"]
            assert mine and others and max(mine) < min(others), (mine, others)

    run(main)


def test_a_switch_rebooting_between_two_sweeps_is_configured_again() -> None:
    topo, fab = fat_tree(4)
    sm, port = make_sm(fab, timeout_s=0.05, retries=1)
    name = "edge3_0"
    node = topo.node(name)

    async def main() -> None:
        async with sm.running():
            await sm.full_sweep("cold")
            old = fab.agents[name]
            assert isinstance(old, SwitchAgent)
            lid = old.lid
            # every cable drops and comes back before the SM looks; the agent is a fresh one
            _kill(fab, topo, name)()
            _reboot(fab, node)
            await settle(port)
            for _ in range(4):
                await sm.step()
                await settle(port)
            agent = fab.agents[name]
            assert isinstance(agent, SwitchAgent)
            assert agent.lid == lid and agent.switch_info.linear_fdb_top == 36
            assert link_ports_active(fab) and not unreachable_pairs(fab)

    run(main)


async def handle_the_traps(sm: SubnetManager, port: InMemoryPort) -> float:
    """Let the SM act on what the fabric sent it until nothing waits; the (mock) seconds it took."""
    t0 = trio.current_time()
    await settle(port)
    for _ in range(10):
        if not (sm._dirty or sm._trap_unknown or getattr(sm, "_check", None)):
            break
        await sm.step()
        await settle(port)
    return trio.current_time() - t0


def test_a_switch_dying_whose_neighbours_traps_are_lost_is_not_waited_for() -> None:
    """A whole switch dies; only one neighbour's trap reaches the SM (the others' routes to
    the SM went through the dead switch). The reroute must not sit on the dead switch's LFT
    Sets (4 timeouts x 0.2 s) nor wait for a light sweep: it is suspected, checked from its
    neighbours and dropped, and every CA reaches every CA again within ~0.1 s."""
    topo, fab = fat_tree(4)
    sm, port = make_sm(fab)  # default timeouts: 0.2 s, 3 retries
    name = "agg1_0"
    node = topo.node(name)
    cables = [num for num in node.port_range if fab.peer(name, num) is not None]
    first = fab.peer(name, cables[-1])  # a core: its trap gets through
    assert first is not None

    async def main() -> None:
        async with sm.running():
            await sm.full_sweep("cold")
            messenger = fab.agents[first[0]]
            assert isinstance(messenger, SwitchAgent)
            _kill(fab, topo, name)()
            got = fab.delivered["h0"]
            got[:] = [d for d in got if d.slid == messenger.lid]  # every other trap is lost
            assert got
            elapsed = await handle_the_traps(sm, port)
            assert node.guid not in sm.graph.nodes
            assert not unreachable_pairs(fab)
            assert elapsed < 0.15, elapsed
            first_rr = sm.events.of("reroute")[0]
            assert first_rr["blocks_failed"] >= 1  # the dead switch's blocks: not waited for
            assert first_rr["t_programmed"] - first_rr["t_trap"] < 0.1e9
            assert sm.events.counts["suspect"] >= 1

    run(main)


def test_a_switch_suspected_before_the_pass_programs_is_not_waited_for() -> None:
    """A whole switch dies and every neighbour's trap arrives: reading the far ends of the
    cables found down makes the dead switch a suspect before the reroute programs; the
    pass then sends it nothing and waits for nothing (was: its Sets timed out, 0.8 s)."""
    topo, fab = fat_tree(4)
    sm, port = make_sm(fab)  # default timeouts: 0.2 s, 3 retries
    name = "agg1_0"
    node = topo.node(name)

    async def main() -> None:
        async with sm.running():
            await sm.full_sweep("cold")
            _kill(fab, topo, name)()
            elapsed = await handle_the_traps(sm, port)
            assert node.guid not in sm.graph.nodes
            assert not unreachable_pairs(fab)
            assert elapsed < 0.15, elapsed
            for rr in sm.events.of("reroute"):
                assert rr["t_programmed"] - rr["t_route_start"] < 0.05e9, rr

    run(main)


class OneAtATime:
    """The agents as one busy thread: each response leaves ``per_smp_s`` after the one before,
    and before the ``stall_after``-th answer to an LFT Set the thread stalls ``stall_s`` once
    (a GC pass, a tc write holding the GIL)."""

    def __init__(self, inner: InMemoryPort, per_smp_s: float, stall_after: int, stall_s: float) -> None:
        self.inner, self.per_smp_s, self.slow = inner, per_smp_s, False
        self.stall_after, self.stall_s = stall_after, stall_s
        self._free_at = 0.0
        self._answered = 0

    async def send(self, req: SimRequest) -> None:
        await self.inner.send(req)

    async def recv(self) -> SimRequest:
        got = await self.inner.recv()
        if self.slow:
            if got.mad[16:18] == b"\x00\x19":  # LinearForwardingTable
                self._answered += 1
            pause = self.stall_s if self._answered == self.stall_after else 0.0
            if pause:
                self._answered += 1  # once
            self._free_at = max(self._free_at, trio.current_time()) + self.per_smp_s + pause
            await trio.sleep_until(self._free_at)
        return got


def test_a_stalled_queue_of_answers_is_not_taken_for_dead_switches() -> None:
    """A reroute's LFT Sets answered one every ms, with one 60 ms stall of the agents in the
    middle (a k=16 reroute lost all its 192 blocks to such a stall): every block is waited
    for and no switch is suspected, since a Set only counts as overdue once one sent after
    it was answered."""
    _topo, fab = fat_tree(4)
    inner = InMemoryPort(fab, "h0")
    port = OneAtATime(inner, 0.001, stall_after=3, stall_s=0.06)
    sm = SubnetManager(port, SmConfig(), route_fn=minhop)  # type: ignore[arg-type]

    async def main() -> None:
        async with sm.running():
            await sm.full_sweep("cold")
            port.slow = True
            fab.link_down("edge1_0", 3)
            inner.pump()
            await trio.sleep(0.05)  # the traps come through the slow agents too
            await handle_the_traps(sm, inner)
            rr = sm.events.of("reroute")[-1]
            assert rr["blocks"] >= 8 and rr["blocks_failed"] == 0 and rr["blocks_abandoned"] == 0, rr
            assert (rr["t_programmed"] - rr["t_planned"]) / 1e9 < 1  # mock time runs ahead; real: ms
            assert sm.events.counts["suspect"] == 0 and not unreachable_pairs(fab)

    run(main)


@pytest.mark.parametrize("engine", ["ftree_ar", "updn_ar"])
def test_an_adaptive_engines_cold_sweep_leaves_no_smp_unanswered_and_is_up_at_once(engine: str) -> None:
    """The alternates are written after the LFTs but before the SwitchInfo Sets that raise
    each switch's LinearFDBTop: sent LID-routed then, their answers were dropped on the way
    back to the SM (a switch routes no LID above its top), each waited out its timeout and
    counted as unanswered, so the cold sweep was not SUBNET UP and ran again a second later
    (at dilation 20,000: 4,000 s and 20,000 s of real time)."""
    _topo, fab = fat_tree(4)
    sm = SubnetManager(InMemoryPort(fab, "h0"), SmConfig(engine=engine))

    async def main() -> None:
        async with sm.running():
            assert await sm.full_sweep("cold")
            assert sm.up.is_set()  # SUBNET UP after one sweep
            assert trio.current_time() < 0.05  # no timeout waited out (the mock clock)
        stats = sm.transport.stats
        assert not stats["failed"] and not stats["timeouts"] and not stats["fell_back"], dict(stats)
        assert sm.stats["alt_blocks"] > 0 and not sm.stats["alt_blocks_failed"]
        assert all(a.lft.top == sm.lids.top for a in fab.agents.values() if isinstance(a, SwitchAgent))
        assert not unreachable_pairs(fab)

    run(main)


@pytest.fixture
def dilated() -> Iterator[int]:
    """This process on dilation 20,000 (as the SM process of such a run): the SM reads its
    timers' dilation from ``ibemu.clock``; trio's time is the tests' mock clock."""
    n = 20_000
    clock.configure(n)
    try:
        yield n
    finally:
        clock.configure(1)


def test_under_dilation_an_unclean_cold_sweep_is_repeated_after_a_real_second_not_n(dilated: int) -> None:
    """At dilation N an SMP's timeout and the pause before the cold sweep is repeated are
    bounded by a second of real time (``ibemu.sm.timers``): 200 ms and 1 s of emulated time
    were 4,000 s and 20,000 s of real time at N = 20,000."""
    _topo, fab = fat_tree(4)
    deaf = Deaf(InMemoryPort(fab, "h0"), 3, 40)
    sm = SubnetManager(deaf, SmConfig(retries=1), route_fn=minhop)
    assert sm.transport.timeout_s * dilated == pytest.approx(1.0)
    assert sm.timers.resweep_s * dilated == pytest.approx(1.0)

    async def main() -> None:
        t0 = trio.current_time()
        await _up_after_an_unclean_cold_sweep(sm)
        # 38 requests lost: ~50 timeouts of a second of real time in a row, each 50 us
        # emulated (they were 0.2 s, and the pause between the cold sweeps 1 s, emulated)
        assert trio.current_time() - t0 < 0.01
        assert link_ports_active(fab) and not unreachable_pairs(fab)

    run(main)


@pytest.mark.parametrize("n", [1, 20_000])
def test_a_failed_repair_sweep_is_repeated_seconds_later_in_real_time_not_a_sweep_interval(n: int) -> None:
    """SUBNET UP after a cold sweep with SMPs unanswered (``unclean_cold_sweeps=0``), and the
    first repair sweep fails too: the next heavy repair sweep comes two seconds (real, at
    most) later, not at the next periodic sweep (10 s emulated: 55 hours of real time at
    N = 20,000)."""
    _topo, fab = fat_tree(4)
    deaf = Deaf(InMemoryPort(fab, "h0"), 3, 12)  # 4 SMPs of the cold sweep and the first repair's one
    clock.configure(n)
    try:
        sm = SubnetManager(deaf, SmConfig(retries=1, unclean_cold_sweeps=0), route_fn=minhop)
    finally:
        clock.configure(1)
    assert sm.config.sweep_interval_s == 10.0

    async def main() -> None:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                await nursery.start(sm.serve)
                await sm.up.wait()
                t_up = trio.current_time()
                assert sm.events.of("subnet_up")[0]["nodes"] < 36 and not link_ports_active(fab)
                while not any(e["reason"] == "repair" and e.get("ok") for e in sm.events.of("sweep_end")):
                    await trio.sleep(0.05 / n)
                t_repaired = trio.current_time()
                nursery.cancel_scope.cancel()
        # the first repair at once (a trap waited) or after 1 s, its SMP's two timeouts (0.2 s,
        # or 1 s real), then the backed-off pause (2 s real at most)
        assert sm.events.of("sweep_end")[1]["reason"] == "repair" and not sm.events.of("sweep_end")[1]["ok"]
        assert (t_repaired - t_up) * n < 5.0
        assert link_ports_active(fab) and not unreachable_pairs(fab) and len(sm.graph.nodes) == 36

    run(main)


def test_a_trap_ends_a_light_sweep_that_waits_for_answers() -> None:
    """A light sweep waiting out unanswered SMPs (timeouts, retries) is ended by a trap that
    reports a change, and the trap's pass comes next: before, the trap waited for the whole
    light sweep (~0.8 s at k=8 when the sweep met the very cut the trap was about)."""
    _topo, fab = fat_tree(4)
    sm, port = make_sm(fab)

    def no_switch_info_answers(rec: WireRecord) -> bytes | None:
        pkt = rec.packet
        is_resp = len(pkt) > 48 and pkt[28 + 3] == 0x81 and pkt[28 + 16:28 + 18] == b"\x00\x12"
        return None if is_resp else pkt

    async def main() -> None:
        async with sm.running():
            await sm.full_sweep("cold")
            fab.impair = no_switch_info_answers
            t0 = trio.current_time()

            async def cut_later() -> None:
                await trio.sleep(0.05)  # while the light sweep waits for its answers
                fab.impair = None
                fab.link_down("edge1_0", 3)
                await settle(port)

            async with trio.open_nursery() as n:
                n.start_soon(cut_later)
                await sm.step()  # nothing dirty yet: a light sweep, ended by the trap
            light = [r for r in sm.events.of("sweep_end") if r["reason"] == "light"][-1]
            assert light.get("deferred") is True
            assert trio.current_time() - t0 < sm.config.timeout_s  # no SMP timeout waited out
            assert sm._dirty and sm.events.counts["reroute"] == 0
            await sm.step()  # the trap's pass
            await settle(port)
            assert sm.events.counts["reroute"] == 1 and not unreachable_pairs(fab)

    run(main)


@pytest.mark.parametrize("trapped_meanwhile", [True, False], ids=["far-end-trapped", "far-end-silent"])
def test_a_far_end_whose_own_trap_came_during_the_pass_is_checked_after_the_programming(
        trapped_meanwhile: bool) -> None:
    """The far end of a cable found down is checked for a dying switch (its other cables read
    from its neighbours). Beside the programming, its SMPs and their answers took the SM's
    CPU between the LFT Sets' answers; a far end whose own trap came while the pass read
    (alive a moment ago, its cables read first-hand by the next pass) is checked once the
    programming is over. One that sent no trap is still checked beside it."""
    _topo, fab = fat_tree(4)
    sm, port = make_sm(fab)
    checked: list[tuple[set[int], int]] = []
    check_far_ends = sm._check_far_ends

    async def recorded(guids: set[int]) -> None:
        checked.append((set(guids), sm.events.counts["lft_programmed"]))
        await check_far_ends(guids)

    sm._check_far_ends = recorded  # type: ignore[method-assign]

    async def main() -> None:
        async with sm.running():
            await sm.full_sweep("cold")
            edge = next(g for g, n in sm.graph.nodes.items() if n.desc.endswith("edge1_0"))
            agg = sm.graph.nodes[edge].ports[3].peer[0]  # type: ignore[index]
            fab.link_down("edge1_0", 3)  # edge1_0:3 - agg1_0:1
            await settle(port)
            # the pass starts with one end's trap alone; the other end is the far end
            first, other = (agg, edge) if agg in sm._dirty else (edge, agg)
            assert first in sm._dirty
            t_other = sm._dirty.pop(other, sm._dirty[first])
            refresh = sm.disc.refresh

            async def other_traps_meanwhile(guids: set[int], **kw: bool) -> list[object]:
                out = await refresh(guids, **kw)
                if trapped_meanwhile:
                    sm._dirty.setdefault(other, t_other)
                return out  # type: ignore[return-value]

            sm.disc.refresh = other_traps_meanwhile  # type: ignore[method-assign]
            programmed = sm.events.counts["lft_programmed"]
            await sm.step()
            await settle(port)
            assert sm.events.counts["reroute"] == 1 and not unreachable_pairs(fab)
            assert checked == [({other}, programmed + (1 if trapped_meanwhile else 0))]
            assert other not in sm.prog.suspects  # its other cables are up: not a suspect either way

    run(main)


def test_the_garbage_collector_is_held_for_a_traps_pass_and_back_on_after_it() -> None:
    """No cyclic collection in the middle of a reroute (0.14-0.4 ms each on k=8): the
    collector is off from the trap's pass's start to its end, then on again; a light sweep
    leaves it alone."""
    _topo, fab = fat_tree(4)
    sm, port = make_sm(fab)
    seen: list[bool] = []
    refresh = sm.disc.refresh

    async def recorded(guids: set[int], **kw: bool) -> list[object]:
        seen.append(gc.isenabled())
        return await refresh(guids, **kw)  # type: ignore[return-value]

    sm.disc.refresh = recorded  # type: ignore[method-assign]

    async def main() -> None:
        async with sm.running():
            await sm.full_sweep("cold")
            fab.link_down("edge1_0", 3)
            await settle(port)
            assert sm._dirty
            await sm.step()
            assert seen and not any(seen) and gc.isenabled()
            assert sm.events.counts["reroute"] == 1
            seen.clear()
            await sm.step()  # nothing waits: a light sweep
            assert all(seen) and gc.isenabled()

    assert gc.isenabled()
    run(main)


def test_a_traps_repress_waits_for_the_pass_it_starts_then_goes() -> None:
    """A TrapRepress sent at once took the SM's CPU on the way to the pass's first SMP: it
    goes once the pass the trap started is over (every trap of the cut still repressed, and
    the devices stop repeating them); a trap that starts no pass (a bad M_Key's, say, or
    before SUBNET UP) is repressed at once as before."""
    _topo, fab = fat_tree(4)
    sm, port = make_sm(fab)
    sent: list[int] = []
    send_only = sm.transport.send_only

    async def recorded(mad: bytes, **kw: int) -> None:
        if mad[3] == 0x07:  # TrapRepress
            sent.append(sm.events.counts["lft_programmed"])
        await send_only(mad, **kw)

    sm.transport.send_only = recorded  # type: ignore[method-assign]

    async def main() -> None:
        async with sm.running():
            await sm.full_sweep("cold")
            programmed = sm.events.counts["lft_programmed"]
            fab.link_down("edge1_0", 3)
            await settle(port)
            assert sm._dirty and not sent  # held: its pass is about to run
            await sm.step()
            await settle(port)
            if sm._dirty:  # the far end's trap, taken while the first pass ran
                await sm.step()
                await settle(port)
            assert sm.stats["trap_repress"] == sm.stats["traps"] == len(sent) >= 1
            assert min(sent) > programmed  # after the reroute's programming
            issuers = {r["issuer_lid"] for r in sm.events.of("trap")}
            assert not any(a.traps.pending() for a in fab.agents.values()
                           if isinstance(a, SwitchAgent) and a.lid in issuers)

    run(main)
