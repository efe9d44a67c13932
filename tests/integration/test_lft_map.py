"""The LFT classifier (``ibemu.kernel.lft_map``) against the Python reference, with
BPF_PROG_TEST_RUN (no namespace, no fabric); its maps and programs owned by a fabric."""

from __future__ import annotations

import random
import struct
import subprocess
import time
from pathlib import Path

import pytest

from ibemu.agents.forwarder import Reason
from ibemu.agents.port import PortState
from ibemu.agents.switch import SwitchAgent
from ibemu.cli.main import main
from ibemu.fabric.build import build
from ibemu.fabric.plan import plan_fabric
from ibemu.kernel import bpf, lft_map, netns, ownership
from ibemu.topo import generate
from ibemu.wire import fast

pytestmark = pytest.mark.root

CABLED = {p: 40 + p for p in range(1, 7)}  # port -> ifindex; ports 7 and 8 have no cable
NUM_PORTS = 8
OWN_LID = 3


def _switch() -> SwitchAgent:
    sw = SwitchAgent(node_guid=0x1000, num_ports=NUM_PORTS, link_up=[p in CABLED for p in range(1, 9)])
    for num, port in sw.ports.items():
        if num in CABLED:
            port.state = PortState.ACTIVE
    sw.ports[0].lid = OWN_LID
    sw.forwarder.verify_vcrc = False  # the kernel path does not check it (module docstring)
    return sw


def _random_lft(rng: random.Random, sw: SwitchAgent, prog: lft_map.LftProgram, max_lid: int) -> None:
    """Random blocks and top through the agent's LFT; its effective changes go to the map,
    as the agent host carries out ``LftUpdate``."""
    choices = [*range(1, NUM_PORTS + 1), 0xFF, 0xFF, 0, 17, 254]
    for block in rng.sample(range(max_lid // 64 + 1), k=rng.randint(max_lid // 128 + 1, max_lid // 64 + 1)):
        ports = bytearray(rng.choice(choices) if rng.random() < 0.9 else 0xFF for _ in range(64))
        if block == OWN_LID >> 6:
            ports[OWN_LID & 63] = 0  # every SM routes a switch's own LID to port 0
        prog.apply(sw.lft.set_block(block, bytes(ports)))
    prog.apply(sw.lft.set_top(max_lid if rng.random() < 0.7 else rng.randint(0, max_lid)))


def _frames(rng: random.Random, max_lid: int) -> list[bytes]:
    eth = fast.ethernet_header(b"\x02" * 6, b"\x04" * 6)
    out = []
    for _ in range(300):
        kind = rng.randrange(10)
        dlid = rng.randint(1, max_lid) if rng.random() < 0.6 else rng.choice(
            [rng.randint(0, max_lid + 8), OWN_LID, 0, 0xFFFF, 0xC000, 0xC123, 0xBFFF])
        vl = 15 if rng.random() < 0.3 else rng.randrange(8)
        tmpl = fast.NativeTemplate(slid=rng.randint(1, 400), dlid=dlid, destqp=rng.choice([0, 1, 5]), vl=vl, eth=eth)
        frame = bytearray(tmpl.packet(0x04, rng.randrange(1 << 24), rng.randbytes(rng.choice([0, 4, 100, 256]))))
        if kind == 0:  # truncated or padded: PktLen no longer says the length
            frame = frame[:rng.randint(14, len(frame) - 1)] if rng.random() < 0.5 else frame + rng.randbytes(rng.randint(1, 9))
        elif kind == 1:  # garbled headers
            for _ in range(rng.randint(1, 4)):
                frame[rng.randrange(14, min(len(frame), 30))] = rng.randrange(256)
        elif kind == 2:  # another Ethernet type (not IPv4/IPv6: test runs parse those)
            frame[12:14] = rng.choice([b"\x08\x06", b"\x89\x15", b"\x88\xb6", b"\xb5\x88", rng.randbytes(2)])
        elif kind == 3:  # short: the Ethernet header and a few bytes at most
            frame = frame[:rng.randint(14, 26)]
        elif kind == 4:  # all random
            frame = bytearray(eth + rng.randbytes(rng.randint(0, 60)))
        if frame[12:14] in (b"\x08\x00", b"\x86\xdd"):
            frame[12:14] = b"\x88\xb5"
        out.append(bytes(frame))
    return out


def _reference(sw: SwitchAgent, frame: bytes, ingress: int) -> int:
    """The egress ifindex the kernel must redirect to, 0 for none: the switch agent's
    forwarder (``Forwarder.decide``), with the deviations the module docstring lists."""
    if frame[12:14] != b"\x88\xb5":
        return 0  # not an IB frame: not the LFT's
    verdict = sw.forwarder.decide(frame[14:], ingress, count_traffic=False)
    if verdict.port:
        return CABLED[verdict.port]
    if verdict.reason is Reason.LOOP:
        return CABLED[ingress]  # a hairpin, as mirred did
    return 0


def test_classifier_decides_as_the_python_forwarder() -> None:
    """For random LFTs and frames (routed and unrouted DLIDs, the own LID, VL15, permissive,
    multicast, short, garbled, wrong length, other Ethernet types) the classifier's verdict
    and redirect target are the reference decision; the frame is never changed."""
    rng = random.Random(17)
    seen: dict[str, int] = {"redirect": 0, "unspec": 0}
    for _round in range(12):
        sw = _switch()
        prog = lft_map.LftProgram(CABLED)
        try:
            max_lid = rng.choice([70, 300, 0xBFFF])
            _random_lft(rng, sw, prog, min(max_lid, 2000))
            for frame in _frames(rng, min(max_lid, 2000)):
                ingress = rng.choice(list(CABLED))
                want = _reference(sw, frame, ingress)
                ret, out, _ns = bpf.test_run(prog.prog_fd, frame, ctx=True)
                target = struct.unpack_from("=I", out, len(frame) + 48)[0]
                assert out[:len(frame)] == frame
                if want:
                    assert (ret, target) == (bpf.TC_ACT_REDIRECT, want), (frame.hex(), ingress)
                    seen["redirect"] += 1
                else:
                    assert (ret, target) == (bpf.TC_ACT_UNSPEC, 0), (frame.hex(), ingress)
                    seen["unspec"] += 1
        finally:
            prog.close()
    assert min(seen.values()) > 250, seen  # both verdicts well covered


def test_vl15_goes_on_to_the_kernel_sma_when_flagged() -> None:
    """With ``set_vl15_to_sma`` LID-routed SMPs (VL15) are left to the next filter (the
    kernel SMA forwards them), data frames are redirected as before; cleared, VL15 is too."""
    prog = lft_map.LftProgram(CABLED)
    eth = fast.ethernet_header(b"\x02" * 6, b"\x04" * 6)
    try:
        prog.apply({40: 2})
        smp = fast.NativeTemplate(slid=1, dlid=40, destqp=0, vl=15, eth=eth).packet(0x04, 1, bytes(256))
        data = fast.NativeTemplate(slid=1, dlid=40, destqp=5, vl=0, eth=eth).packet(0x04, 1, bytes(64))
        for flagged in (False, True, False):
            prog.set_vl15_to_sma(flagged)
            assert bpf.test_run(prog.prog_fd, smp)[0] == (bpf.TC_ACT_UNSPEC if flagged else bpf.TC_ACT_REDIRECT)
            assert bpf.test_run(prog.prog_fd, data)[0] == bpf.TC_ACT_REDIRECT
    finally:
        prog.close()


def test_map_holds_what_apply_wrote() -> None:
    prog = lft_map.LftProgram(CABLED)
    try:
        assert prog.apply({5: 2, 7: 1, 300: 1}) == 2  # two 64-entry blocks, one update each
        assert prog.apply({5: 2}) == 0  # nothing changed, nothing written
        assert [prog.read(lid) for lid in (5, 6, 7, 300)] == [2, 0, 1, 1]
        assert prog.apply({5: 0xFF, 7: 0}) == 1 and prog.read(5) == prog.read(7) == 0
        assert prog.installed == {300: 1}
        with pytest.raises(ValueError):
            prog.apply({0xC000: 1})
    finally:
        prog.close()
    with pytest.raises(Exception, match="after close"):
        prog.apply({5: 1})


def _still_there(ids: set[int], timeout_s: float = 5.0) -> set[int]:
    """Which of the maps ``ids`` exist, once freeing (after an RCU grace period) is done. By
    id: other runs on the machine may hold maps of the same names."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = ids & bpf.map_ids().keys()
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def test_maps_and_programs_go_with_the_fabric(state_dir: Path) -> None:
    """A built fabric's switches forward through the classifier; what it loaded is gone when
    the owner is gone and ``ibemu clean`` has removed the namespaces (as after a crash)."""
    topo = generate("fat-tree", k=4)
    state = ownership.RunState(ownership.new_run_id(), scenario="pytest-lftmap")
    plan = plan_fabric(topo, state.run_id)
    fabric = build(plan, state)
    ours: set[int] = set()
    try:
        switches = [n.name for n in topo.switches()]
        assert all(isinstance(fabric.lfts[sw], lft_map.MapLft) for sw in switches)
        ours = {i for sw in switches for i in fabric.lfts[sw].map_ids()}  # type: ignore[attr-defined]
        names = bpf.map_ids()
        assert len(ours) == 5 * len(switches) and sum(names[i] == "ibemu_lft" for i in ours) == len(switches)
        shown = subprocess.run(["tc", "-n", plan.nodes[switches[0]].ns, "filter", "show", "block", "1"],
                               capture_output=True, text=True, check=True).stdout
        assert "ibemu_lft" in shown and "direct-action" in shown and "mirred" not in shown
        fabric.close()  # the owner's descriptors go, as when it dies; the filters hold the maps
        assert ours <= bpf.map_ids().keys()
    finally:
        fabric.close()
        assert main(["clean", state.run_id]) == 0
    assert not any(netns.exists(n) for n in plan.namespaces)
    assert not _still_there(ours)


def _target(prog: lft_map.LftProgram, frame: bytes) -> tuple[int, int]:
    ret, out, _ns = bpf.test_run(prog.prog_fd, frame, ctx=True)
    return ret, struct.unpack_from("=I", out, len(frame) + 48)[0]


def test_local_failover_takes_the_first_alternate_that_is_up() -> None:
    """Primary up -> primary; primary down -> the first alternate up (counted); all down ->
    not forwarded (counted); no alternates -> dropped (counted); an alternates block that
    does not name the LID changes nothing."""
    prog = lft_map.LftProgram(CABLED)
    eth = fast.ethernet_header(b"\x02" * 6, b"\x04" * 6)

    def frame(dlid: int) -> bytes:
        return fast.NativeTemplate(slid=1, dlid=dlid, destqp=5, vl=0, eth=eth).packet(0x04, 1, bytes(64))

    try:
        prog.apply({40: 2, 41: 2, 100: 3})
        assert prog.set_alternates(40, bytes([4, 5, 6, 0]))
        assert not prog.set_alternates(40, bytes([4, 5, 6, 0]))  # unchanged
        assert prog.alternates(40) == (4, 5, 6) and prog.alternates(41) == ()
        assert prog.failover_lids(2) == 1 and prog.failover_lids(3) == 0
        f40, f41, f100 = frame(40), frame(41), frame(100)
        assert _target(prog, f40) == (bpf.TC_ACT_REDIRECT, CABLED[2])  # primary up
        assert prog.set_port_up(2, False)
        assert _target(prog, f40) == (bpf.TC_ACT_REDIRECT, CABLED[4])  # first alternate
        assert _target(prog, f41) == (bpf.TC_ACT_SHOT, 0)  # no alternates: dropped
        assert _target(prog, f100) == (bpf.TC_ACT_REDIRECT, CABLED[3])  # another block
        prog.set_port_up(4, False)
        assert _target(prog, f40) == (bpf.TC_ACT_REDIRECT, CABLED[5])
        prog.set_port_up(5, False)
        prog.set_port_up(6, False)
        assert _target(prog, f40) == (bpf.TC_ACT_UNSPEC, 0)  # all down: not forwarded
        prog.set_port_up(6, True)
        assert _target(prog, f40) == (bpf.TC_ACT_REDIRECT, CABLED[6])
        prog.set_port_up(2, True)
        assert _target(prog, f40) == (bpf.TC_ACT_REDIRECT, CABLED[2])  # primary back
        assert prog.counters() == {"failover": 3, "all_down": 1, "down": 1}
        # an alternate without a cable (port 7) is skipped; a list ends at its first 0
        prog.set_alternates(40, bytes([7, 0, 5, 0]))
        assert prog.alternates(40) == (7,)
        prog.set_port_up(2, False)
        assert _target(prog, f40) == (bpf.TC_ACT_UNSPEC, 0)
        prog.set_alternates(40, bytes(4))  # cleared: as without failover
        assert _target(prog, f40) == (bpf.TC_ACT_SHOT, 0)
        assert not prog.set_port_up(8, False)  # no cable
    finally:
        prog.close()


def test_no_alternates_a_down_port_drops_what_the_python_forwarder_drops() -> None:
    """With ports down and no alternates anywhere the classifier decides as the switch
    agent's forwarder with the same ports down (the random reference run of the first test):
    what it sends to a cabled port that is down (EGRESS_DOWN) is dropped in the kernel and
    counted; the rest as before (an uncabled port: up to the agent, which counts it)."""
    rng = random.Random(5)
    sw = _switch()
    prog = lft_map.LftProgram(CABLED)
    try:
        _random_lft(rng, sw, prog, 300)
        for port in (1, 3):
            prog.set_port_up(port, False)
            sw.link_down(port)
        dropped = 0
        for frame in _frames(rng, 300):
            ingress = rng.choice([p for p in CABLED if p not in (1, 3)])  # the kernel does not check the ingress
            want = _reference(sw, frame, ingress)
            if not want and frame[12:14] == b"\x88\xb5":
                verdict = sw.forwarder.decide(frame[14:], ingress, count_traffic=False)
                dlid = int.from_bytes(frame[16:18], "big")
                if verdict.reason is Reason.EGRESS_DOWN and sw.lft.raw(dlid) in (1, 3):  # (not an uncabled port)
                    dropped += 1
                    assert _target(prog, frame) == (bpf.TC_ACT_SHOT, 0)
                    continue
            assert _target(prog, frame) == ((bpf.TC_ACT_REDIRECT, want) if want else (bpf.TC_ACT_UNSPEC, 0))
        assert dropped > 0 and prog.counters() == {"failover": 0, "all_down": 0, "down": dropped}
    finally:
        prog.close()
