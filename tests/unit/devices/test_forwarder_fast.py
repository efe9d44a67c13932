"""``Forwarder.forward_run`` (the user datapath's fast twin) equals ``Forwarder.decide``.

Two identical switches see the same generated frames: one through ``decide`` frame by frame
(the reference), the other through ``forward_run`` with ``decide`` for the frames it leaves,
as the agent host runs it. Frames vary in DLID (routed, unrouted, own LID, multicast,
permissive, above LinearFDBTop), VL (data, VL15), P_Key (full, limited, other partitions),
length and VCRC; between batches port states, the LFT, the LID, impairments, the ports'
P_KeyTables and partition enforcement bits, and the alternate ports of local failover change
(ports go down and come back: frames whose LFT port is down take an alternate, or are counted
when every alternate is down too). Both must send the same frames to the same ports in
the same order and end with the same counters, statistics and RNG state.
"""

from __future__ import annotations

import random

import pytest

from ibemu.agents.forwarder import Reason
from ibemu.agents.port import PhysState, PortState
from ibemu.agents.switch import SwitchAgent
from ibemu.wire import fast

ETH = 14
HEADS = {p: bytes([p]) * ETH for p in range(1, 7)}


def switch(seed: int) -> SwitchAgent:
    sw = SwitchAgent(node_guid=0x77, num_ports=6, link_up=[True] * 6, forwarder_seed=seed)
    for n in range(1, 7):
        sw.ports[n].state = PortState.ACTIVE
    sw.ports[0].lid = 20
    sw.lft.set_block(0, bytes((lid % 6) + 1 for lid in range(64)))
    sw.lft.set_top(63)
    return sw


def frame(rng: random.Random) -> bytes:
    dlid = rng.choice([rng.randrange(1, 70), rng.randrange(1, 70), 20, 21, 0, 0xC001, 0xFFFF, 100])
    vl = 15 if rng.random() < 0.1 else 0
    payload = bytes(rng.randrange(256) for _ in range(rng.choice([0, 4, 64, 256])))
    pkey = rng.choice([0xFFFF, 0x8001, 0x0001, 0x8002, 0x0002, 0x7FFF, 0x0000])
    pkt = bytearray(fast.NativeTemplate(slid=9, dlid=dlid, destqp=0x42, vl=vl, pkey=pkey).packet(
        0x0A, rng.randrange(1 << 24), payload, ext=fast.reth(0, 0, len(payload))))
    r = rng.random()
    if r < 0.05:
        pkt[-1] ^= 0x10  # bad VCRC
    elif r < 0.08:
        pkt = pkt[:-4]  # bad length
    elif r < 0.09:
        pkt = pkt[:6]  # runt
    return bytes(rng.randbytes(ETH)) + bytes(pkt)


def mutate(rng: random.Random, sws: tuple[SwitchAgent, SwitchAgent]) -> None:
    """The same random change of state on both switches."""
    block = bytes(rng.choice([1, 2, 3, 4, 5, 6, 0, 0xFF, 9]) for _ in range(64))
    top = rng.choice([63, 63, 40])
    port = rng.randrange(1, 7)
    state = rng.choice([PortState.ACTIVE, PortState.ACTIVE, PortState.ARMED, PortState.INIT, PortState.DOWN])
    phys = rng.choice([PhysState.LINK_UP, PhysState.LINK_UP, PhysState.POLLING])
    lid, lmc = rng.choice([(20, 0), (20, 1), (0, 0), (33, 2)])
    loss, corrupt = rng.choice([(0.0, 0.0), (0.0, 0.0), (0.5, 0.0), (0.0, 0.5)])
    imp_port = rng.randrange(1, 7)
    alt_block = rng.randrange(4)  # LIDs 0..63: 4 blocks of 16
    alts = bytearray(64)
    for i in range(0, 64, 4):
        ports = rng.sample(range(1, 7), rng.choice([0, 1, 2, 3, 3]))
        alts[i : i + len(ports)] = bytes(ports)
    downs = rng.sample(range(1, 7), rng.randrange(1, 3))
    what = rng.choice([0, 1, 2, 3, 4, 5, 5, 6, 6, 7, 8])
    flags = rng.choice([0, 0, 0, 0, 8, 4, 12, 15])
    table = rng.choice([[], [0xFFFF, 0x8001], [0x7FFF, 0x0001], [0x8002], [0xFFFF, 0x0002, 0x8001]])
    for sw in sws:
        if what == 0:
            sw.lft.set_block(0, block)
            sw.lft.set_top(top)
        elif what == 1:
            sw.ports[port].state = state
        elif what == 2:
            sw.ports[port].phys = phys
        elif what == 3:
            sw.ports[0].lid, sw.ports[0].lmc = lid, lmc
        elif what == 4:
            sw.forwarder.set_impairment(imp_port, loss=loss, corrupt=corrupt)
        elif what == 6:
            sw.alternates[alt_block] = bytes(alts)
        elif what == 7:  # cables cut: the LFT's ports for many LIDs down at once
            for n in downs:
                sw.ports[n].phys, sw.ports[n].state = PhysState.POLLING, PortState.DOWN
        elif what == 8:
            sw.ports[port].partition_flags = flags
            sw.ports[port].pkeys = list(table)
        else:
            sw.forwarder.verify_vcrc = not sw.forwarder.verify_vcrc  # now and then without the check
            for n in range(1, 7):  # and everything back up
                sw.ports[n].state, sw.ports[n].phys = PortState.ACTIVE, PhysState.LINK_UP
                sw.ports[n].partition_flags = 0


def reference(sw: SwitchAgent, frames: list[bytes], ingress: int) -> list[tuple[int, bytes | None]]:
    out: list[tuple[int, bytes | None]] = []
    for f in frames:
        v = sw.forwarder.decide(f[ETH:], ingress)
        out.append((v.port, HEADS[v.port] + v.packet) if v.port else (0, None if v.reason is not Reason.TO_SMA else f))
    return [x for x in out if x[0] or x[1] is not None]


TAKEN = [0]


def fast_path(sw: SwitchAgent, frames: list[bytes], ingress: int) -> list[tuple[int, bytes | None]]:
    """As the agent host: runs through ``forward_run``, the rest through ``decide``; the
    order of sends per egress is what a receiver sees, so compare per egress."""
    out: list[tuple[int, bytes | None]] = []
    i = 0
    while i < len(frames):
        batch: dict[int, list[bytes]] = {}
        i = sw.forwarder.forward_run(frames, i, ingress, ETH, batch)
        for port, q in batch.items():
            out += [(port, HEADS[port] + x[ETH:]) for x in q]
            TAKEN[0] += len(q)
        if i < len(frames):
            f = frames[i]
            i += 1
            v = sw.forwarder.decide(f[ETH:], ingress)
            if v.port:
                out.append((v.port, HEADS[v.port] + v.packet))
            elif v.reason is Reason.TO_SMA:
                out.append((0, f))
    return out


def per_port(sends: list[tuple[int, bytes | None]]) -> dict[int, list[bytes | None]]:
    d: dict[int, list[bytes | None]] = {}
    for port, data in sends:
        d.setdefault(port, []).append(data)
    return d


@pytest.mark.parametrize("seed", range(8))
def test_fast_twin_equals_decide(seed: int) -> None:
    rng = random.Random(seed)
    ref, fst = switch(seed), switch(seed)
    forwarded = 0
    TAKEN[0] = 0
    for _ in range(100):
        if rng.random() < 0.5:
            mutate(rng, (ref, fst))
        ingress = rng.choice([1, 2, 3, 4, 5, 6, 6, 0, 9])
        frames = [frame(rng) for _ in range(rng.randrange(1, 40))]
        a, b = reference(ref, frames, ingress), fast_path(fst, frames, ingress)
        assert per_port(a) == per_port(b)
        forwarded += sum(1 for p, _ in a if p)
        for n in ref.ports:
            assert ref.ports[n].counters.snapshot() == fst.ports[n].counters.snapshot(), n
        assert ref.forwarder.stats == fst.forwarder.stats
        assert list(ref.forwarder.pkey_drops) == list(fst.forwarder.pkey_drops)
        assert [p.p_key_violations for p in ref.ports.values()] == [p.p_key_violations for p in fst.ports.values()]
        assert ref.forwarder.rng.getstate() == fst.forwarder.rng.getstate()
    # the fast path took a good share (the generated partitions, cuts and failovers send many to decide)
    assert forwarded > 100 and TAKEN[0] > forwarded // 4
    FAILOVERS[0] += ref.forwarder.stats["local_failover"]
    ALL_DOWN[0] += ref.forwarder.stats[Reason.ALTERNATES_DOWN]
    PKEY_DROPS[0] += ref.forwarder.stats[Reason.PKEY_INBOUND] + ref.forwarder.stats[Reason.PKEY_OUTBOUND]


FAILOVERS = [0]
ALL_DOWN = [0]
PKEY_DROPS = [0]


def test_the_generated_cases_fail_over_and_enforce_partitions() -> None:
    """The seeds above exercised local failover, all-alternates-down and partition drops
    (they run first)."""
    if not FAILOVERS[0]:
        for seed in range(8):
            test_fast_twin_equals_decide(seed)
    assert FAILOVERS[0] > 50 and ALL_DOWN[0] > 5 and PKEY_DROPS[0] > 0, (FAILOVERS[0], ALL_DOWN[0], PKEY_DROPS[0])


def test_a_vouched_vcrc_is_not_checked_and_a_corrupting_port_is_never_vouched_for() -> None:
    sw = switch(0)
    good = bytes(ETH) + fast.NativeTemplate(slid=9, dlid=5, destqp=1).packet(0x04, 1, b"y" * 32)
    bad = good[:-1] + bytes([good[-1] ^ 1])
    out: dict[int, list[bytes]] = {}
    assert sw.forwarder.forward_run([good, bad], 0, 1, ETH, out) == 1  # checked: stops at the bad one
    assert sw.forwarder.forward_run([good], 0, 1, ETH, out, vcrc_known_good=True) == 1
    assert sw.forwarder.vouches_for(3)
    sw.forwarder.set_impairment(3, corrupt=0.5)
    sw.forwarder.set_impairment(3)
    assert not sw.forwarder.vouches_for(3)  # its frames may still be on their way
    sw.forwarder.verify_vcrc = False
    assert not sw.forwarder.vouches_for(2)


def test_fast_twin_takes_the_common_case_and_stops_at_the_first_other() -> None:
    sw = switch(0)
    block = bytearray(b"\xff" * 64)
    block[5] = 2
    sw.lft.set_block(0, block)
    sw.lft.set_top(63)
    data = bytes(ETH) + fast.NativeTemplate(slid=9, dlid=5, destqp=1).packet(0x04, 1, b"y" * 32)
    smp = bytes(ETH) + fast.NativeTemplate(slid=9, dlid=0xFFFF, destqp=0, vl=15).packet(0x04, 1, b"z" * 32)
    out: dict[int, list[bytes]] = {}
    assert sw.forwarder.forward_run([data, data, smp, data], 0, 1, ETH, out) == 2
    assert out[2] == [data] * 2
    assert sw.forwarder.stats["forwarded"] == 2
    assert sw.counters(1).rcv_pkts == 2 and sw.counters(2).xmit_pkts == 2


def test_local_failover_takes_the_first_alternate_that_is_up() -> None:
    """Both twins: LFT port down -> first alternate up (the ingress skipped); all down ->
    not forwarded, counted; no alternates -> dropped as before (EGRESS_DOWN)."""
    for twin in ("decide", "fast"):
        sw = switch(0)
        block = bytearray(b"\xff" * 64)
        block[5] = block[6] = block[7] = 2
        sw.lft.set_block(0, block)
        alts = bytearray(64)
        alts[5 * 4 : 5 * 4 + 3] = bytes([3, 1, 4])  # LID 5: 3 (down), 1 (the ingress), 4
        alts[6 * 4] = 3  # LID 6: only 3 (down)
        sw.alternates[0] = bytes(alts)  # LID 7: none
        for n in (2, 3):
            sw.ports[n].phys, sw.ports[n].state = PhysState.POLLING, PortState.DOWN
        frames = [bytes(ETH) + fast.NativeTemplate(slid=9, dlid=d, destqp=1).packet(0x04, 1, b"y" * 32)
                  for d in (5, 6, 7, 5)]
        sends = reference(sw, frames, 1) if twin == "decide" else fast_path(sw, frames, 1)
        assert [p for p, _ in sends] == [4, 4], twin
        assert sw.forwarder.stats["local_failover"] == 2
        assert sw.forwarder.stats[Reason.ALTERNATES_DOWN] == 1
        assert sw.forwarder.stats[Reason.EGRESS_DOWN] == 1
        assert sw.counters(2).port_xmit_discards == 2 and sw.counters(4).xmit_pkts == 2
        assert sw.failover_lids(2) == 1  # LID 5 has an alternate up; 6 and 7 do not
    out: dict[int, list[bytes]] = {}
    assert sw.forwarder.forward_run(frames, 0, 1, ETH, out) == 1  # the fast path itself fails over
    assert out == {4: frames[:1]} and sw.forwarder.stats["local_failover"] == 3
