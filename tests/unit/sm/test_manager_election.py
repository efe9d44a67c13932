"""Two of ibemu's SMs on one in-memory fabric: election, standby polling, takeover, handover."""

from __future__ import annotations

import trio

from ibemu.agents.ca import CaAgent
from ibemu.agents.switch import SwitchAgent
from ibemu.sm.election import SmState
from ibemu.sm.manager import SmConfig, SubnetManager
from ibemu.testing.madport import InMemoryPort
from ibemu.testing.wiring import InMemoryFabric
from tests.unit.sm.helpers import fat_tree, minhop, run, unreachable_pairs


def make(fab: InMemoryFabric, host: str, **cfg: object) -> tuple[SubnetManager, InMemoryPort]:
    agent = fab.agents[host]
    assert isinstance(agent, CaAgent)
    agent.set_is_sm(1, True)
    port = InMemoryPort(fab, host)
    base: dict[str, object] = {"sweep_interval_s": 0.5, "poll_interval_s": 0.1, "poll_retries": 3}
    return SubnetManager(port, SmConfig(**{**base, **cfg}), route_fn=minhop), port  # type: ignore[arg-type]


async def pump(ports: list[InMemoryPort]) -> None:
    """What the fabric delivered to each SM's CA reaches that SM (an HCA would wake it)."""
    while True:
        for p in ports:
            p.pump()
        await trio.sleep(0.001)


async def until(cond: object, limit_s: float = 30.0) -> None:
    with trio.fail_after(limit_s):
        while not cond():  # type: ignore[operator]
            await trio.sleep(0.005)


def master_sm_lids(fab: InMemoryFabric) -> set[int]:
    return {a.ports[0].master_sm_lid for a in fab.agents.values() if isinstance(a, SwitchAgent)}


def test_standby_polls_then_takes_over_and_reroutes() -> None:
    _topo, fab = fat_tree(4)
    a, pa = make(fab, "h0", priority=5)
    b, pb = make(fab, "h15", priority=1)

    async def main() -> None:
        async with trio.open_nursery() as n:
            n.start_soon(pump, [pa, pb])
            scope_a = trio.CancelScope()

            async def serve_a() -> None:
                with scope_a:
                    await a.serve()

            n.start_soon(serve_a)
            await until(a.up.is_set)
            n.start_soon(b.serve)
            await until(lambda: b.election.state is SmState.STANDBY)
            assert a.election.state is SmState.MASTER
            assert b.election.master == a.election.guid == fab.agents["h0"].port_guid(1)  # type: ignore[attr-defined]
            await trio.sleep(0.5)  # a few polls, every one answered by the master
            assert b.events.counts["sm_poll_failed"] == 0
            assert a.events.counts["sm_info"] >= 3
            assert not b.up.is_set() and b.events.counts["lft_block_acked"] == 0  # a standby writes nothing
            # the master dies: its process gone, its port still says IsSM
            scope_a.cancel()
            t_dead = trio.current_time()
            await until(lambda: b.election.state is SmState.MASTER and b.up.is_set())
            took = trio.current_time() - t_dead
            assert 0.3 - 0.11 <= took < 2.0  # three failed polls 0.1 s apart, then a sweep
            lost = b.events.of("sm_master_lost")
            assert len(lost) == 1 and lost[0]["failed"] == 3
            assert [e["reason"] for e in b.events.of("sm_state")] == ["master found", "master lost", "no other SM"]
            assert b.events.of("subnet_up")[-1]["reason"] == "takeover"
            assert master_sm_lids(fab) == {b.sm_lid}  # traps now go to the new master
            assert not unreachable_pairs(fab)
            # a cable fault after the takeover is rerouted by the new master
            fab.link_down("edge1_0", 3)
            await until(lambda: b.events.counts["reroute"] >= 1)
            assert not unreachable_pairs(fab)
            n.cancel_scope.cancel()

    run(main)


def test_higher_priority_standby_gets_the_subnet_by_handover() -> None:
    _topo, fab = fat_tree(4)
    low, pl = make(fab, "h0", priority=1)
    high, ph = make(fab, "h15", priority=9)

    async def main() -> None:
        async with trio.open_nursery() as n:
            n.start_soon(pump, [pl, ph])
            n.start_soon(low.serve)
            await until(low.up.is_set)
            n.start_soon(high.serve)
            # the newcomer finds a master and stands by, whatever its priority
            await until(lambda: high.election.state is SmState.STANDBY)
            # its polls make the master look at the SMs of the subnet: a higher standby gets a HANDOVER
            await until(lambda: high.election.state is SmState.MASTER and high.up.is_set())
            await until(lambda: low.election.state is SmState.STANDBY)
            assert low.election.master == high.election.guid
            assert [e["modifier"] for e in low.events.of("sm_handover")] == ["handover"]
            assert [e["modifier"] for e in high.events.of("sm_handover")] == ["acknowledge"]
            assert master_sm_lids(fab) == {high.sm_lid}
            assert not unreachable_pairs(fab)
            assert low.stats["peer_checks"] >= 1
            n.cancel_scope.cancel()

    run(main)


def test_an_sm_of_another_sm_key_is_ignored() -> None:
    _topo, fab = fat_tree(4)
    a, pa = make(fab, "h0", priority=5)
    b, pb = make(fab, "h15", priority=1, sm_key=2)

    async def main() -> None:
        async with trio.open_nursery() as n:
            n.start_soon(pump, [pa, pb])
            n.start_soon(a.serve)
            await until(a.up.is_set)
            async with b.running():
                await b.full_sweep("cold")  # a answers with SM_Key 1: not of b's subnet
            assert b.stats["sm_key_mismatch"] == 1 and b.election.state is SmState.MASTER
            assert [e["answered"] for e in b.events.of("sm_found")] == [False]
            n.cancel_scope.cancel()

    run(main)
