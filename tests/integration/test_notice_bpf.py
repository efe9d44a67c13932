"""Fault notices in the kernel (``ibemu.kernel.notice``, ``bpf_src/notice.c`` and
``notice_tx.c``, tail-called by the kernel SMA) against the Python switch agent, with
BPF_PROG_TEST_RUN (no namespace, no fabric).

Two agents of one switch are built alike (LFT, alternates, FailoverConfig through the same
SMPs): ``kernel_side`` publishes its state to the maps (its LFT is the kernel's memory) and
takes what the kernel did from its record (``notice_in_kernel``) or, for a frame the kernel
hands up, the frame itself, as the agent host does; ``reference`` sees every frame. For
generated tables and notices, the kernel's LFT, forwarding map and notice state
(``sma_nstate``), the kernel side's dead ends, repairs, announcements and counters, and the
onward notice (its LIDs, its ports, the frame itself but for its TID and PSN) must be the
reference's. Bad input (a notice from two hops away, from a CA port, on a port whose link is
down, with notices off, LID-routed) goes up unchanged and the agent counts it.
"""

from __future__ import annotations

import random
import struct

import pytest

from ibemu.agents.actions import AltUpdate, LftUpdate, Send
from ibemu.agents.port import PortState
from ibemu.agents.switch import (
    ATTR_ALTERNATES,
    ATTR_FAILOVER_CONFIG,
    ATTR_FAULT_NOTICE,
    SwitchAgent,
)
from ibemu.wire.madpacket import MAD_OFFSET, frame_mad, reseal

pytestmark = pytest.mark.root

bpf = pytest.importorskip("ibemu.kernel.bpf")
from ibemu.kernel import lft_map, notice, sma  # noqa: E402
from ibemu.kernel.dr_relay import egress_key  # noqa: E402
from ibemu.kernel.sma import egress_value  # noqa: E402
from tests.integration.test_sma_bpf import load_kernel_sma  # noqa: E402

NUM_PORTS = 8
UP = (1, 2, 3, 4, 5, 6)  # 7 and 8: no link
SWITCH_PORTS = (1, 2, 3, 4, 5, 7)  # 6 faces a CA
TOP = 300
OUT_BASE = 0x7FFFFF00
DEV = 5
TRAP = 5
_NSTATE = struct.Struct("=IIQ64Q64s64s")


def _mac(port: int) -> bytes:
    return bytes([2, 0, 0, 0, DEV, port])


def _peer(port: int) -> bytes:
    return bytes([6, 0, 0, 0, DEV, port])


@pytest.fixture(scope="module")
def kernel() -> sma.KernelSma:
    k = load_kernel_sma()
    if k.notices is None:
        k.close()
        pytest.fail("the fault notice programs did not load (see the log for the verifier's words)")
    yield k
    k.close()


def _switch() -> SwitchAgent:
    sw = SwitchAgent(node_guid=0x0002C90000000500, num_ports=NUM_PORTS, description="agg",
                     link_up=[p in UP for p in range(1, NUM_PORTS + 1)], linear_fdb_cap=4096)
    for p in UP:
        sw.ports[p].state = PortState.ACTIVE
    sw.ports[0].lid = 7
    sw.ports[0].master_sm_lid = 1
    sw.lft.set_top(TOP)
    sw.switch_info.linear_fdb_top = TOP
    return sw


def _dr(method: int, attr: int, mod: int, *, tid: int, n: int = 1, data: bytes = b"") -> bytes:
    mad = bytearray(256)
    struct.pack_into("!BBBBHBBQHHIQHH", mad, 0, 1, 0x81, 1, method, 0, n, n, tid, attr, 0, mod, 0,
                     0xFFFF, 0xFFFF)
    mad[64:64 + len(data)] = data
    for i in range(1, n + 1):
        mad[128 + i] = 1
    return frame_mad(mad, dlid=0xFFFF, slid=0xFFFF, dqp=0, sqp=0, qkey=0, vl=15)


def _bitmap(lids: list[int]) -> bytes:
    b = bytearray(64)
    for lid in lids:
        b[(lid % 512) >> 3] |= 1 << (lid & 7)
    return bytes(b)


def _lids(bitmap: bytes, block: int) -> list[int]:
    return [block * 512 + i * 8 + b for i in range(64) for b in range(8) if bitmap[i] >> b & 1]


class Harness:
    def __init__(self, k: sma.KernelSma) -> None:
        self.k = k
        self.a, self.b = _switch(), _switch()
        self.fwd = lft_map.LftProgram({})
        self.a.lft.bind(k.lft_view(0))
        k.add_device(DEV, is_switch=True, num_ports=NUM_PORTS, lft_slot=0, lft_blocks=self.a.lft.blocks,
                     fwd_map_fd=self.fwd.blocks.fd, alt_map_fd=self.fwd.alts.fd)
        for p in range(1, NUM_PORTS + 1):
            k.add_port(DEV, p, 1, _mac(p), _peer(p), up=True)  # test runs: ifindex 1 (lo)
            k.out.update(egress_key(DEV, p), egress_value(OUT_BASE + p, True, _peer(p), _mac(p)))
        k.forget(DEV)
        self.publish()
        self.tid = 1
        self.in_kernel = 0
        self.handed_up = 0

    def close(self) -> None:
        self.k.forget(DEV)
        self.fwd.close()

    def publish(self) -> None:
        self.k.publish(DEV, self.a.sma_images())

    def smp(self, attr: int, mod: int, data: bytes) -> None:
        """A SubnSet both agents answer (port 1), its changes carried out as the host does."""
        self.tid += 1
        pkt = _dr(2, attr, mod, tid=self.tid, data=data)
        for agent in (self.a, self.b):
            for action in agent.receive(1, pkt):
                if agent is self.a and isinstance(action, LftUpdate):
                    self.fwd.apply(action.changes)
                if agent is self.a and isinstance(action, AltUpdate):
                    self.fwd.set_alternates(action.first_lid, action.entries)
        self.publish()

    def failover_config(self, *, on: bool, generation: int) -> None:
        data = bytearray(64)
        data[0] = int(on)
        struct.pack_into("!I", data, 4, generation)
        data[32:64] = sum(1 << p for p in SWITCH_PORTS).to_bytes(32, "little")
        self.smp(ATTR_FAILOVER_CONFIG, 0, bytes(data))

    def tables(self, rng: random.Random) -> None:
        for block in range(TOP // 64 + 1):
            entries = bytes(rng.choice((1, 2, 3, 4, 5, 6, 7, 8, 0xFF)) for _ in range(64))
            self.smp(0x0019, block, entries)
        for mod in range(TOP // 16 + 1):
            data = bytearray(64)
            for i in range(16):
                alts = rng.sample(range(1, NUM_PORTS + 1), rng.randrange(0, 4))
                data[i * 4:i * 4 + len(alts)] = bytes(alts)
            self.smp(ATTR_ALTERNATES, mod, bytes(data))

    def notice(self, port: int, lids: list[int], *, block: int = 0, n: int = 1, expect: bool | None = None,
               lid_routed: bool = False) -> None:
        """A neighbour's notice for ``lids`` arrives on ``port``."""
        self.tid += 1
        pkt = _dr(TRAP, ATTR_FAULT_NOTICE, block, tid=self.tid, n=n, data=_bitmap(lids))
        if lid_routed:
            buf = bytearray(pkt)
            buf[MAD_OFFSET + 1] = 0x01
            buf[2:4] = (7).to_bytes(2, "big")
            buf[6:8] = (9).to_bytes(2, "big")
            pkt = reseal(buf)
        frame = _mac(port) + _peer(port) + b"\x88\xb5" + pkt
        ret, out, _ns = bpf.test_run(self.k.prog_fd, frame, ctx=True)
        data = out[:len(frame)]
        ref = self.b.receive(port, pkt)
        ref_sends = [a for a in ref if isinstance(a, Send)]
        assert self.k.notice_log is not None
        recs = self.k.notice_log.read()
        if ret == bpf.TC_ACT_SHOT:
            self.in_kernel += 1
            assert expect is not False, "the kernel took a notice that is the agent's"
            assert len(recs) == 1
            rec = recs[0]
            assert (rec.dev, rec.port, rec.block) == (DEV, port, block)
            assert list(rec.lids) == sorted(set(lids))
            mirror = self.a.notice_in_kernel(rec.port, rec.lids, rec.moved, rec.noted, rec.lost, rec.fresh,
                                             rec.sent, rec.t_ns)
            assert not [a for a in mirror if isinstance(a, Send | LftUpdate)], "acted twice"
            # the onward notice: the reference's LIDs, on the reference's ports
            assert rec.sent == len(ref_sends)
            assert sorted(a.port for a in ref_sends) == sorted(set(a.port for a in ref_sends))
            if ref_sends:
                got = _lids(ref_sends[0].packet[MAD_OFFSET + 64:MAD_OFFSET + 128], block)
                assert list(rec.fresh) == got
                last = max(ref_sends, key=lambda a: a.port)
                sent = bytearray(data[14:])
                assert reseal(bytearray(sent)) == bytes(sent), "the onward notice's CRCs"
                assert data[:12] == _peer(last.port) + _mac(last.port)
                tid = struct.unpack_from("!Q", sent, MAD_OFFSET + 8)[0]
                assert tid >> 48 == self.a.node_guid & 0xFFFF and tid >> 46 & 3 == 3
                sent[MAD_OFFSET + 8:MAD_OFFSET + 16] = last.packet[MAD_OFFSET + 8:MAD_OFFSET + 16]
                sent[17:20] = last.packet[17:20]  # BTH PSN
                assert reseal(sent) == last.packet
            else:
                assert not rec.fresh
        else:
            self.handed_up += 1
            assert ret == bpf.TC_ACT_UNSPEC and data == frame, "a frame handed up must be unchanged"
            assert not recs
            assert expect is not True, "the kernel handed up a notice it takes"
            for action in self.a.receive(port, pkt):
                if isinstance(action, LftUpdate):
                    self.fwd.apply(action.changes)

    def kernel_state(self) -> tuple[dict[int, frozenset[int]], dict[int, tuple[int, int]], frozenset[int]]:
        """``sma_nstate`` of the switch, as ``SwitchAgent.notice_state`` says it."""
        assert self.k.notices is not None
        m = self.k.notices.maps["sma_nstate"]
        fo = self.a.sma_images(attrs=(ATTR_FAILOVER_CONFIG,))[(ATTR_FAILOVER_CONFIG, 0)]
        gen = struct.unpack_from("!I", fo, 4)[0]
        dead: dict[int, frozenset[int]] = {}
        repaired: dict[int, tuple[int, int]] = {}
        announced: set[int] = set()
        for block in range(TOP // 64 + 1):
            raw = m.lookup(struct.pack("=II", DEV, block))
            if raw is None:
                continue
            g, _pad, ann, *rest = _NSTATE.unpack(raw)
            if g != gen:
                continue  # another generation's: ended
            dead_bits, sm_, rep = rest[:64], rest[64], rest[65]
            for j in range(64):
                lid = block * 64 + j
                if dead_bits[j]:
                    dead[lid] = frozenset(p for p in range(64) if dead_bits[j] >> p & 1)
                if rep[j]:
                    repaired[lid] = (sm_[j], rep[j])
                if ann >> j & 1:
                    announced.add(lid)
        return dead, repaired, frozenset(announced)

    def assert_same(self) -> None:
        ref = self.b.notice_state()
        assert self.a.notice_state() == ref
        assert self.kernel_state() == ref
        keys = [k for k in self.b.stats if k.startswith("notice")]
        assert {k: self.a.stats[k] for k in keys} == {k: self.b.stats[k] for k in keys}
        assert all(self.a.lft.get_block(i) == self.b.lft.get_block(i) for i in range(TOP // 64 + 1))
        table = bytes(self.fwd.table)
        eff = self.b.lft.effective()
        assert {lid: table[lid] for lid in range(1, TOP + 64) if table[lid]} == \
            {lid: p for lid, p in eff.items() if p}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_notices_in_the_kernel_match_the_agent(kernel: sma.KernelSma, seed: int) -> None:
    rng = random.Random(seed)
    h = Harness(kernel)
    try:
        h.failover_config(on=True, generation=1)
        h.tables(rng)
        h.assert_same()
        for step in range(60):
            port = rng.choice((1, 2, 3, 4, 5))
            lids = rng.sample(range(0, TOP + 40), rng.randrange(1, 60))
            h.notice(port, lids, expect=True)
            h.assert_same()
            if step == 30:  # the SM's next generation ends the repairs, in the kernel too
                h.failover_config(on=True, generation=2)
                h.assert_same()
                assert h.kernel_state() == ({}, {}, frozenset())
        assert h.in_kernel == 60
        moved = h.b.stats["notice_lids_moved"]
        assert moved > 20 and h.b.stats["notices_sent"] > 0, "the tables must make moves and announcements"
    finally:
        h.close()


def test_bad_notices_are_handed_up_counted_and_ignored(kernel: sma.KernelSma) -> None:
    rng = random.Random(7)
    h = Harness(kernel)
    try:
        h.failover_config(on=True, generation=1)
        h.tables(rng)
        lids = list(range(1, 200))
        before = dict(h.b.stats)
        h.notice(1, lids, n=2, expect=False)  # from two hops away
        h.notice(1, lids, lid_routed=True, expect=False)  # LID-routed
        h.notice(6, lids, expect=False)  # a port facing a CA
        h.notice(8, lids, expect=False)  # a port without a link
        h.assert_same()
        assert h.b.stats["notice_not_neighbour"] - before.get("notice_not_neighbour", 0) == 1
        assert h.b.stats["notice_ignored"] - before.get("notice_ignored", 0) == 1
        h.failover_config(on=False, generation=1)  # notices off
        h.notice(1, lids, expect=False)
        h.assert_same()
        assert h.b.stats["notice_ignored"] - before.get("notice_ignored", 0) == 2
        assert h.kernel_state() == ({}, {}, frozenset()) and h.handed_up == 5
        h.failover_config(on=True, generation=1)
        h.notice(2, [600, 700], block=1, expect=True)  # beyond LinearFDBTop: taken, all ignored
        h.assert_same()
    finally:
        h.close()


def test_crc_patches_seal_every_port() -> None:
    """``sma_ndelta``: a frame sealed with InitialPath[1] = 0, patched for v, is the frame
    sealed with v there."""
    deltas = notice.crc_deltas()
    rng = random.Random(3)
    base = bytearray(rng.randbytes(290))
    base[notice.IP1_AT] = 0
    sealed0 = reseal(bytearray(base))
    for v in (1, 2, 7, 63, 200, 255):
        b = bytearray(base)
        b[notice.IP1_AT] = v
        want = reseal(b)
        di, dv = struct.unpack_from("=II", deltas, v * 8)
        got = bytearray(sealed0)
        got[notice.IP1_AT] = v
        struct.pack_into("<I", got, 284, struct.unpack_from("<I", sealed0, 284)[0] ^ di)
        struct.pack_into("<H", got, 288, struct.unpack_from("<H", sealed0, 288)[0] ^ dv)
        assert bytes(got) == want


@pytest.mark.parametrize("seed", [4, 5])
def test_loss_of_signal_announced_by_the_kernel_as_by_the_agent(kernel: sma.KernelSma, seed: int) -> None:
    """A port losing its signal (``notice.announce_loss``, the LOSS run the agent host makes at
    a cut) against ``SwitchAgent.announce_port_lost``: the same LIDs announced, on as many
    ports, nothing moved, no dead end; the kernel's onward notice is the agent's (but for its
    TID and PSN); its record, taken by ``lost_in_kernel``, leaves the agent as the reference.
    Earlier notices (dead ends, repairs) shape what is left to announce; a port whose LIDs all
    have another way announces nothing and leaves no record; with notices off the kernel
    declines."""
    rng = random.Random(seed)
    h = Harness(kernel)
    assert kernel.notices is not None and kernel.notice_log is not None
    prog = kernel.notices.prog_fd
    try:  # a generation of its own: the kernel's notice state of earlier tests is not this one's
        h.failover_config(on=True, generation=100 + seed)
        h.tables(rng)
        announced = 0
        for step in range(24):
            if step % 3 == 2:  # a neighbour's notice first: dead ends and repairs to reckon with
                h.notice(rng.choice((1, 2, 3, 4, 5)), rng.sample(range(1, TOP), 40), expect=True)
            port = rng.choice((1, 2, 3, 4, 5))
            lids = h.a.lft.lids_to(port)
            assert lids == h.b.lft.lids_to(port)
            ref = h.b.announce_port_lost(port)
            ref_sends = [a for a in ref if isinstance(a, Send)]
            want = sorted({lid for a in ref_sends
                           for lid in _lids(a.packet[MAD_OFFSET + 64:MAD_OFFSET + 128], 0)})
            got = notice.announce_loss(prog, DEV, port, 1, lids)
            assert got is not None and sorted(got) == want, (step, port)
            h.a.mark_announced(got)
            recs = kernel.notice_log.read()
            if not want:
                assert not recs and not ref_sends
                continue
            announced += 1
            assert len(recs) == 1 and recs[0].loss and (recs[0].dev, recs[0].port) == (DEV, port)
            rec = recs[0]
            assert not rec.moved and not rec.noted and list(rec.fresh) == want
            assert rec.sent == len(ref_sends)
            events = h.a.lost_in_kernel(rec.port, rec.fresh, rec.sent, rec.t_ns)
            assert [e.kind for e in events] == ["fault_notice_sent"]
            h.assert_same()
        assert announced >= 3, "the tables must leave LIDs with no other way"
        h.failover_config(on=False, generation=100 + seed)
        assert notice.announce_loss(prog, DEV, 1, 1, h.a.lft.lids_to(1) or [1]) is None
    finally:
        h.close()


def test_loss_frame_is_the_agents_notice(kernel: sma.KernelSma) -> None:
    """What a LOSS run sends: the agent's FaultNotice for the same LIDs but its TID and PSN, on
    the agent's last port, CRCs sealed (the run's packet after it is the last clone)."""
    rng = random.Random(9)
    h = Harness(kernel)
    assert kernel.notices is not None and kernel.notice_log is not None
    try:
        h.failover_config(on=True, generation=200)
        h.tables(rng)
        for port in (1, 2, 3, 4, 5):
            ref_sends = [a for a in h.b.announce_port_lost(port) if isinstance(a, Send)]
            lids = h.a.lft.lids_to(port)
            by_block: dict[int, list[int]] = {}
            for lid in lids:
                by_block.setdefault(lid // 512, []).append(lid)
            if not ref_sends or len(by_block) != 1:
                continue
            ctx = bpf.skb_ctx(ifindex=1, cb=(notice.LOSS, DEV, port))
            ret, out, _ns = bpf.test_run(kernel.notices.prog_fd, notice.loss_frame(0, lids), ctx_in=ctx)
            kernel.notice_log.read()
            assert ret == bpf.TC_ACT_SHOT
            last = max(ref_sends, key=lambda a: a.port)
            sent = bytearray(out[14:])
            assert out[:12] == _peer(last.port) + _mac(last.port)
            assert reseal(bytearray(sent)) == bytes(sent), "the onward notice's CRCs"
            sent[MAD_OFFSET + 8:MAD_OFFSET + 16] = last.packet[MAD_OFFSET + 8:MAD_OFFSET + 16]  # TID
            sent[17:20] = last.packet[17:20]  # BTH PSN
            assert reseal(sent) == last.packet
            return
        pytest.fail("no port with LIDs to announce in one block")
    finally:
        h.close()


def test_entered_fd_goes_in_and_back_keeping_the_thread_home_open() -> None:
    """``netns.entered_fd`` (the agent host's way into a switch's namespace at a cut): the
    calling thread is in the namespace inside, home after, also after an error; the home
    descriptor is the thread's own and opened once."""
    import os
    import threading

    from ibemu.kernel import netns

    name, other = f"ibemu-t{os.getpid()}-efd", f"ibemu-t{os.getpid()}-efd2"
    netns.create([name, other])
    fd = netns.open_fd(name)
    try:
        home = os.stat("/proc/thread-self/ns/net").st_ino
        inside = os.stat(netns.NETNS_RUN_DIR / name).st_ino
        second = os.stat(netns.NETNS_RUN_DIR / other).st_ino
        seen: list[int] = []

        def here() -> None:
            seen.append(os.stat("/proc/thread-self/ns/net").st_ino)

        def body() -> None:
            for _ in range(2):
                with netns.entered_fd(fd):
                    here()
                here()
            with pytest.raises(RuntimeError), netns.entered_fd(fd):
                raise RuntimeError("inside")
            here()
            with netns.entered_fd(fd):  # nested, by name: back to where it was
                with netns.entered(other):
                    here()
                here()
            with netns.entered(other):
                with netns.entered_fd(fd):
                    here()
                here()
            here()

        t = threading.Thread(target=body)
        t.start()
        t.join()
        assert seen == [inside, home, inside, home, home, second, inside, inside, second, home]
        assert os.stat("/proc/thread-self/ns/net").st_ino == home
    finally:
        os.close(fd)
        netns.delete([name, other])
    assert not netns.exists(name) and not netns.exists(other)
