"""The kernel SMA (``ibemu.kernel.sma``, ``bpf_src/sma.c``) against the Python agents, with
BPF_PROG_TEST_RUN (no namespace, no fabric).

Two agents of the same device are built alike: ``kernel_side`` publishes its state to the
maps (its LFT is the kernel's memory) and handles what the program hands up, as the agent
host does; ``reference`` sees every frame. For generated SMPs (every supported attribute and
modifier, directed-route hop counts and pointers both ways, LID-routed, bad fields) the
program's answer must be byte for byte the reference's, or the frame must go up unchanged;
after it all, both agents hold the same state and the forwarding map what the reference's
LFT forwards. Cases marked as the kernel's must be answered there (so a program that hands
everything up fails).
"""

from __future__ import annotations

import random
import struct

import pytest

from ibemu.agents.actions import Event, LftUpdate, Send
from ibemu.agents.ca import CaAgent
from ibemu.agents.device import DeviceAgent
from ibemu.agents.port import PortState
from ibemu.agents.switch import SwitchAgent
from ibemu.wire.madpacket import MAD_OFFSET, frame_mad, reseal

pytestmark = pytest.mark.root

bpf = pytest.importorskip("ibemu.kernel.bpf")
from ibemu.kernel import lft_map, sma  # noqa: E402
from ibemu.kernel.dr_relay import egress_key  # noqa: E402
from ibemu.kernel.sma import egress_value  # noqa: E402

NUM_PORTS = 8
UP = (1, 2, 3, 4, 5, 6)  # ports 7 and 8 have no link
OWN_LID = 3
OUT_BASE = 100  # the out map's ifindex of port p is OUT_BASE + p (skb->cb[0] after a redirect)
GET, SET = 1, 2
ATTRS = (0x10, 0x11, 0x12, 0x15, 0x16, 0x19)


def _mac(dev: int, port: int) -> bytes:
    return bytes([2, 0, 0, 0, dev, port])


def _peer(dev: int, port: int) -> bytes:
    return bytes([6, 0, 0, 0, dev, port])


def load_kernel_sma() -> sma.KernelSma:
    """The kernel SMA with one switch slot, for BPF_PROG_TEST_RUN (skipped where it cannot
    load); the caller closes it."""
    path, why = sma.object_path()
    if path is None:
        pytest.skip(f"no eBPF object for the kernel SMA: {why}")
    try:
        return sma.KernelSma(lft_slots=1, attr_entries=4096, obj_path=path)
    except OSError as exc:
        pytest.skip(f"cannot load the kernel SMA here: {exc}")


@pytest.fixture(scope="module")
def kernel() -> sma.KernelSma:
    k = load_kernel_sma()
    yield k
    k.close()


def _switch() -> SwitchAgent:
    sw = SwitchAgent(node_guid=0x0002C90000000100, num_ports=NUM_PORTS, description="leaf-1",
                     link_up=[p in UP for p in range(1, NUM_PORTS + 1)], linear_fdb_cap=4096)
    for p in UP[:4]:
        sw.ports[p].state = PortState.ACTIVE
    sw.ports[0].lid = OWN_LID
    sw.ports[0].master_sm_lid = 1
    first = bytearray(b"\xff" * 64)
    first[1], first[2], first[OWN_LID] = 1, 2, 0
    sw.lft.set_block(0, bytes(first))
    sw.lft.set_top(200)
    sw.switch_info.linear_fdb_top = 200
    return sw


def _ca() -> CaAgent:
    ca = CaAgent(node_guid=0x0002C90000001000, num_ports=2, description="h0 HCA-1", link_up=[True, True])
    ca.ports[1].lid, ca.ports[2].lid = 0x20, 0x24
    ca.ports[2].lmc = 2
    ca.ports[1].state = PortState.ACTIVE
    return ca


class Harness:
    """One device on the kernel SMA: a kernel-side agent and a reference agent."""

    def __init__(self, k: sma.KernelSma, dev: int, kernel_side: DeviceAgent, reference: DeviceAgent) -> None:
        self.k, self.dev, self.a, self.b = k, dev, kernel_side, reference
        self.fwd: lft_map.LftProgram | None = None
        is_switch = isinstance(kernel_side, SwitchAgent)
        if isinstance(kernel_side, SwitchAgent):
            self.fwd = lft_map.LftProgram({})
            self.fwd.apply(kernel_side.lft.effective())
            kernel_side.lft.bind(k.lft_view(0))
            k.add_device(dev, is_switch=True, num_ports=kernel_side.num_ports, lft_slot=0,
                         lft_blocks=kernel_side.lft.blocks, fwd_map_fd=self.fwd.blocks.fd)
        else:
            k.add_device(dev, is_switch=False, num_ports=kernel_side.num_ports)
        for p in range(1, kernel_side.num_ports + 1):
            k.add_port(dev, p, 1, _mac(dev, p), _peer(dev, p), up=True)  # test runs: ifindex 1 (lo)
            k.out.update(egress_key(dev, p), egress_value(OUT_BASE + p, True, _peer(dev, p), _mac(dev, p)))
        self.publish()
        self.answered = 0
        self.passed = 0
        self.lft_sets = 0
        self.kernel_lft_sets = 0
        assert is_switch == kernel_side.IS_SWITCH

    def publish(self) -> None:
        self.k.publish(self.dev, self.a.sma_images())

    def close(self) -> None:
        self.k.forget(self.dev)
        if self.fwd is not None:
            self.fwd.close()

    def run(self, port: int, pkt: bytes, *, expect: bool | None = None) -> None:
        """``pkt`` arrives on ``port``: the kernel's verdict against the reference's."""
        frame = _mac(self.dev, port) + _peer(self.dev, port) + b"\x88\xb5" + pkt
        ret, out, _ns = bpf.test_run(self.k.prog_fd, frame, ctx=True)
        data, ctx = out[: len(frame)], out[len(frame):]
        ref_actions = self.b.receive(port, pkt)
        ref = [a for a in ref_actions if isinstance(a, Send)]
        # the LFT Sets the kernel did are logged as the agent logs them (its ring buffer)
        logged = [(r.dev, r.block, r.changed) for r in self.k.lft_log.read()] if self.k.lft_log else []
        self.kernel_lft_sets += len(logged)
        if ret == bpf.TC_ACT_REDIRECT:
            self.answered += 1
            egress = struct.unpack_from("=I", ctx, 48)[0] - OUT_BASE
            assert len(ref) == 1, f"the kernel answered what the agent does not: {ref}"
            assert (egress, data[14:]) == (ref[0].port, ref[0].packet)
            assert data[:12] == _peer(self.dev, egress) + _mac(self.dev, egress)
            assert expect is not False, "the kernel answered a frame that is the agent's"
        else:
            self.passed += 1
            assert ret == bpf.TC_ACT_UNSPEC
            assert data == frame, "a frame handed up must be unchanged"
            assert expect is not True, f"the kernel handed up a frame it answers: {pkt[MAD_OFFSET:MAD_OFFSET + 24].hex()}"
            for action in self.a.receive(port, pkt):  # the agent host's socket gets it
                if isinstance(action, LftUpdate) and self.fwd is not None:
                    self.fwd.apply(action.changes)
                if isinstance(action, Event) and action.kind == "lft_set":
                    logged.append((self.dev, action.fields["block"], action.fields["changed"]))
            self.publish()
        assert logged == [(self.dev, a.fields["block"], a.fields["changed"]) for a in ref_actions
                          if isinstance(a, Event) and a.kind == "lft_set"]
        self.lft_sets += len(logged)

    def assert_same_state(self) -> None:
        assert self.a.sma_images() == self.b.sma_images()
        if isinstance(self.a, SwitchAgent) and isinstance(self.b, SwitchAgent):
            lft_a, lft_b = self.a.lft, self.b.lft
            assert lft_a.top == lft_b.top
            assert all(lft_a.get_block(i) == lft_b.get_block(i) for i in range(lft_b.blocks))
            assert self.fwd is not None
            eff = lft_b.effective()
            table = bytes(self.fwd.table)
            assert {lid: table[lid] for lid in range(1, lft_b.cap) if table[lid]} == \
                {lid: p for lid, p in eff.items() if p != 0}


def _mad(method: int, cls: int, attr: int, mod: int, *, tid: int, data: bytes = b"",
         hp: int = 0, hc: int = 0, back: bool = False, path: list[int] | None = None,
         rpath: dict[int, int] | None = None, dr_slid: int = 0xFFFF, dr_dlid: int = 0xFFFF,
         base: int = 1, ver: int = 1, mkey: int = 0) -> bytearray:
    mad = bytearray(256)
    struct.pack_into("!BBBBHBBQHHIQHH", mad, 0, base, cls, ver, method, 0x8000 if back else 0,
                     hp, hc, tid, attr, 0, mod, mkey, dr_slid if cls == 0x81 else 0,
                     dr_dlid if cls == 0x81 else 0)
    mad[64:64 + len(data)] = data
    for i, p in enumerate(path or [], 1):
        mad[128 + i] = p
    for i, p in (rpath or {}).items():
        mad[192 + i] = p
    return mad


def _dr(method: int, attr: int, mod: int, *, tid: int, n: int, hp: int | None = None, back: bool = False,
        path: list[int] | None = None, data: bytes = b"", **kw: int) -> bytes:
    mad = _mad(method, 0x81, attr, mod, tid=tid, data=data, hp=n if hp is None else hp, hc=n, back=back,
               path=path or [1] * n, **kw)
    return frame_mad(mad, dlid=0xFFFF, slid=0xFFFF, dqp=0, sqp=0, qkey=0, vl=15)


def _lr(method: int, attr: int, mod: int, *, tid: int, dlid: int, slid: int, data: bytes = b"", **kw: int) -> bytes:
    mad = _mad(method, 0x01, attr, mod, tid=tid, data=data, **kw)
    return frame_mad(mad, dlid=dlid, slid=slid, dqp=0, sqp=0, qkey=0, vl=15)


def _mods(h: Harness, attr: int) -> list[tuple[int, bool | None]]:
    """(modifier, the kernel's?) for one attribute of the device."""
    sw = h.a.IS_SWITCH
    if attr == 0x15:
        nums = range(0, NUM_PORTS + 1) if sw else range(0, 3)
        return [(m, True) for m in nums] + [(0x80000001, True), (0x100, False), (NUM_PORTS + 3, False)]
    if attr == 0x16:
        if sw:
            return [(p << 16, True) for p in range(NUM_PORTS + 1)] + [((1 << 16) | 1, False), (99 << 16, False)]
        return [(b, True) for b in range(4)] + [(4, False), ((7 << 16) | 1, True)]
    if attr == 0x19:
        if not sw:
            return [(0, False)]
        return [(m, True) for m in (0, 1, 2, 31, 63)] + [(64, False), (1 << 20, False)]
    if attr == 0x12:
        return [(0, sw), (5, sw)]
    return [(0, True), (7, True)]


def _drive(h: Harness, rng: random.Random) -> None:
    tid = 1
    ports_up = [p for p in range(1, h.a.num_ports + 1) if h.a.ports[p].link_is_up]
    for attr in ATTRS:
        for mod, mine in _mods(h, attr):
            for n in (1, 2, 5, 63):
                port = rng.choice(ports_up)
                h.run(port, _dr(GET, attr, mod, tid=tid, n=n), expect=mine)
                tid += 1
            if mine is not None:
                dlid = h.a.ports[0].lid if h.a.IS_SWITCH else h.a.ports[1].lid
                h.run(1, _lr(GET, attr, mod, tid=tid, dlid=dlid, slid=1), expect=mine)
                tid += 1
    # LFT Sets, directed-route and LID-routed, then Gets of what they wrote
    if h.a.IS_SWITCH:
        for i in range(40):
            block = rng.randrange(1, 64)  # block 0 keeps the route to the SM (LID 1)
            data = bytes(rng.choice([1, 2, 3, 4, 7, 0, 0xFF, 0xFF]) for _ in range(64))
            if i % 3 == 0:
                h.run(2, _lr(SET, 0x19, block, tid=tid, dlid=OWN_LID, slid=1, data=data), expect=True)
            else:
                h.run(rng.choice(ports_up), _dr(SET, 0x19, block, tid=tid, n=rng.randint(1, 6), data=data), expect=True)
            h.run(1, _dr(GET, 0x19, block, tid=tid + 1, n=1), expect=True)
            tid += 2
            if i == 20:  # a SwitchInfo Set (the agent's) moves LinearFDBTop
                si = bytearray(h.a.sma_images()[(0x12, 0)])
                struct.pack_into("!H", si, 6, 40 * 64 + 17)
                h.run(1, _dr(SET, 0x12, 0, tid=tid, n=2, data=bytes(si)), expect=False)
                tid += 1
        # the SM's own LID now routes through port 1 (LID-routed responses go by the LFT)
        blk = bytearray(h.a.lft.get_block(0))
        blk[1], blk[5], blk[6], blk[9] = 1, 7, 0xFF, 3
        h.run(1, _dr(SET, 0x19, 0, tid=tid, n=1, data=bytes(blk)), expect=True)
        for slid, mine in ((1, True), (5, False), (6, False), (9, True), (0, False), (OWN_LID, False), (0xFFFF, False)):
            h.run(2, _lr(GET, 0x11, 0, tid=tid, dlid=OWN_LID, slid=slid), expect=mine)
            tid += 1
        # an LFT Set that moves the route back to its requester is answered by the new route
        # (the agent routes its response after the handler), or handed up when it removes it
        blk = bytearray(h.a.lft.get_block(0))
        for port, mine in ((3, True), (0xFF, False), (1, True)):
            blk[1] = port
            h.run(2, _lr(SET, 0x19, 0, tid=tid, dlid=OWN_LID, slid=1, data=bytes(blk)), expect=mine)
            tid += 1
        # LIDs beyond one byte
        blk4 = bytearray(h.a.lft.get_block(4))
        blk4[300 & 63], blk4[301 & 63] = 4, 7
        h.run(1, _dr(SET, 0x19, 4, tid=tid, n=1, data=bytes(blk4)), expect=True)
        for dlid, slid, mine in ((OWN_LID, 300, True), (300, 1, True), (OWN_LID, 301, False), (301, 1, False)):
            h.run(2, _lr(GET, 0x11, 0, tid=tid, dlid=dlid, slid=slid), expect=mine)
            tid += 1
        # LID-routed to another node: forwarded by the LFT, unchanged but for the MACs (both
        # classes: a directed route's LID-routed head too); not for a loop, a port down, no route
        for dlid, mine in ((1, True), (9, True), (2, False), (5, False), (6, False), (3000, False), (0xC001, False)):
            h.run(2, _lr(GET, 0x11, 0, tid=tid, dlid=dlid, slid=7), expect=mine)
            h.run(2, frame_mad(_mad(GET, 0x81, 0x11, 0, tid=tid, hc=2, path=[1, 2], dr_slid=7),
                               dlid=dlid, slid=7, dqp=0, sqp=0, qkey=0, vl=15), expect=mine)
            tid += 1
        # relays, both ways
        for hp, path, mine in ((1, [1, 2, 3], True), (2, [1, 4, 5, 3], True), (1, [1, 7, 3], False),
                               (1, [1, 0, 3], False), (1, [1, 9, 3], False), (1, [1, 8], False)):
            h.run(3, _dr(GET, 0x11, 0, tid=tid, n=len(path), hp=hp, path=path), expect=mine)
            tid += 1
        for hp, rp, mine in ((3, {1: 2, 2: 4}, True), (2, {1: 5}, True), (2, {1: 7}, False), (1, {}, False),
                             (4, {1: 1, 2: 2, 3: 3}, False)):
            h.run(3, _dr(GET, 0x11, 0, tid=tid, n=3, hp=hp, back=True, rpath=rp), expect=mine)
            tid += 1
    else:
        h.run(1, _dr(GET, 0x11, 0, tid=tid, n=3, hp=1, path=[1, 2, 3]), expect=False)  # a CA never relays
        h.run(2, _lr(GET, 0x15, 0, tid=tid, dlid=0x26, slid=1), expect=True)  # LMC 2: 0x24..0x27
        h.run(2, _lr(GET, 0x15, 0, tid=tid, dlid=0x28, slid=1), expect=False)  # a CA forwards nothing
        tid += 1
    # what stays with the agent
    bad: list[tuple[int, bytes]] = [
        (1, _dr(GET, 0x11, 0, tid=tid, n=1, ver=2)),
        (1, _dr(GET, 0x11, 0, tid=tid, n=1, base=2)),
        (1, _dr(3, 0x11, 0, tid=tid, n=1)), (1, _dr(5, 0x11, 0, tid=tid, n=1)),
        (1, _dr(7, 0x02, 0, tid=tid, n=1)), (1, _dr(0x81, 0x11, 0, tid=tid, n=1)),
        (1, _dr(GET, 0x11, 0, tid=tid, n=64)), (1, _dr(GET, 0x11, 0, tid=tid, n=0, hp=0)),
        (1, _dr(GET, 0x11, 0, tid=tid, n=2, hp=3)), (1, _dr(GET, 0x11, 0, tid=tid, n=2, hp=0)),
        (1, _dr(GET, 0x11, 0, tid=tid, n=1, dr_dlid=7)),
        (1, _dr(GET, 0x20, 0, tid=tid, n=1)), (1, _dr(GET, 0x17, 0, tid=tid, n=1)),
        (1, _dr(SET, 0x15, 1, tid=tid, n=1, data=bytes(64))),
        (7, _dr(GET, 0x11, 0, tid=tid, n=1)),  # a port whose link is down
    ]
    good = bytearray(_dr(GET, 0x11, 0, tid=tid, n=1))
    for i in (0, 20, 30, 100, 283, 284, 288, 289):
        corrupt = bytearray(good)
        corrupt[i] ^= 0x10
        bad.append((1, bytes(corrupt)))
    bad.append((1, bytes(good[:200])))  # truncated
    bad.append((1, bytes(good) + b"\0\0\0\0"))  # too long
    vl0 = bytearray(good)
    vl0[0] &= 0x0F
    bad.append((1, reseal(vl0)))
    for port, pkt in bad:
        h.run(port, pkt, expect=False)
    # random fuzz: flip header fields and reseal; both sides must agree
    for _ in range(300):
        pkt = bytearray(_dr(GET, rng.choice(ATTRS), rng.choice([0, 1, 2, 1 << 16]), tid=tid,
                            n=rng.randint(1, 4), path=[rng.randint(0, 9) for _ in range(4)]))
        for _ in range(rng.randint(1, 3)):
            i = rng.choice([MAD_OFFSET + j for j in (0, 1, 2, 3, 4, 6, 7, 17, 23, 33, 35, 129, 130)] + [2, 3, 6, 7])
            pkt[i] = rng.choice([0, 1, 2, 3, 0x81, 0xFF, pkt[i] ^ 1])
        h.run(rng.choice(ports_up), reseal(pkt))
        tid += 1
    h.assert_same_state()


def test_switch_sma_matches_the_agent(kernel: sma.KernelSma) -> None:
    h = Harness(kernel, 1, _switch(), _switch())
    try:
        _drive(h, random.Random(17))
        assert h.answered > 150 and h.passed > 50 and h.lft_sets > 10 and h.kernel_lft_sets > 5
    finally:
        h.close()


def test_ca_sma_matches_the_agent(kernel: sma.KernelSma) -> None:
    h = Harness(kernel, 2, _ca(), _ca())
    try:
        _drive(h, random.Random(18))
        assert h.answered > 50 and h.passed > 30
    finally:
        h.close()


def test_disabled_node_hands_everything_up(kernel: sma.KernelSma) -> None:
    h = Harness(kernel, 3, _switch(), _switch())
    try:
        h.run(1, _dr(GET, 0x11, 0, tid=1, n=1), expect=True)
        kernel.set_enabled(3, False)
        h.run(1, _dr(GET, 0x11, 0, tid=2, n=1), expect=False)
        kernel.set_enabled(3, True)
        kernel.set_carrier(3, 1, False)  # the ingress cable lost carrier: the agent decides
        h.run(1, _dr(GET, 0x11, 0, tid=3, n=1), expect=False)
        kernel.set_carrier(3, 1, True)
    finally:
        h.close()


def test_relay_deltas_are_the_crcs_change() -> None:
    """``sma_rdelta``, every slot and value: a packet's CRCs after the byte's change are its
    CRCs before it XOR the entry (a random packet, not the zeros the table was made from)."""
    rng = random.Random(33)
    deltas = sma.relay_deltas()
    pkt = bytearray(rng.randbytes(290))
    pkt[0] |= 0xF0
    before = reseal(bytearray(pkt))
    ic0, vc0 = int.from_bytes(before[-6:-2], "little"), int.from_bytes(before[-2:], "little")
    for slot, off in enumerate(sma.RELAY_BYTES):
        for x in range(256):
            changed = bytearray(pkt)
            changed[off] ^= x
            after = reseal(changed)
            ic, vc = deltas[slot << 8 | x]
            assert (ic0 ^ ic, vc0 ^ vc) == (int.from_bytes(after[-6:-2], "little"),
                                            int.from_bytes(after[-2:], "little")), (slot, x)


def test_kernel_holds_the_relay_deltas(kernel: sma.KernelSma) -> None:
    """What the program reads is the table proven above, every entry."""
    assert kernel.loaded is not None
    rdelta = kernel.loaded.maps["sma_rdelta"]
    want = sma.relay_deltas()
    assert rdelta.max_entries == len(want)
    for i, (ic, vc) in enumerate(want):
        assert rdelta.lookup(struct.pack("=I", i)) == struct.pack("=II", ic, vc), i


def _relay(rng: random.Random, tid: int) -> tuple[int, bytes]:
    """A directed-route SMP at an intermediate hop of this switch, either way, with a random
    path, hop pointer, ReturnPath bytes already there and SLID: (ingress, packet)."""
    n = rng.randint(2, 63)
    path = [rng.choice((1, 2, 3, 4, 5, 6, 6, 7)) for _ in range(n)]
    rpath = {i: rng.randrange(256) for i in range(64) if rng.random() < 0.5}
    slid = rng.choice((0xFFFF, 0xFFFF, 1, rng.randrange(0x10000)))
    back = rng.random() < 0.5
    hp = rng.randint(2, n) if back else rng.randint(1, n - 1)
    if back:
        rpath[hp - 1] = rng.choice((1, 2, 3, 4, 5, 6, 6, 7))
    mad = _mad(GET if rng.random() < 0.7 else 0x81, 0x81, rng.choice(ATTRS), rng.randrange(3), tid=tid,
               hp=hp, hc=n, back=back, path=path, rpath=rpath, data=rng.randbytes(64))
    return rng.choice(UP), frame_mad(mad, dlid=0xFFFF, slid=slid, dqp=0, sqp=0, qkey=0, vl=15)


def test_relays_match_the_agent_and_corrupt_ones_go_up(kernel: sma.KernelSma) -> None:
    """Generated relays (paths, hop pointers, ReturnPath bytes, SLIDs; both ways): the
    kernel's patched CRCs are the agent's resealed ones, byte for byte. The same relays with a
    byte or bit flipped anywhere (CRCs not resealed) go up unchanged, and the agent counts
    each in PortRcvErrors."""
    h = Harness(kernel, 4, _switch(), _switch())
    rng = random.Random(1733)
    try:
        for tid in range(1, 1500):
            port, pkt = _relay(rng, tid)
            h.run(port, pkt)
        assert h.answered > 900, h.answered
        answered, errors = h.answered, sum(h.a.ports[p].counters.port_rcv_errors for p in UP)
        for tid in range(1500, 1900):
            port, pkt = _relay(rng, tid)
            bad = bytearray(pkt)
            bad[rng.randrange(len(bad))] ^= 1 << rng.randrange(8)
            h.run(port, bytes(bad), expect=False)
        assert h.answered == answered
        assert sum(h.a.ports[p].counters.port_rcv_errors for p in UP) - errors == 400
        h.assert_same_state()
    finally:
        h.close()


def test_ca_hands_a_corrupt_getresp_up(kernel: sma.KernelSma) -> None:
    """A CA port takes no CRC pass for a GetResp it hands up (the agent checks): a good one
    and a corrupted one both go up unchanged, and the agent counts the second."""
    h = Harness(kernel, 5, _ca(), _ca())
    try:
        resp = _dr(0x81, 0x11, 0, tid=1, n=2, hp=1, back=True)
        h.run(1, resp, expect=False)
        bad = bytearray(resp)
        bad[100] ^= 4
        h.run(1, bytes(bad), expect=False)
        assert h.a.ports[1].counters.port_rcv_errors == 1
    finally:
        h.close()


KEY = 0x0123456789ABCDEF
BAD = 0x00000000DEADBEEF


def _keyed(make: type[SwitchAgent] | type[CaAgent], clock: object, protect: int, lease_s: int) -> DeviceAgent:
    """A device of ``_switch``/``_ca`` whose M_Key port (a switch's port 0, the CA's port 1)
    holds KEY at ``protect`` with a ``lease_s`` lease; time from the shared ``clock``."""
    agent: DeviceAgent = _switch() if make is SwitchAgent else _ca()
    agent.clock = clock  # type: ignore[assignment]
    p = agent.ports[0 if agent.IS_SWITCH else 1]
    p.m_key, p.m_key_protect, p.m_key_lease_period = KEY, protect, lease_s
    p.master_sm_lid = 1
    return agent


@pytest.mark.parametrize("protect", [0, 1, 2, 3])
@pytest.mark.parametrize("kind", ["switch", "ca"])
def test_keyed_sma_matches_the_agent(kernel: sma.KernelSma, kind: str, protect: int) -> None:
    """With an M_Key the kernel answers only SMPs carrying it (and no lease running); every
    other one goes up unchanged and the agent answers, hides the key or drops it as the
    reference does. A violation starts the lease: from then on everything goes up until a
    valid key stops it; when the lease runs out the protect bits clear in both."""
    from ibemu.testing.wiring import ManualClock

    make = SwitchAgent if kind == "switch" else CaAgent
    clock = ManualClock()
    dev = 10 + protect + (4 if kind == "ca" else 0)
    h = Harness(kernel, dev, _keyed(make, clock, protect, 5), _keyed(make, clock, protect, 5))
    sw = kind == "switch"
    own = OWN_LID if sw else 0x20
    lft = [(0x19, 2)] if sw else []
    try:
        tid = 1
        for key, mine in ((KEY, True), (BAD, False), (0, False)):
            for attr, mod in ((0x11, 0), (0x15, 0), (0x15, 1), (0x10, 0), *lft):
                h.run(1, _dr(GET, attr, mod, tid=tid, n=2, mkey=key), expect=mine)
                h.run(1, _lr(GET, attr, mod, tid=tid + 1, dlid=own, slid=1, mkey=key), expect=mine)
                tid += 2
        # Gets with a bad key: answered by the agent below level 2 (the key hidden at 1)
        assert h.b.stats["mkey_get_open"] == (0 if protect >= 2 else 2 * (4 + len(lft)) * 2)
        gets_refused = 0 if protect < 2 else 2 * 2 * (4 + len(lft))
        assert h.b.ports[0 if sw else 1].m_key_violations == gets_refused
        if sw:  # an LFT Set with a bad key: up, dropped, counted; the LFT unchanged
            before = h.b.lft.get_block(2)
            h.run(1, _dr(SET, 0x19, 2, tid=tid, n=1, data=bytes([4]) * 64, mkey=BAD), expect=False)
            assert h.b.lft.get_block(2) == before
            tid += 1
        else:  # a CA port without a key answers any key in the kernel
            h.run(2, _dr(GET, 0x11, 0, tid=tid, n=1, mkey=BAD), expect=True)
            h.run(1, _dr(SET, 0x15, 1, tid=tid + 1, n=1, data=h.b.port_info(1), mkey=BAD), expect=False)
            tid += 2
        mport = h.b.ports[0 if sw else 1]
        assert mport.m_key_violations >= 1 and mport.m_key_lease_deadline  # a Set violated: lease runs
        h.run(1, _dr(GET, 0x11, 0, tid=tid, n=1, mkey=KEY), expect=False)  # the agent stops the lease
        assert not mport.m_key_lease_deadline
        h.run(1, _dr(GET, 0x11, 0, tid=tid + 1, n=1, mkey=KEY), expect=True)  # the kernel's again
        h.run(1, _dr(GET, 0x11, 0, tid=tid + 2, n=1, mkey=BAD), expect=False)
        tid += 3
        if sw and protect < 2:  # (at 2 and 3 the Get above started the lease again)
            h.run(1, _dr(SET, 0x19, 2, tid=tid, n=1, data=bytes([4]) * 64, mkey=KEY), expect=True)
            assert h.b.lft.get_block(2) == bytes([4]) * 64
            tid += 1
        if protect >= 2:  # the lease runs out: protect bits 0, M_Key kept, in both
            clock.advance(6 * 1_000_000_000)
            h.a.tick()
            h.b.tick()
            h.publish()
            assert mport.m_key_protect == 0 and mport.m_key == KEY
            h.run(1, _dr(GET, 0x15, 0, tid=tid, n=1, mkey=BAD), expect=False)  # level 0: the agent
            assert h.b.stats["mkey_get_open"] == 1
            h.run(1, _dr(GET, 0x15, 0, tid=tid + 1, n=1, mkey=KEY), expect=True)
        h.assert_same_state()
    finally:
        h.close()


def test_publish_many_writes_every_changed_image_in_one_call(kernel: sma.KernelSma) -> None:
    """``publish_many`` (the agent host's republish of a batch) writes the images that changed
    for several devices with one batch update, the rest not at all; a map without batch
    updates gets them one by one, with the same result."""
    dev_a, dev_b = 9001, 9002
    images = {(0x15, p): bytes([p]) * 64 for p in (1, 2, 3)}
    assert kernel.publish_many([(dev_a, images), (dev_b, {(0x12, 0): b"\x07" * 64})]) == 4
    assert kernel.publish_many([(dev_a, images)]) == 0  # nothing changed: no write
    assert kernel.publish_many([(dev_a, {**images, (0x15, 2): b"\x22" * 64})]) == 1
    key = struct.Struct("=III")
    assert kernel.attr.lookup(key.pack(dev_a, 0x15, 1)) == b"\x01" * 64
    assert kernel.attr.lookup(key.pack(dev_a, 0x15, 2)) == b"\x22" * 64
    assert kernel.attr.lookup(key.pack(dev_b, 0x12, 0)) == b"\x07" * 64
    m = bpf.Map(bpf.BPF_MAP_TYPE_HASH, 4, 4, 16, "ibemu_test_many")
    try:
        items = [(struct.pack("=I", i), struct.pack("=I", 100 + i)) for i in range(8)]
        m.update_many(items)
        assert [m.lookup(k) for k, _v in items] == [v for _k, v in items]
        m._no_batch = True  # a kernel without BPF_MAP_UPDATE_BATCH
        m.update_many([(k, struct.pack("=I", 7)) for k, _v in items])
        assert {m.lookup(k) for k, _v in items} == {struct.pack("=I", 7)}
    finally:
        m.close()
    for dev in (dev_a, dev_b):
        kernel.forget(dev)
