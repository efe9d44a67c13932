"""The kernel SMA's directed-route walks (``bpf_src/sma.c``, ``walk``) against a chain of Python
agents, with BPF_PROG_TEST_RUN (no namespace, no fabric).

A small fabric lives in the maps: switches S1, S2 and S3 and a CA, cabled S1:2-S2:1,
S2:2-S3:1, S3:3-CA:1 and S1:3-S3:2, with the requester's HCA on S1:1. Each device has a
kernel-side agent (it publishes its state; its LFT is the kernel's memory) and a reference
agent. A directed-route SMP enters S1 on port 1; the reference carries it from agent to agent,
as the cables would, until it comes back out of S1:1. The kernel must give, in the one program
run, either that very frame (a walk: byte for byte, the LFT Sets applied alike, every cable
crossed counted on both ends) or, where a hop's program would hand the frame up, S1's own
one-hop relay, which the reference's S1 makes. Cases every hop answers in the kernel must be
walks (so a program that never walks fails), and those a hop must refuse must not be.
"""

from __future__ import annotations

import random
import struct
from collections import Counter
from collections.abc import Iterator

import pytest

from ibemu.agents.actions import Send
from ibemu.agents.ca import CaAgent
from ibemu.agents.device import DeviceAgent
from ibemu.agents.port import PortState
from ibemu.agents.switch import SwitchAgent
from ibemu.wire.madpacket import MAD_OFFSET, frame_mad, reseal

pytestmark = pytest.mark.root

bpf = pytest.importorskip("ibemu.kernel.bpf")
from ibemu.kernel import lft_map, sma  # noqa: E402

GET, SET = 1, 2
NUM_PORTS = 8
S1, S2, S3, CA = 1, 2, 3, 4
HOST_MAC = bytes([2, 0, 0, 0, 0, 0x99])
CABLES = {(S1, 2): (S2, 1), (S2, 2): (S3, 1), (S3, 3): (CA, 1), (S1, 3): (S3, 2)}
LINKS = {**CABLES, **{b: a for a, b in CABLES.items()}}
"""(dev, port) -> the (dev, port) its cable reaches; S1:1 reaches the requester."""
IFINDEX_S1_P1 = 1  # test runs arrive on lo (ifindex 1): S1's port 1 is that interface


def _mac(dev: int, port: int) -> bytes:
    return bytes([2, 0, 0, 0, dev, port])


def _ifindex(dev: int, port: int) -> int:
    return IFINDEX_S1_P1 if (dev, port) == (S1, 1) else 100 + 10 * dev + port


def _switch(i: int) -> SwitchAgent:
    used = {p for (d, p) in LINKS if d == i} | ({1} if i == S1 else set())
    sw = SwitchAgent(node_guid=0x0002C90000000100 + i, num_ports=NUM_PORTS, description=f"sw-{i}",
                     link_up=[p in used for p in range(1, NUM_PORTS + 1)], linear_fdb_cap=4096)
    for p in used:
        sw.ports[p].state = PortState.ACTIVE
    sw.ports[0].lid = 10 + i
    sw.lft.set_top(200)
    sw.switch_info.linear_fdb_top = 200
    return sw


def _ca() -> CaAgent:
    ca = CaAgent(node_guid=0x0002C90000001000, num_ports=2, description="h1 HCA-1", link_up=[True, False])
    ca.ports[1].lid = 0x20
    ca.ports[1].state = PortState.ACTIVE
    return ca


def _agents() -> dict[int, DeviceAgent]:
    return {S1: _switch(S1), S2: _switch(S2), S3: _switch(S3), CA: _ca()}


class Fabric:
    """The four devices in the kernel SMA's maps, and their reference agents."""

    def __init__(self, k: sma.KernelSma) -> None:
        self.k = k
        self.a, self.b = _agents(), _agents()
        self.fwd: dict[int, lft_map.LftProgram] = {}
        for dev, agent in self.a.items():
            if isinstance(agent, SwitchAgent):
                slot = dev - 1
                self.fwd[dev] = lft_map.LftProgram({})
                agent.lft.bind(k.lft_view(slot))
                k.add_device(dev, is_switch=True, num_ports=NUM_PORTS, lft_slot=slot,
                             lft_blocks=agent.lft.blocks, fwd_map_fd=self.fwd[dev].blocks.fd)
            else:
                k.add_device(dev, is_switch=False, num_ports=agent.num_ports)
            for p in range(1, agent.num_ports + 1):
                peer = LINKS.get((dev, p))
                peer_mac = HOST_MAC if (dev, p) == (S1, 1) else _mac(*peer) if peer else bytes(6)
                k.add_port(dev, p, _ifindex(dev, p), _mac(dev, p), peer_mac, up=agent.ports[p].link_is_up)
            k.publish(dev, agent.sma_images())

    def close(self) -> None:
        for dev in self.a:
            self.k.forget(dev)
        for prog in self.fwd.values():
            prog.close()

    def reference(self, pkt: bytes) -> bytes | None:
        """What the reference agents send back out of S1:1 for ``pkt`` arriving there (None:
        nothing), carried from agent to agent as the cables would."""
        dev, port = S1, 1
        for _ in range(64):
            sends = [a for a in self.b[dev].receive(port, pkt) if isinstance(a, Send)]
            if not sends:
                return None
            assert len(sends) == 1
            if (dev, sends[0].port) == (S1, 1):  # a response home, or a request to the requester
                return sends[0].packet if sends[0].packet[MAD_OFFSET + 4] & 0x80 else None
            dev, port = LINKS[(dev, sends[0].port)]
            pkt = sends[0].packet
        raise AssertionError("the reference looped")

    def first_hop(self, pkt: bytes) -> Send | None:
        """S1's own verdict (a relay: the frame it sends on), on a copy of its state."""
        sends = [a for a in _switch(S1).receive(1, pkt) if isinstance(a, Send)]
        return sends[0] if sends else None

    def kernel(self, pkt: bytes) -> tuple[int, int, bytes]:
        """(verdict, egress ifindex, frame) of one program run on ``pkt`` arriving on S1:1."""
        frame = _mac(S1, 1) + HOST_MAC + b"\x88\xb5" + pkt
        ret, out, _ns = bpf.test_run(self.k.prog_fd, frame, ctx=True)
        return ret, struct.unpack_from("=I", out, len(frame) + 48)[0], out[:len(frame)]

    def counts(self) -> dict[tuple[int, int], tuple[int, int]]:
        return {(d, p): self.k.walked(d, p) for (d, p) in LINKS}

    def assert_same_state(self) -> None:
        for dev, a in self.a.items():
            b = self.b[dev]
            assert a.sma_images() == b.sma_images()
            if isinstance(a, SwitchAgent) and isinstance(b, SwitchAgent):
                assert all(a.lft.get_block(i) == b.lft.get_block(i) for i in range(b.lft.blocks))
                eff, table = b.lft.effective(), bytes(self.fwd[dev].table)
                assert {lid: table[lid] for lid in range(1, b.lft.cap) if table[lid]} == \
                    {lid: p for lid, p in eff.items() if p != 0}


@pytest.fixture
def fabric() -> Iterator[Fabric]:
    """The four devices on a kernel SMA of their own, with walks (skipped where it cannot load)."""
    path, why = sma.object_path()
    if path is None:
        pytest.skip(f"no eBPF object for the kernel SMA: {why}")
    try:
        k = sma.KernelSma(lft_slots=3, attr_entries=4096, obj_path=path, walk=True)
    except OSError as exc:
        pytest.skip(f"cannot load the kernel SMA here: {exc}")
    f = Fabric(k)
    yield f
    f.close()
    k.close()


def _dr(method: int, attr: int, mod: int, path: list[int], *, tid: int, data: bytes = b"",
        dr_dlid: int = 0xFFFF) -> bytes:
    """A directed-route SMP as the requester's HCA sends it: HopPointer 1, InitialPath[1] its
    own port (1), then ``path``."""
    mad = bytearray(256)
    n = len(path) + 1
    struct.pack_into("!BBBBHBBQHHIQHH", mad, 0, 1, 0x81, 1, method, 0, 1, n, tid, attr, 0, mod, 0,
                     0xFFFF, dr_dlid)
    mad[64:64 + len(data)] = data
    for i, p in enumerate([1, *path], 1):
        mad[128 + i] = p
    return frame_mad(mad, dlid=0xFFFF, slid=0xFFFF, dqp=0, sqp=0, qkey=0, vl=15)


TO_CA = [2, 2, 3]  # S1 -> S2 -> S3 -> the CA


def _walked(f: Fabric, pkt: bytes) -> bytes:
    """``pkt`` must be walked: the reference's answer, out of S1:1."""
    want = f.reference(pkt)
    ret, ifindex, frame = f.kernel(pkt)
    assert want is not None
    assert ret == bpf.TC_ACT_REDIRECT, "an SMP every hop answers in the kernel was not walked"
    assert ifindex == IFINDEX_S1_P1
    assert frame[14:] == want, "the walk's answer differs from the agents'"
    assert frame[:12] == HOST_MAC + _mac(S1, 1)
    return frame


def _relayed(f: Fabric, pkt: bytes) -> None:
    """``pkt`` must not be walked: S1's own one-hop relay."""
    want = f.first_hop(pkt)
    ret, ifindex, frame = f.kernel(pkt)
    assert want is not None and ret == bpf.TC_ACT_REDIRECT
    assert ifindex == _ifindex(S1, want.port), "walked an SMP a hop would have handed up"
    assert frame[14:] == want.packet


def test_walk_answers_every_attribute_as_the_agents_do(fabric: Fabric) -> None:
    tid = 1
    for path in (TO_CA, [2], [2, 2], [3], [3, 3], [3, 1], [2, 2, 1, 1], [3, 1, 1, 2]):
        for attr, mods in ((0x10, [0]), (0x11, [0]), (0x12, [0]), (0x15, [0, 1, 2, 3, 7]),
                           (0x16, [0, 1 << 16]), (0x19, [0, 1, 3])):
            for mod in mods:
                pkt = _dr(GET, attr, mod, path, tid=tid)
                want = fabric.reference(pkt)
                if want is None or want[MAD_OFFSET + 4] & 0x7F or want[MAD_OFFSET + 5]:
                    _relayed(fabric, pkt)  # an error status or silence: the agent's
                else:
                    _walked(fabric, pkt)
                tid += 1
    fabric.assert_same_state()


def test_walk_counts_each_cable_on_both_ends(fabric: Fabric) -> None:
    before = fabric.counts()
    _walked(fabric, _dr(GET, 0x11, 0, TO_CA, tid=7))
    after = fabric.counts()
    moved = {end: (after[end][0] - before[end][0], after[end][1] - before[end][1]) for end in LINKS}
    crossed = {(S1, 2), (S2, 1), (S2, 2), (S3, 1), (S3, 3), (CA, 1)}
    assert moved == {end: (1, 1) if end in crossed else (0, 0) for end in LINKS}


def test_walk_applies_lft_sets_as_the_agents_do(fabric: Fabric) -> None:
    rng = random.Random(17)
    tid = 100
    for i in range(30):
        path = rng.choice([[2], [2, 2], [3], [2, 2, 1], [3, 1]])
        data = bytes(rng.choice([1, 2, 3, 0, 0xFF]) for _ in range(64))
        block = rng.randrange(0, 4)
        _walked(fabric, _dr(SET, 0x19, block, path, tid=tid, data=data))
        _walked(fabric, _dr(GET, 0x19, block, path, tid=tid + 1))
        tid += 2
        if i % 10 == 0:
            fabric.assert_same_state()
    fabric.assert_same_state()


def test_what_a_hop_would_hand_up_is_relayed_one_hop(fabric: Fabric) -> None:
    k = fabric.k
    # an attribute or method the kernel leaves to the agent at the last hop
    _relayed(fabric, _dr(GET, 0x20, 0, TO_CA, tid=1))  # SMInfo
    _relayed(fabric, _dr(SET, 0x15, 1, TO_CA, tid=2, data=bytes(64)))  # PortInfo Set
    _relayed(fabric, _dr(GET, 0x11, 0, TO_CA, tid=3, dr_dlid=0x20))  # a LID-routed tail
    # a path longer than a walk goes (the SMP bounces between S1 and S3)
    _relayed(fabric, _dr(GET, 0x11, 0, [3, 2] * 5, tid=4))
    _walked(fabric, _dr(GET, 0x11, 0, [3, 2, 3, 2], tid=5))
    # a node its agent takes everything of (powered off, SMP loss)
    k.set_enabled(S2, False)
    _relayed(fabric, _dr(GET, 0x11, 0, TO_CA, tid=6))
    _walked(fabric, _dr(GET, 0x11, 0, [3, 3], tid=7))  # around S2
    k.set_enabled(S2, True)
    # a cable without carrier further on, seen from either end
    for end in ((S3, 3), (CA, 1)):
        k.set_carrier(*end, False)
        _relayed(fabric, _dr(GET, 0x11, 0, TO_CA, tid=8))
        k.set_carrier(*end, True)
    _walked(fabric, _dr(GET, 0x11, 0, TO_CA, tid=9))
    # a cable kept on the wire (a capture of it runs): nothing walks across it
    k.keep_on_wire(S2, 2)
    k.keep_on_wire(S3, 1)
    _relayed(fabric, _dr(GET, 0x11, 0, TO_CA, tid=11))
    _walked(fabric, _dr(GET, 0x11, 0, [3, 3], tid=12))
    # a hop beyond the last switch: a CA relays nothing
    _relayed(fabric, _dr(GET, 0x11, 0, [*TO_CA, 1], tid=10))


def test_generated_paths_walk_or_relay_exactly(fabric: Fabric) -> None:
    """Random directed routes through the little fabric (any port, cabled or not, up or not),
    attributes, modifiers and hop counts, and a third with a directed-route field bent (hop
    pointer, hop count, D bit, DrDLID, method): the kernel gives the agents' answer or S1's own
    verdict, and every plain route the agents answer within a walk's reach is walked."""
    rng = random.Random(5)
    verdicts: Counter[str] = Counter()
    for tid in range(1, 600):
        path: list[int] = []
        dev = S1
        for _ in range(rng.randint(1, 10)):
            ports = [p for (d, p) in LINKS if d == dev]
            p = rng.choice(ports) if rng.random() < 0.9 else rng.randint(1, NUM_PORTS)
            path.append(p)
            nxt = LINKS.get((dev, p))
            if nxt is None:
                break
            dev = nxt[0]
        attr = rng.choice((0x10, 0x11, 0x12, 0x15, 0x16, 0x19, 0x20))
        mod = rng.choice((0, 1, 2, 9, 1 << 16))
        pkt = _dr(GET, attr, mod, path, tid=tid)
        if rng.random() < 0.3:  # the directed-route fields bent, the CRCs made good again
            buf = bytearray(pkt)
            field = rng.choice(("hp", "hc", "d", "drdlid", "method"))
            if field == "hp":
                buf[MAD_OFFSET + 6] = rng.randint(0, len(path) + 2)
            elif field == "hc":
                buf[MAD_OFFSET + 7] = rng.choice((0, 1, len(path), len(path) + 2, 63, 64, 255))
            elif field == "d":
                buf[MAD_OFFSET + 4] |= 0x80
            elif field == "drdlid":
                struct.pack_into("!H", buf, MAD_OFFSET + 34, rng.choice((0, 0x20, 0xFFFE)))
            else:
                buf[MAD_OFFSET + 3] = rng.choice((0x81, 5, 0x13))  # (Sets: the LFT test)
            pkt = reseal(buf)
        want = fabric.reference(pkt)
        ret, ifindex, frame = fabric.kernel(pkt)
        if ret == bpf.TC_ACT_REDIRECT and ifindex == IFINDEX_S1_P1 and frame[14 + MAD_OFFSET + 4] & 0x80:
            assert frame[14:] == want
            verdicts["walked"] += 1
            continue
        if ret == bpf.TC_ACT_UNSPEC:  # up to S1's agent, unchanged: it does what it does
            assert frame[14:] == pkt
            verdicts["up"] += 1
            continue
        relay = fabric.first_hop(pkt)
        assert relay is not None and ret == bpf.TC_ACT_REDIRECT and ifindex == _ifindex(S1, relay.port)
        assert frame[14:] == relay.packet
        # not walked: then some hop would have handed it up (or the route is too long)
        answered = want is not None and not (want[MAD_OFFSET + 4] & 0x7F or want[MAD_OFFSET + 5])
        outward = pkt[MAD_OFFSET + 3] == GET and not pkt[MAD_OFFSET + 4] & 0x80 and pkt[MAD_OFFSET + 6] == 1 \
            and pkt[MAD_OFFSET + 7] == len(path) + 1 and pkt[MAD_OFFSET + 34:MAD_OFFSET + 36] == b"\xff\xff"
        assert not (outward and answered and attr != 0x20 and len(path) <= 8), f"not walked: {path} {attr:#x} {mod}"
        verdicts["relayed"] += 1
    assert verdicts["walked"] > 100 and verdicts["relayed"] > 20, verdicts
    fabric.assert_same_state()


def test_walks_turned_off_relay_hop_by_hop(monkeypatch: pytest.MonkeyPatch) -> None:
    """``IBEMU_SMA_WALK=0``: ``sma.load`` gives no port a walk slot, and a port without one
    is crossed hop by hop."""
    if sma.object_path()[0] is None:
        pytest.skip("no clang to build the kernel SMA")
    monkeypatch.setenv(sma.WALK_ENV, "0")
    try:
        k = sma.load(lft_slots=3, attr_entries=4096)
    except OSError as exc:
        pytest.skip(f"cannot load the kernel SMA here: {exc}")
    f = Fabric(k)
    try:
        assert not k.walk
        _relayed(f, _dr(GET, 0x11, 0, TO_CA, tid=1))
        assert set(f.counts().values()) == {(0, 0)}
    finally:
        f.close()
        k.close()


def test_a_kernel_that_refuses_walks_gets_the_program_without_them(monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """``sma.load``: the verifier's refusal of the walking program (as an older kernel's would
    be, simulated here) is said in one line, and the ``-DNO_WALK`` build, compiled for real,
    loads and relays hop by hop."""
    from ibemu.kernel import elf

    real = sma.KernelSma

    def refusing(**kw: object) -> sma.KernelSma:
        if kw.get("walk"):
            raise elf.LoadError(sma.PROG_NAME, "Permission denied", "back-edge from insn 1 to 0")
        return real(**kw)  # type: ignore[arg-type]

    if sma.object_path()[0] is None:
        pytest.skip("no clang to build the kernel SMA")
    monkeypatch.setattr(sma, "KernelSma", refusing)
    monkeypatch.delenv(sma.WALK_ENV, raising=False)
    with caplog.at_level("WARNING", logger="ibemu.kernel.sma"):
        try:
            k = sma.load(lft_slots=3, attr_entries=4096)
        except OSError as exc:
            pytest.skip(f"cannot load the kernel SMA here: {exc}")
    assert [r.getMessage().splitlines()[0] for r in caplog.records] == [
        "directed-route SMPs are relayed hop by hop (no walks): eBPF program ibemu_sma rejected (Permission denied)"]
    f = Fabric(k)
    try:
        assert not k.walk
        _relayed(f, _dr(GET, 0x11, 0, TO_CA, tid=1))
    finally:
        f.close()
        k.close()
