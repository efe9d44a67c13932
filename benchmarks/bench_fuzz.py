#!/usr/bin/env python3
"""Fuzz campaign: malformed frames, MADs, datagrams and files against every input surface.

Each surface's sans-IO engine is driven in-process with mutations of valid inputs (seeded,
reproducible: ``--seed``, ``--surface``, ``--n``): single bit flips, truncations, extensions,
wrong CRCs (frames left unsealed), and field-aware mutations of the LRH, BTH, DETH and MAD
headers (versions, class, method, status, attribute ids and modifiers, M_Key, directed-route
hop pointers and counts out of range, initial and return paths, DR SLID/DLID, P_Key, QPs),
which are then resealed (good CRCs) so that they reach the layers behind the CRC checks.

Per surface it prints: inputs tried; crashes (an exception escaping the engine, or caught by
the engine's own last-resort guard: ``internal_error``); hangs (an input that took longer than
``--bound-ms``); link-bad inputs (a CRC that cannot verify, a length that cannot match) and how
many of them the port counted where a real port counts them (PortRcvErrors for the agents and
the forwarder, the HCA's CRC/malformed counters, the RoCE layer's); and for the other inputs
how many were accounted for: answered, forwarded, acted on, or counted in a port counter or a
drop statistic (never dropped without a trace). The loaders (scenario files, ibnetdiscover
files) must refuse every bad input with a located ConfigError (``file:line`` or a key path)
and raise nothing else. The kernel SMA (eBPF, BPF_PROG_TEST_RUN, needs root and clang's
object) is compared with the Python agent on the same mutated SMPs: every frame it answers
must be answered byte for byte the same by the agent (``differs`` must be 0).

Run: .venv/bin/python benchmarks/bench_fuzz.py [--n 100000] [--seed 1] [--surface NAME ...]
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import struct
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ibemu.agents.actions import Event, Send
from ibemu.agents.ca import CaAgent
from ibemu.agents.device import DeviceAgent
from ibemu.agents.port import PortState
from ibemu.agents.switch import SwitchAgent
from ibemu.errors import ConfigError
from ibemu.testing.fuzz import Mutator
from ibemu.wire import madcodec as mb
from ibemu.wire.madpacket import frame_mad

REPO = Path(__file__).resolve().parents[1]
GET, SET, TRAP_REPRESS = 1, 2, 7


@dataclass
class Result:
    surface: str
    tried: int = 0
    crashes: int = 0
    internal: int = 0
    hangs: int = 0
    link_bad: int = 0
    link_bad_counted: int = 0
    other: int = 0
    accounted: int = 0
    extra: dict[str, int] = field(default_factory=dict)
    first_crash: str = ""
    seconds: float = 0.0
    worst_ms: float = 0.0

    def crash(self, what: str, exc: BaseException) -> None:
        self.crashes += 1
        if not self.first_crash:
            self.first_crash = f"{what}: {exc!r}"[:300]


def timed(res: Result, bound_s: float, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, timed: longer than ``bound_s`` is a hang."""
    t0 = time.perf_counter()
    try:
        return fn(*args)
    finally:
        dt = time.perf_counter() - t0
        res.worst_ms = max(res.worst_ms, dt * 1e3)
        if dt > bound_s:
            res.hangs += 1


# ------------------------------------------------------------------------------ agents


def _switch() -> SwitchAgent:
    sw = SwitchAgent(node_guid=0x11, num_ports=4, link_up=[True] * 4)
    sw.ports[0].lid = 7
    for p in (1, 2, 3):
        sw.ports[p].state = PortState.ACTIVE
    block = bytearray(b"\xff" * 64)
    block[1], block[3], block[5], block[9] = 1, 1, 2, 3
    sw.lft.set_block(0, block)
    sw.lft.set_top(63)
    sw.ports[0].master_sm_lid = 1
    return sw


def _ca() -> CaAgent:
    ca = CaAgent(node_guid=0x22, num_ports=2, link_up=[True, True])
    ca.ports[1].lid = 9
    ca.ports[1].state = PortState.ACTIVE
    ca.ports[1].master_sm_lid = 1
    ca.set_is_sm(1, True)
    return ca


def _smp(mad: bytes | bytearray, *, dlid: int = 0xFFFF, slid: int = 0xFFFF) -> bytes:
    return frame_mad(mad, dlid=dlid, slid=slid, dqp=0, sqp=0, vl=15, qkey=0)


def _gmp(mad: bytes, *, dlid: int, slid: int = 1) -> bytes:
    return frame_mad(mad, dlid=dlid, slid=slid, dqp=1, sqp=1, vl=0, qkey=0x80010000)


def _dr(method: int, attr: int, *, path: list[int], hp: int, mod: int = 0, data: bytes = b"",
        back: bool = False, rpath: dict[int, int] | None = None) -> bytes:
    mad = bytearray(mb.dr_smp(method, attr, path=path, modifier=mod, data=data))
    mad[6] = hp
    if back:
        mad[4] |= 0x80
    for i, p in (rpath or {}).items():
        mad[192 + i] = p
    return _smp(mad)


def smp_corpus(switch: bool) -> list[tuple[int, bytes]]:
    """(ingress port, valid frame) the agent answers, relays, forwards or acts on."""
    out: list[tuple[int, bytes]] = []
    attrs = (0x10, 0x11, 0x12, 0x15, 0x16, 0x19, 0x20, 0x14) if switch else (0x10, 0x11, 0x15, 0x16, 0x20)
    own = 7 if switch else 9
    for attr in attrs:
        for mod in (0, 1, 2):
            out.append((1, _dr(GET, attr, path=[1], hp=1, mod=mod)))
            out.append((1, _smp(mb.lr_smp(GET, attr, modifier=mod), dlid=own, slid=1)))
    out.append((1, _dr(SET, 0x15, path=[1], hp=1, mod=1, data=bytes(64))))
    out.append((1, _dr(SET, 0x16, path=[1], hp=1, data=b"\xff\xff" + bytes(62))))
    out.append((1, _dr(TRAP_REPRESS, 0x02, path=[1], hp=1)))
    if switch:
        out.append((1, _dr(SET, 0x19, path=[1], hp=1, mod=0, data=bytes([0xFF, 1, 2, 1] + [3] * 60))))
        out.append((1, _dr(SET, 0x12, path=[1], hp=1, data=bytes(64))))
        out.append((1, _dr(GET, 0x11, path=[1, 2, 3], hp=1)))  # relayed onwards through port 2
        out.append((2, _dr(GET, 0x11, path=[1, 2, 3], hp=3, back=True, rpath={1: 1, 2: 1})))  # and back
        out.append((1, _smp(mb.lr_smp(GET, 0x11), dlid=9, slid=1)))  # LID-routed, forwarded
        out.append((2, _smp(mb.lr_smp(GET, 0x11), dlid=1, slid=5)))
    return out


def pma_corpus(own: int) -> list[tuple[int, bytes]]:
    out = []
    for attr, data in ((0x0001, b""), (0x0012, mb.port_counters_select(1)), (0x0012, mb.port_counters_select(0xFF)),
                       (0x001D, mb.port_counters_select(1)), (0x0016, b""), (0x0017, b"")):
        out.append((1, _gmp(mb.pma(GET, attr, data=data), dlid=own)))
    out.append((1, _gmp(mb.pma(SET, 0x0012, data=mb.port_counters_select(1, 0xFFFF)), dlid=own)))
    return out


def agent_fuzz(name: str, make: Callable[[], DeviceAgent], corpus: list[tuple[int, bytes]], n: int,
               rng: random.Random, bound_s: float, reset_every: int = 2000) -> Result:
    res = Result(name)
    mut = Mutator(rng)
    agent = make()
    for i in range(n):
        if i % reset_every == 0:
            agent = make()  # a fuzzed Set may set an M_Key or take a port down: start afresh
        port, base = rng.choice(corpus)
        frame, link_bad, what = mut.mutate(base)
        c = agent.counters(port)
        rcv0 = c.port_rcv_errors
        stats0 = sum(agent.stats.values())
        internal0 = agent.stats["internal_error"]
        res.tried += 1
        try:
            acts = timed(res, bound_s, agent.receive, port, frame)
        except Exception as exc:
            res.crash(f"{what} {frame.hex()}", exc)
            continue
        res.internal += agent.stats["internal_error"] - internal0
        if agent.stats["internal_error"] != internal0 and not res.first_crash:
            res.first_crash = f"internal error on {what} {frame.hex()}"
        if link_bad:
            res.link_bad += 1
            res.link_bad_counted += agent.counters(port).port_rcv_errors == rcv0 + 1
        else:
            res.other += 1
            res.accounted += bool(acts) or sum(agent.stats.values()) != stats0
        for a in acts:
            if isinstance(a, Send):
                res.extra["sent"] = res.extra.get("sent", 0) + 1
            elif isinstance(a, Event):
                pass
    for t in (10**9, 10**10, 10**11):  # what timers the inputs armed (trap repeats, leases) run too
        try:
            agent.tick(t)
        except Exception as exc:
            res.crash("tick", exc)
    return res


# ------------------------------------------------------------------------------ forwarder


def forwarder_fuzz(n: int, rng: random.Random, bound_s: float) -> Result:
    """``Forwarder.decide`` (the reference) and ``forward_run`` (its fast twin) on mutated data
    and management frames; the two must agree on every frame."""
    from ibemu.agents.forwarder import ENFORCE_IN, ENFORCE_OUT
    from ibemu.wire import fast

    res = Result("user datapath forwarder")
    mut = Mutator(rng)

    def make() -> SwitchAgent:
        sw = _switch()
        sw.ports[3].partition_flags, sw.ports[3].pkeys = ENFORCE_IN | ENFORCE_OUT, [0xFFFF, 0x8001]
        sw.alternates[0] = bytes([0] * 12 + [2, 3, 0, 0] + [0] * 48)  # LID 3: alternates 2, 3
        return sw

    sw_ref, sw_fast = make(), make()
    corpus = [fast.NativeTemplate(slid=5, dlid=d, destqp=0x100, pkey=pk).packet(op, 1, bytes(size), ext=bytes(ext))
              for d in (1, 3, 5, 9, 7, 0xC001, 0xFFFF, 0, 40) for pk in (0xFFFF, 0x8001, 0x0002)
              for op, size, ext in ((0x04, 64, 0), (0x0A, 256, 16), (0x11, 0, 4))] + [p for _, p in smp_corpus(True)[:6]]
    diffs = 0
    for i in range(n):
        if i % 5000 == 0:
            sw_ref, sw_fast = make(), make()
        port = rng.choice((1, 2, 3))
        frame, link_bad, what = mut.mutate(rng.choice(corpus))
        rcv0 = sw_ref.counters(port).port_rcv_errors
        stats0 = sum(sw_ref.forwarder.stats.values())
        res.tried += 1
        try:
            v = timed(res, bound_s, sw_ref.forwarder.decide, frame, port)
        except Exception as exc:
            res.crash(f"decide {what} {frame.hex()}", exc)
            continue
        try:
            eth = bytes(14)
            out: dict[int, list[bytes]] = {}
            got = timed(res, bound_s, sw_fast.forwarder.forward_run, [eth + frame], 0, port, 14, out)
            if got == 0:
                sw_fast.forwarder.decide(frame, port)
            elif not (v.port in out and out[v.port] == [eth + frame]):
                diffs += 1
        except Exception as exc:
            res.crash(f"forward_run {what} {frame.hex()}", exc)
            continue
        if link_bad:
            res.link_bad += 1
            res.link_bad_counted += sw_ref.counters(port).port_rcv_errors == rcv0 + 1
        else:
            res.other += 1
            res.accounted += v.port > 0 or (v.reason is not None and (
                v.reason == "to_sma" or sum(sw_ref.forwarder.stats.values()) != stats0
                or sw_ref.counters(port).port_rcv_errors != rcv0))
    names = type(sw_ref.counters(1)).NAMES
    for p in (1, 2, 3):  # the fast twin left the same counters
        for name in names:
            if getattr(sw_ref.counters(p), name) != getattr(sw_fast.counters(p), name):
                diffs += 1
    res.extra["decide/forward_run differ"] = diffs
    return res


# ------------------------------------------------------------------------------ MAD socket


class _Backend:
    """The MAD socket's port: a CA agent's answers for the control queries, MADs counted."""

    node_guid = 0x22
    gid_prefix = 0xFE80000000000000
    node_name = "h0"

    def __init__(self) -> None:
        self.ca = _ca()
        self.sent = 0

    def node_info(self) -> bytes:
        return self.ca.sma_images()[(0x11, 0)]

    def port_info(self, port: int) -> bytes:
        return self.ca.sma_images()[(0x15, 1)]

    def pkeys(self) -> bytes:
        return bytes(64)

    def port_lid_state(self) -> tuple[int, int]:
        return 9, 4

    def vendor(self) -> tuple[int, int, int, int]:
        return 0x02C9, 0x1017, 0, 0

    def set_issm(self, on: bool) -> None:
        self.ca.set_is_sm(1, on)

    def send_mad(self, req: Any) -> None:
        self.sent += 1
        # as the fabric would: the MAD framed and handed to the CA's port
        self.ca.receive(1, frame_mad(req.mad, dlid=req.dlid or 0xFFFF, slid=req.slid or 9, dqp=req.dqp & 0xFFFFFF,
                                     sqp=req.sqp & 0xFFFFFF, qkey=0 if req.dqp == 0 else 0x80010000,
                                     vl=15 if req.dqp == 0 else 0))


def umad_fuzz(n: int, rng: random.Random, bound_s: float) -> Result:
    from ibemu.wire.umad import CTL_LEN, SIM_MAGIC, CtlType, SimRequest, UmadSession

    res = Result("MAD socket server (ibsim protocol)")
    sender = b"\0sim:ctl4242\0"

    def ctl(kind: int, clientid: int = 0, data: bytes = b"") -> bytes:
        return struct.pack("<IIII64s", SIM_MAGIC, clientid, kind, len(data), data)

    connect = ctl(CtlType.CONNECT, 0, struct.pack("<III32s", 4242, 0, 0, b"\0sim:in4242"))
    ctls = [connect] + [ctl(k, 0) for k in (2, 3, 4, 5, 6, 7, 8, 10)] + [ctl(9, 0, b"\1"), ctl(9, 0, b"\0")]
    mads = [SimRequest(0xFFFF, 0, 0, 0, mb.dr_smp(GET, a, path=[])).pack() for a in (0x11, 0x15, 0x10)] + \
           [SimRequest(9, 9, 1, 1, mb.pma(GET, 0x12, data=mb.port_counters_select(1))).pack(),
            SimRequest(1, 0, 1, 1, bytes([1, 3, 2, 0x12]) + bytes(252)).pack(),
            SimRequest(0xFFFF, 0, 0, 0, bytes([1, 0x81, 1, 0x81]) + bytes(252)).pack()]
    req_fields = ((0, 2), (4, 2), (8, 4), (12, 4), (16, 4), (24, 8), (32, 1), (33, 1), (34, 1), (35, 1),
                  (36, 2), (38, 1), (39, 1), (48, 2), (52, 4))
    ctl_fields = ((0, 4), (4, 4), (8, 4), (12, 4), (16, 4), (20, 4), (24, 8))
    ident = bytes  # datagrams carry no CRCs: nothing to reseal
    mut_req = Mutator(rng, req_fields, lambda b: ident(b))
    mut_ctl = Mutator(rng, ctl_fields, lambda b: ident(b))
    backend = _Backend()
    session = UmadSession(backend)
    session.on_ctl(connect, sender)
    for i in range(n):
        if i % 3000 == 0:
            backend = _Backend()
            session = UmadSession(backend)
            session.on_ctl(connect, sender)
        res.tried += 1
        stats0 = sum(session.stats.values())
        sent0 = backend.sent
        if rng.random() < 0.4:
            dgram, bad, what = mut_ctl.mutate(rng.choice(ctls))
            try:
                out = timed(res, bound_s, session.on_ctl, dgram, sender)
            except Exception as exc:
                res.crash(f"ctl {what} {dgram.hex()}", exc)
                continue
            bad = len(dgram) != CTL_LEN
            ok = out.reply is not None and len(out.reply) == CTL_LEN  # every control message is answered
            if bad:
                res.link_bad += 1
                res.link_bad_counted += ok and sum(session.stats.values()) == stats0 + 1
            else:
                res.other += 1
                res.accounted += ok
        else:
            dgram, _bad, what = mut_req.mutate(rng.choice(mads))
            slot = rng.choice((0, 0, 0, 1, 9))
            try:
                back = timed(res, bound_s, session.on_data, slot, dgram)
            except Exception as exc:
                res.crash(f"data {what} {dgram.hex()}", exc)
                continue
            if len(dgram) != 288 or slot != 0:
                res.link_bad += 1
                res.link_bad_counted += sum(session.stats.values()) == stats0 + 1 and back is None
            else:
                res.other += 1
                res.accounted += back is not None or backend.sent != sent0 or sum(session.stats.values()) != stats0
        internal = backend.ca.stats["internal_error"]
        if internal:
            res.internal += internal
            backend.ca.stats["internal_error"] = 0
    return res


# ------------------------------------------------------------------------------ transport


def transport_fuzz(n: int, rng: random.Random, bound_s: float) -> Result:
    """``Hca.receive`` (RC and UD QPs) on mutations of the packets a real exchange carried."""
    from ibemu.hca.transport.actions import Send as TSend
    from ibemu.testing.loopback import exchanged_pair

    res = Result("RC/UD transport (Hca)")
    try:
        pair = exchanged_pair()
    except Exception as exc:  # the harness itself: say so instead of a figure
        res.crash("setting up the pair", exc)
        return res
    a, b, corpus = pair.a, pair.b, pair.corpus
    tfields = ((0, 1), (1, 1), (2, 2), (6, 2), (8, 1), (9, 1), (10, 2), (13, 3), (16, 1), (17, 3),
               (20, 4), (24, 4), (28, 4), (32, 4))
    mut = Mutator(rng, tfields)
    for i in range(n):
        if i % 2000 == 0:
            pair = exchanged_pair()
            a, b = pair.a, pair.b
        res.tried += 1
        pkt = rng.choice(corpus)
        frame, link_bad, what = mut.mutate(pkt)
        dst = b if (pkt[2] << 8 | pkt[3]) == 2 else a
        st = dst.stats
        before = (st.malformed, st.crc_errors, st.dlid_mismatch, st.unknown_qp, st.pkey_violations, st.qkey_violations)
        try:
            out = timed(res, bound_s, dst.receive, frame)
            for act in out:
                assert isinstance(act, TSend)
        except Exception as exc:
            res.crash(f"{what} {frame.hex()}", exc)
            continue
        after = (st.malformed, st.crc_errors, st.dlid_mismatch, st.unknown_qp, st.pkey_violations, st.qkey_violations)
        if link_bad:
            res.link_bad += 1
            res.link_bad_counted += after[0] + after[1] == before[0] + before[1] + 1
        else:
            res.other += 1
            res.accounted += bool(out) or after != before
        if rng.random() < 0.01:
            try:
                dst.tick(10**12 * (i + 1))
            except Exception as exc:
                res.crash("tick", exc)
    return res


# ------------------------------------------------------------------------------ RoCEv2


def roce_fuzz(n: int, rng: random.Random, bound_s: float) -> Result:
    from ibemu.wire import fast
    from ibemu.wire.rocecodec import RoceCodec

    res = Result("RoCEv2 codec")
    lid_ips = {1: "198.18.0.1", 2: "198.18.0.2"}
    tx = RoceCodec(lid=1, ip="198.18.0.1", lid_ips=lid_ips, mac=b"\x02" * 6, peer_mac=b"\x04" * 6)
    rx = RoceCodec(lid=2, ip="198.18.0.2", lid_ips=lid_ips, mac=b"\x04" * 6, peer_mac=b"\x02" * 6)
    corpus = []
    for op, size, ext in ((0x04, 0, 0), (0x04, 256, 0), (0x0A, 1024, 16), (0x11, 0, 4), (0x00, 4096, 0)):
        pkt = fast.NativeTemplate(slid=1, dlid=2, destqp=0x100, pkey=0xFFFF).packet(op, 1, bytes(size), ext=bytes(ext))
        frame = tx.encapsulate(pkt)
        if frame is not None:
            corpus.append(bytes(frame))

    def ip_seal(buf: bytearray) -> bytes:  # fields mutated, checksum and ICRC left: what a bad NIC sends
        return bytes(buf)

    rfields = ((12, 2), (14, 1), (15, 1), (16, 2), (18, 2), (20, 2), (22, 1), (23, 1), (24, 2), (26, 4), (30, 4),
               (34, 2), (36, 2), (38, 2), (40, 2), (42, 1), (43, 1), (44, 2), (47, 3))
    mut = Mutator(rng, rfields, ip_seal)
    for _ in range(n):
        res.tried += 1
        base = rng.choice(corpus)
        frame, _link_bad, what = mut.mutate(base)  # reclassified below: RoCE has no LRH or VCRC
        st = rx.stats
        before = (st.rx_malformed, st.rx_bad_icrc, st.rx_unknown_source, st.rx_not_ours)
        try:
            pkt = timed(res, bound_s, rx.decapsulate, frame)
        except Exception as exc:
            res.crash(f"{what} {frame.hex()}", exc)
            continue
        after = (st.rx_malformed, st.rx_bad_icrc, st.rx_unknown_source, st.rx_not_ours)
        counted = sum(after) == sum(before) + 1
        if pkt is not None and counted:
            res.extra["decoded and counted"] = res.extra.get("decoded and counted", 0) + 1
        if what in ("bit flip", "bad CRC"):
            at = next((j for j in range(len(frame)) if frame[j] != base[j]), 0)
            if at < 12 or at in (40, 41, 46):  # MACs (a veth frame has no FCS), the UDP checksum
                what = "fields"                # (ignored) and BTH resv8a: nothing checks them
        elif what in ("extended", "PktLen"):  # bytes past the IP total length are Ethernet padding;
            what = "fields"                   # "PktLen" moved MAC bytes here (no LRH)
        if what == "fields":
            # Field mutations are not resealed here; a mutated field the ICRC covers is link-bad,
            # one it masks (TOS, TTL, checksums) decodes: both are fine when accounted for.
            res.other += 1
            res.accounted += counted or pkt is not None
            if pkt is not None and _ip_checksum_bad(frame):
                res.extra["bad IPv4 checksum accepted"] = res.extra.get("bad IPv4 checksum accepted", 0) + 1
        else:
            res.link_bad += 1
            res.link_bad_counted += counted and pkt is None
            if pkt is not None and not counted:
                res.extra["link-bad decoded"] = res.extra.get("link-bad decoded", 0) + 1
    return res


def _ip_checksum_bad(frame: bytes) -> bool:
    if len(frame) < 34:
        return False
    s = sum(struct.unpack("!10H", frame[14:34]))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return s != 0xFFFF


# ------------------------------------------------------------------------------ loaders


def text_mutations(rng: random.Random, text: str, tokens: list[str]) -> Iterator[str]:
    lines = text.splitlines(keepends=True)
    while True:
        k = rng.random()
        ls = list(lines)
        if k < 0.2:
            del ls[rng.randrange(len(ls))]
        elif k < 0.35:
            i = rng.randrange(len(ls))
            ls.insert(i, ls[rng.randrange(len(ls))])
        elif k < 0.65:  # a token replaced by another (wrong type, unknown key, bad value)
            i = rng.randrange(len(ls))
            words = ls[i].replace(",", " , ").replace(":", " : ").replace("{", " { ").replace("}", " } ") \
                .replace("[", " [ ").replace("]", " ] ").split(" ")
            j = rng.randrange(len(words))
            words[j] = rng.choice(tokens)
            ls[i] = " ".join(words)
        elif k < 0.8:  # bytes flipped
            s = bytearray("".join(ls).encode())
            for _ in range(rng.randint(1, 4)):
                s[rng.randrange(len(s))] = rng.randrange(32, 127)
            yield s.decode(errors="replace")
            continue
        elif k < 0.9:
            s = "".join(ls)
            yield s[: rng.randrange(len(s))]
            continue
        else:
            i = rng.randrange(len(ls))
            ls[i] = ls[i][: rng.randrange(len(ls[i]) + 1)] + rng.choice(tokens) + "\n"
        yield "".join(ls)


def _located(exc: ConfigError) -> bool:
    return bool(exc.where) or ":" in str(exc).split(" ")[0]


def file_fuzz(res: Result, n: int, rng: random.Random, bound_s: float, texts: list[str], tokens: list[str],
              load: Callable[[str], Any]) -> Result:
    """``load`` on ``n`` mutations of ``texts``: a ConfigError must say where; anything else
    raised is a crash, a file taking over ``bound_s`` a hang."""
    gens = [text_mutations(rng, t, tokens) for t in texts]
    for i in range(n):
        text = next(gens[i % len(gens)])
        res.tried += 1
        t0 = time.perf_counter()
        try:
            load(text)
            res.extra["accepted"] = res.extra.get("accepted", 0) + 1
        except ConfigError as exc:
            res.link_bad += 1
            res.link_bad_counted += _located(exc)
            if not _located(exc):
                res.extra["unlocated"] = res.extra.get("unlocated", 0) + 1
                if not res.first_crash:
                    res.first_crash = f"unlocated: {exc}"[:300]
        except Exception as exc:  # RecursionError included
            res.crash(repr(text[:400]), exc)
        dt = time.perf_counter() - t0
        res.worst_ms = max(res.worst_ms, dt * 1e3)
        res.hangs += dt > bound_s
    return res


def loader_fuzz(n: int, rng: random.Random, bound_s: float) -> Result:
    from ibemu.scenario.loader import loads_scenario

    texts = [p.read_text() for p in sorted((REPO / "scenarios").glob("*.yaml"))]
    tokens = ["-1", "0", "1e309", "nan", "999999999999", "0x10000", '""', "[]", "{}", "null", "true", "~",
              "h99", "leaf9:99", "agg0_0:4", "fat-tree", "k", "8", "100G", "7x HDR", "1MiB", "-3 s", "at_s",
              "link_down", "sm", "engine", "bogus_key", "- ", ":", "{", "[", "'", '"', "&a", "*a", "!!python/object",
              "\t", "\0", "é", "partitions", "members", "ALL", "0x7fff", "m_key", "m_key_protect", "5",
              "datapath", "user", "roce", "dilation", "auto", "0.0", "duration_s", "inf"]
    return file_fuzz(Result("scenario loader"), n, rng, bound_s, texts, tokens,
                     lambda text: loads_scenario(text, source="fuzz.yaml", base_dir=REPO / "scenarios"))


def ibnd_fuzz(n: int, rng: random.Random, bound_s: float) -> Result:
    from ibemu.topo import generators
    from ibemu.topo.ibnetdiscover import dumps, loads

    texts = [(REPO / "scenarios" / "small-cluster.ibnd").read_text(),
             dumps(generators.generate("fat-tree", {"k": 4}))]
    tokens = ["Switch", "Ca", "Rt", "36", "0", "-1", "99999", "\"S-0002c90300000001\"", "\"H-0\"", "[1]", "[0]",
              "[99]", "[1](2)", "#", "\"", "lid", "4xHDR", "4xQDR", "12xEDR", "(", ")", "sysimgguid=0x1",
              "switchguid=0x2(3)", "caguid=0x", "vendid=", "base port 0", "enhanced port 0", "lmc 7", "\t", "\0"]
    return file_fuzz(Result("ibnetdiscover reader"), n, rng, bound_s, texts, tokens,
                     lambda text: loads(text, source="fuzz.ibnd"))


# ------------------------------------------------------------------------------ kernel SMA


def kernel_sma_fuzz(n: int, rng: random.Random, bound_s: float) -> Result:
    """The kernel SMA (BPF_PROG_TEST_RUN) against a reference agent on mutated SMPs: a frame the
    kernel answers must be answered identically by the agent; a frame it hands up must be
    unchanged (the agent then handles it, as the agent host would)."""
    res = Result("kernel SMA (eBPF) vs agent")
    try:
        from ibemu.kernel import bpf, lft_map, sma
        from ibemu.kernel.dr_relay import egress_key
        from ibemu.kernel.sma import egress_value
    except Exception as exc:  # not on Linux with bpf(): say so
        res.extra["skipped"] = 1
        res.first_crash = f"skipped: {exc}"
        return res
    path, why = sma.object_path()
    if path is None or os.geteuid() != 0:
        res.extra["skipped"] = 1
        res.first_crash = f"skipped: {why or 'needs root'}"
        return res
    k = sma.KernelSma(lft_slots=1, attr_entries=4096, obj_path=path)
    out_base = 100

    def mac(dev: int, p: int) -> bytes:
        return bytes([2, 0, 0, 0, dev, p])

    def peer(dev: int, p: int) -> bytes:
        return bytes([6, 0, 0, 0, dev, p])

    class Side:
        def __init__(self, dev: int, make: Callable[[], DeviceAgent]) -> None:
            self.dev, self.make = dev, make
            self.fwd: Any = None
            self.reset()

        def reset(self) -> None:
            if self.fwd is not None:
                self.fwd.close()
                k.forget(self.dev)
            self.a, self.b = self.make(), self.make()
            self.fwd = None
            if isinstance(self.a, SwitchAgent):
                self.fwd = lft_map.LftProgram({})
                self.fwd.apply(self.a.lft.effective())
                self.a.lft.bind(k.lft_view(0))
                k.add_device(self.dev, is_switch=True, num_ports=self.a.num_ports, lft_slot=0,
                             lft_blocks=self.a.lft.blocks, fwd_map_fd=self.fwd.blocks.fd)
            else:
                k.add_device(self.dev, is_switch=False, num_ports=self.a.num_ports)
            for p in range(1, self.a.num_ports + 1):
                k.add_port(self.dev, p, 1, mac(self.dev, p), peer(self.dev, p), up=True)
                k.out.update(egress_key(self.dev, p), egress_value(out_base + p, True, peer(self.dev, p),
                                                                   mac(self.dev, p)))
            k.publish(self.dev, self.a.sma_images())

    sides = [(Side(1, _switch), smp_corpus(True)), (Side(2, _ca), smp_corpus(False))]
    mut = Mutator(rng)
    differs = answered = handed_up = 0
    try:
        for i in range(n):
            side, corpus = sides[i % 2]
            if i % 4000 < 2:
                side.reset()
            port, base = rng.choice(corpus)
            pkt, _bad, what = mut.mutate(base)
            res.tried += 1
            frame = mac(side.dev, port) + peer(side.dev, port) + b"\x88\xb5" + pkt
            try:
                ret, out, _ns = timed(res, bound_s, functools.partial(bpf.test_run, ctx=True), k.prog_fd, frame)
            except Exception as exc:
                res.crash(f"test_run {what} {pkt.hex()}", exc)
                continue
            if k.lft_log:
                k.lft_log.read()
            ref = [x for x in side.b.receive(port, pkt) if isinstance(x, Send)]
            data, ctx = out[: len(frame)], out[len(frame):]
            if ret == bpf.TC_ACT_REDIRECT:
                answered += 1
                egress = struct.unpack_from("=I", ctx, 48)[0] - out_base
                if len(ref) != 1 or (egress, data[14:]) != (ref[0].port, ref[0].packet):
                    differs += 1
                    if not res.first_crash:
                        res.first_crash = f"differs on {what}: {pkt.hex()}"
            else:
                handed_up += 1
                if data != frame:
                    differs += 1
                for action in side.a.receive(port, pkt):
                    if hasattr(action, "changes") and side.fwd is not None:
                        side.fwd.apply(action.changes)
                k.publish(side.dev, side.a.sma_images())
            res.other += 1
            res.accounted += 1
    finally:
        for side, _ in sides:
            if side.fwd is not None:
                side.fwd.close()
        k.close()
    res.extra.update({"kernel answered": answered, "handed up": handed_up, "differs": differs})
    return res


# ------------------------------------------------------------------------------ main


SURFACES: dict[str, Callable[[int, random.Random, float], Result]] = {
    "switch": lambda n, r, b: agent_fuzz("switch agent (SMA)", _switch, smp_corpus(True), n, r, b),
    "ca": lambda n, r, b: agent_fuzz("CA agent (SMA)", _ca, smp_corpus(False), n, r, b),
    "pma": lambda n, r, b: agent_fuzz("PMA (switch and CA)", lambda: _switch() if r.random() < 0.5 else _ca(),
                                      pma_corpus(7) + pma_corpus(9), n, r, b),
    "umad": umad_fuzz,
    "transport": transport_fuzz,
    "roce": roce_fuzz,
    "forwarder": forwarder_fuzz,
    "loader": loader_fuzz,
    "ibnd": ibnd_fuzz,
    "kernel-sma": kernel_sma_fuzz,
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000, help="inputs per surface")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--surface", action="append", choices=list(SURFACES), help="only these (repeatable)")
    ap.add_argument("--bound-ms", type=float, default=1000.0, help="a frame taking longer is a hang")
    ap.add_argument("--file-bound-s", type=float, default=2.0,
                    help="a scenario or ibnetdiscover file taking longer is a hang (a file builds a topology)")
    args = ap.parse_args()
    import logging
    logging.disable(logging.CRITICAL)  # the agents log every drop; millions of lines are not the point
    print(f"fuzz campaign: {args.n:,} inputs per surface, seed {args.seed}, bound {args.bound_ms:g} ms a frame, "
          f"{args.file_bound_s:g} s a file; "
          f"load {os.getloadavg()[0]:.2f}")
    results = []
    for name in args.surface or list(SURFACES):
        t0 = time.perf_counter()
        bound = args.file_bound_s if name in ("loader", "ibnd") else args.bound_ms / 1e3
        res = SURFACES[name](args.n, random.Random(f"{args.seed}:{name}"), bound)
        res.seconds = time.perf_counter() - t0
        results.append(res)
        extra = ", ".join(f"{k} {v:,}" for k, v in res.extra.items())
        print(f"{res.surface:36s} tried {res.tried:>8,}  crashes {res.crashes + res.internal:>3}  hangs {res.hangs:>2}  "
              f"bad {res.link_bad:>7,} counted {res.link_bad_counted:>7,}  other {res.other:>7,} accounted "
              f"{res.accounted:>7,}  worst {res.worst_ms:6.1f} ms  {res.seconds:5.1f} s"
              + (f"  [{extra}]" if extra else ""), flush=True)
        if res.first_crash:
            print(f"    first finding: {res.first_crash}")
    bad = sum(r.crashes + r.internal + r.hangs + (r.link_bad - r.link_bad_counted) for r in results)
    bad += sum(r.extra.get("differs", 0) + r.extra.get("decide/forward_run differ", 0) for r in results)
    print(f"load after {os.getloadavg()[0]:.2f}; RESULT: " + ("0 crashes, 0 hangs, every bad input counted"
                                                              if not bad else f"{bad} findings"))
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
