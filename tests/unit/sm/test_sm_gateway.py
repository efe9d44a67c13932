"""The SM's own edge switch (its gateway: every directed route leaves through it) when the
SM's answers come late (a loaded machine): never dropped for it, and no suspect dropped then."""

from __future__ import annotations

import trio

from ibemu.sm.manager import SmConfig, SubnetManager
from ibemu.testing.madport import InMemoryPort
from ibemu.testing.wiring import InMemoryFabric
from ibemu.topo import Topology
from ibemu.wire.umad import SimRequest
from tests.unit.sm.helpers import fat_tree, minhop, run, unreachable_pairs
from tests.unit.sm.test_manager import handle_the_traps


class Lagging:
    """Every answer handed over ``lag`` seconds after it came (while ``lag`` is set): the SM's
    port behind a loaded machine (the agent host's loop answering late), nothing lost."""

    def __init__(self, inner: InMemoryPort) -> None:
        self.inner, self.lag = inner, 0.0

    async def send(self, req: SimRequest) -> None:
        await self.inner.send(req)

    async def recv(self) -> SimRequest:
        got = await self.inner.recv()
        if self.lag:
            await trio.sleep(self.lag)
        return got


def _k4_and_sm() -> tuple[SubnetManager, InMemoryPort, Lagging, Topology, InMemoryFabric]:
    topo, fab = fat_tree(4)
    inner = InMemoryPort(fab, "h0")
    port = Lagging(inner)
    sm = SubnetManager(port, SmConfig(), route_fn=minhop)  # type: ignore[arg-type]
    return sm, inner, port, topo, fab


def test_the_sms_own_switch_is_not_dropped_when_answers_come_late() -> None:
    """A cable of the SM's own switch cut, the reroute's Sets unanswered in a stall: the
    switch becomes a suspect; in the next pass every answer comes 80 ms late (a loaded
    machine), longer than a suspect's probe. Was: the switch dropped with every cable of it,
    the SM's own too, and the whole subnet reported lost (``fabric partitioned: 207 nodes
    unreachable`` on k=8). Now it stays, checked again next pass, and is cleared then."""
    sm, inner, port, topo, fab = _k4_and_sm()
    gateway = topo.node("edge0_0").guid

    async def main() -> None:
        async with sm.running():
            await sm.full_sweep("cold")
            fab.link_down("edge0_0", 3)  # an up-port of the SM's own switch
            await handle_the_traps(sm, inner)
            assert sm.events.of("reroute") and not unreachable_pairs(fab)
            sm._on_suspect(gateway)  # as the reroute's programmer does with unanswered Sets
            port.lag = 0.08  # longer than a suspect's probe (50 ms), shorter than a timeout
            await handle_the_traps(sm, inner)
            assert gateway in sm.graph.nodes and len(sm.graph.nodes) == 36
            assert not sm.events.of("partition") and not sm.events.of("switch_dropped")
            assert gateway in sm._check and not unreachable_pairs(fab)
            port.lag = 0.0
            await sm.step()  # the next pass (the light sweep's time): checked again, answered
            assert gateway not in sm.prog.suspects and not sm._check
            assert not sm.events.of("partition") and not unreachable_pairs(fab)

    run(main)


def test_no_suspect_is_dropped_on_a_probe_the_sms_own_switch_could_not_answer_either() -> None:
    """Answers 80 ms late: a suspect further away that does not answer its probe in time is
    kept (the SM's own switch did not answer its either: the silence is the SM's side's);
    once answers are prompt again the next pass clears it. A switch that is really silent is
    still dropped (``test_manager``: a dying switch)."""
    sm, inner, port, topo, fab = _k4_and_sm()
    suspect = topo.node("agg1_0").guid

    async def main() -> None:
        async with sm.running():
            await sm.full_sweep("cold")
            sm._on_suspect(suspect)
            port.lag = 0.08
            await handle_the_traps(sm, inner)
            assert suspect in sm.graph.nodes and not sm.events.of("switch_dropped")
            assert suspect in sm._check
            port.lag = 0.0
            await sm.step()
            assert suspect not in sm.prog.suspects and not sm.events.of("switch_dropped")
            assert not unreachable_pairs(fab)

    run(main)


def test_a_trap_pass_whose_reads_go_unanswered_leaves_the_change_for_the_light_sweep() -> None:
    """The cut's trap comes, but every answer to its pass comes after the timeouts: the SM
    learns nothing. Was: the trapping switch's PortStateChange cleared all the same, so no
    light sweep ever looked at it again and the routes through the cut stayed (on k=4, h1
    -> h15 blackholed for good). Now the bit stays and the next light sweep reroutes."""
    sm, inner, port, _topo, fab = _k4_and_sm()

    async def main() -> None:
        async with sm.running():
            await sm.full_sweep("cold")
            fab.link_down("edge0_0", 3)
            inner.pump()
            await trio.sleep(0.01)
            assert sm._dirty
            port.lag = 1.0  # longer than every attempt of a read (4 x 0.2 s)
            await sm.step()
            assert not sm.events.of("reroute") and unreachable_pairs(fab)
            port.lag = 0.0
            await trio.sleep(10)  # what was answered late arrives
            await sm.step()  # the light sweep
            assert sm.events.of("reroute") and not sm.events.of("partition")
            assert not unreachable_pairs(fab)

    run(main)


def test_our_own_port_unanswered_is_not_taken_for_our_cable_down() -> None:
    """A light sweep while every answer comes after the timeouts: our own port's PortInfo
    goes unanswered. Was: taken for our cable down, the whole subnet reported lost
    (``fabric partitioned: 35 nodes unreachable``) and swept afresh. Now the pass is skipped;
    the next one finds everything as it was."""
    sm, _inner, port, _topo, fab = _k4_and_sm()

    async def main() -> None:
        async with sm.running():
            await sm.full_sweep("cold")
            port.lag = 1.0  # longer than every attempt (4 x 0.2 s)
            await sm.light_sweep()
            port.lag = 0.0
            await trio.sleep(10)  # what was answered late arrives
            await sm.light_sweep()
            assert not sm.events.of("partition") and len(sm.graph.nodes) == 36
            assert sm.events.counts["sweep_start"] == 2 and not unreachable_pairs(fab)  # cold, then one light

    run(main)
