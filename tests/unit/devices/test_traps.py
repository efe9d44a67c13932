"""Trap 128 on link changes: reaches the SM's CA through the LFTs, repeats, TrapRepress."""

from __future__ import annotations

from ibemu.agents.actions import DeliverMad
from ibemu.agents.traps import TrapPolicy
from ibemu.testing.wiring import InMemoryFabric
from ibemu.wire import madcodec as mb
from ibemu.wire.mad import Notice, Trap128Details

from .fabrics import chain
from .minism import MiniSm

SEC = 1_000_000_000


def up(policy: TrapPolicy | None = None) -> tuple[InMemoryFabric, dict[str, int]]:
    fab = chain(3, trap_policy=policy)
    nodes = MiniSm(fab, "sm").bring_up()
    return fab, {n.description: n.lid for n in nodes.values()}


def traps(fab: InMemoryFabric) -> list[DeliverMad]:
    return [d for d in fab.delivered["sm"] if d.mad[3] == 0x05]


def test_no_trap_before_the_sm_configured_the_switch() -> None:
    fab = chain(3)
    fab.link_down("s3", 5)
    assert traps(fab) == [] and fab.agents["s3"].stats["trap_not_configured"] >= 1


def test_link_down_sends_trap_128_to_the_master_sm() -> None:
    fab, lid = up()
    fab.delivered["sm"].clear()
    fab.link_down("s3", 5)
    (trap,) = traps(fab)
    assert trap.slid == lid["s3"] and trap.dlid == lid["sm"] and trap.sqp == 0 and trap.dqp == 0
    assert trap.mad[1] == 0x01 and int.from_bytes(trap.mad[16:18], "big") == 0x0002
    notice = Notice(mb.smp_data(trap.mad))
    assert (notice.is_generic, notice.type, notice.producer_type, notice.trap_number) == (1, 1, 2, 128)
    assert notice.issuer_lid == lid["s3"] and notice[Trap128Details].lidaddr == lid["s3"]
    # it crossed s2 and s1, LID-routed by their LFTs
    path = [r.src for r in fab.wire if r.packet[28 + 3] == 0x05]
    assert path == ["s3", "s2", "s1"]
    assert fab.events_of("trap_sent", "s3")[0].fields["port"] == 5


def test_trap_repeats_until_repressed() -> None:
    fab, lid = up(TrapPolicy(period_ns=2 * SEC, max_repeats=None))
    fab.delivered["sm"].clear()
    fab.link_down("s2", 3)  # s2 - s3 cable: s3 unreachable, s2 still reaches the SM
    first = traps(fab)
    assert len(first) == 1  # s3 has no route to the SM any more
    fab.advance(1 * SEC)
    assert len(traps(fab)) == 1
    fab.advance(1 * SEC)
    assert len(traps(fab)) == 2
    assert mb.tid(traps(fab)[1].mad) == mb.tid(first[0].mad)  # the same trap: same TID
    repress = bytearray(first[0].mad)
    repress[3] = 0x07
    fab.send_mad("sm", 1, lid["s2"], 0, 0, bytes(repress))
    assert fab.agents["s2"].stats["trap_repressed"] == 1
    fab.advance(10 * SEC)
    assert len(traps(fab)) == 2
    assert fab.agents["s2"].next_deadline() is None


def test_repeats_stop_after_max_repeats() -> None:
    fab, _lid = up(TrapPolicy(period_ns=SEC, max_repeats=3))
    fab.delivered["sm"].clear()
    fab.link_down("s1", 3)
    for _ in range(10):
        fab.advance(SEC)
    assert len(traps(fab)) == 4  # once + 3 repeats
    assert fab.agents["s1"].next_deadline() is None


def test_link_up_also_traps_and_sets_port_state_change() -> None:
    fab, _lid = up()
    fab.link_down("s3", 5)
    fab.delivered["sm"].clear()
    fab.link_up("s3", 5)
    assert len(traps(fab)) == 1
    assert fab.agents["s3"].switch_info.port_state_change


def test_unroutable_trap_is_counted_and_retried() -> None:
    fab, _lid = up(TrapPolicy(period_ns=SEC, max_repeats=5))
    fab.delivered["sm"].clear()
    fab.link_down("s1", 6)  # the SM's own cable: nothing can reach it
    s1 = fab.agents["s1"]
    assert s1.stats["trap_no_route"] == 1 and traps(fab) == []
    fab.advance(SEC)
    assert s1.stats["trap_no_route"] == 2
    fab.link_up("s1", 6)  # the SM's link comes back (Init: VL15 passes)
    fab.advance(SEC)
    assert len(traps(fab)) >= 1


def test_repress_with_only_the_low_32_bits_of_the_tid() -> None:
    """OpenSM (through umad) answers a trap with the TID's low 32 bits only."""
    fab, lid = up(TrapPolicy(period_ns=SEC, max_repeats=None))
    fab.delivered["sm"].clear()
    fab.link_down("s1", 3)
    (trap,) = traps(fab)
    assert mb.tid(trap.mad) >> 32  # our TIDs use the high bits too
    repress = bytearray(trap.mad)
    repress[3] = 0x07
    repress[8:16] = (mb.tid(trap.mad) & 0xFFFFFFFF).to_bytes(8, "big")
    fab.send_mad("sm", 1, lid["s1"], 0, 0, bytes(repress))
    assert fab.agents["s1"].stats["trap_repressed"] == 1
    repress[8:16] = (12345).to_bytes(8, "big")
    fab.send_mad("sm", 1, lid["s1"], 0, 0, bytes(repress))
    assert fab.agents["s1"].stats["trap_repress_unmatched"] == 1
