"""Partition enforcement in the kernel's LFT classifier (``ibemu.kernel.lft_map``) against the
Python reference (``Forwarder.decide``), with BPF_PROG_TEST_RUN: for random P_KeyTables and
enforcement bits on the ports and random P_Keys (full, limited, other partitions, 0, raw
packets without a BTH, VL15) the classifier redirects exactly the frames the reference
forwards; what it refuses goes up (TC_ACT_UNSPEC) to the switch agent, whose forwarder drops
and counts it and sends trap 257.

Test runs receive on the loopback device (ifindex 1): port 1, the ingress, is given that
ifindex; the LFT never routes back to it (a hairpin is a deviation of its own)."""

from __future__ import annotations

import random
import struct

import pytest

from ibemu.agents.port import PortState
from ibemu.agents.switch import SwitchAgent
from ibemu.kernel import bpf, lft_map
from ibemu.wire import fast
from ibemu.wire.crc import vcrc_calc

pytestmark = pytest.mark.root

CABLED = {1: 1, **{p: 40 + p for p in range(2, 7)}}
OWN_LID = 3
KEYS = [0xFFFF, 0x7FFF, 0x8001, 0x0001, 0x8002, 0x0002, 0x8003, 0x0000, 0x8000]
TABLES = [[], [0xFFFF], [0xFFFF, 0x8001], [0x7FFF, 0x0001, 0x8002], [0x0002], [0xFFFF, 0x0001, 0x0002, 0x8003]]
FLAGS = [0, 8, 4, 12, 15, 2, 1]


def _switch() -> SwitchAgent:
    sw = SwitchAgent(node_guid=0x2000, num_ports=6, link_up=[True] * 6)
    for num in range(1, 7):
        sw.ports[num].state = PortState.ACTIVE
    sw.ports[0].lid = OWN_LID
    sw.forwarder.verify_vcrc = False  # the kernel path does not check it
    return sw


def _frame(rng: random.Random) -> bytes:
    eth = fast.ethernet_header(b"\x02" * 6, b"\x04" * 6)
    dlid = rng.choice([rng.randint(1, 60), rng.randint(1, 60), OWN_LID])
    if rng.random() < 0.1:  # raw (LNH 0): LRH, payload, VCRC
        body = bytes([rng.choice([0, 0xF0]), 0x00]) + struct.pack("!HHH", dlid, 4, 9) + b"r" * 8
        return eth + body + vcrc_calc(body).to_bytes(2, "little")
    vl = 15 if rng.random() < 0.1 else 0
    tmpl = fast.NativeTemplate(slid=9, dlid=dlid, destqp=0x42, vl=vl, pkey=rng.choice(KEYS), eth=eth)
    return tmpl.packet(0x04, rng.randrange(1 << 24), rng.randbytes(rng.choice([0, 8, 64])))


def test_classifier_enforces_partitions_as_the_python_forwarder() -> None:
    rng = random.Random(5)
    seen = {"redirect": 0, "refused": 0, "unspec_other": 0}
    for _round in range(10):
        sw = _switch()
        prog = lft_map.LftProgram(CABLED)
        try:
            ports = bytearray(rng.choice([2, 3, 4, 5, 6, 0xFF]) for _ in range(64))
            ports[OWN_LID] = 0
            prog.apply(sw.lft.set_block(0, bytes(ports)))
            prog.apply(sw.lft.set_top(63))
            for _ in range(200):
                if rng.random() < 0.1:
                    port = rng.randint(1, 6)
                    flags, table = rng.choice(FLAGS), list(rng.choice(TABLES))
                    sw.ports[port].partition_flags, sw.ports[port].pkeys = flags, table
                    assert prog.set_partition(port, flags, table)
                frame = _frame(rng)
                before = sw.forwarder.stats.copy()
                verdict = sw.forwarder.decide(frame[14:], 1, count_traffic=False)
                ret, out, _ns = bpf.test_run(prog.prog_fd, frame, ctx=True)
                target = struct.unpack_from("=I", out, len(frame) + 48)[0]
                if verdict.port:
                    assert (ret, target) == (bpf.TC_ACT_REDIRECT, CABLED[verdict.port]), frame.hex()
                    seen["redirect"] += 1
                else:
                    assert ret == bpf.TC_ACT_UNSPEC, (frame.hex(), verdict)
                    refused = sw.forwarder.stats - before
                    seen["refused" if refused["pkey_inbound"] or refused["pkey_outbound"] else "unspec_other"] += 1
        finally:
            prog.close()
    assert min(seen.values()) > 50, seen


def test_without_enforcement_nothing_is_looked_at() -> None:
    """Bits cleared on every port: the flag is off and any P_Key is forwarded."""
    prog = lft_map.LftProgram(CABLED)
    eth = fast.ethernet_header(b"\x02" * 6, b"\x04" * 6)
    try:
        prog.apply({40: 2})
        bad = fast.NativeTemplate(slid=1, dlid=40, destqp=5, pkey=0x8009, eth=eth).packet(0x04, 1, bytes(16))
        prog.set_partition(2, lft_map.ENFORCE_OUT, [0xFFFF])
        assert bpf.test_run(prog.prog_fd, bad)[0] == bpf.TC_ACT_UNSPEC
        prog.set_partition(2, 0, [0xFFFF])
        assert bpf.test_run(prog.prog_fd, bad)[0] == bpf.TC_ACT_REDIRECT
        assert not prog.set_partition(9, lft_map.ENFORCE_IN, [])  # no cable there
    finally:
        prog.close()
