"""The SM's own port (``ibemu.sm.directport``): what it frames, what it takes, what it drops."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
import trio

from ibemu import clock
from ibemu.kernel import packet, sockfilter
from ibemu.sm import directport
from ibemu.sm.directport import TID_TAG, DirectPort
from ibemu.wire import madcodec as mb
from ibemu.wire.madpacket import INITIAL_PATH, M_HOP_POINTER, MAD_OFFSET, check, frame_mad
from ibemu.wire.umad import SimRequest

PEER, OWN = bytes.fromhex("020000000002"), bytes.fromhex("020000000001")
ETH = PEER + OWN + b"\x88\xb5"
NODE_INFO, PORT_INFO, LFT = 0x0011, 0x0015, 0x0019


@pytest.fixture
def port() -> Iterator[DirectPort]:
    a, b = socket.socketpair()
    p = DirectPort(None, a, ETH)  # type: ignore[arg-type]  # the MAD socket is not used here
    yield p
    a.close()
    b.close()


def response(mad: bytes, *, dlid: int, slid: int, corrupt: bool = False) -> bytes:
    buf = bytearray(mad)
    buf[3] = 0x81
    buf[4] |= 0x80 if buf[1] == 0x81 else 0
    pkt = bytearray(frame_mad(bytes(buf), dlid=dlid, slid=slid, dqp=0, sqp=0, qkey=0, vl=15))
    if corrupt:
        pkt[MAD_OFFSET + 70] ^= 1
    return ETH[6:12] + ETH[:6] + ETH[12:] + bytes(pkt)


def test_a_directed_route_smp_leaving_the_host_is_framed_with_hop_pointer_1_and_the_tag(port: DirectPort) -> None:
    mad = mb.dr_smp(mb.GET, NODE_INFO, path=[1, 3, 2], tid=0x1234)
    frame = port._frame(SimRequest(0xFFFF, 0, 0, 0, mad))
    assert frame is not None and frame[:14] == ETH
    pkt = frame[14:]
    check(pkt)  # the CRCs a receiver checks hold
    assert pkt[0] >> 4 == 15 and pkt[2:4] == b"\xff\xff" and pkt[6:8] == b"\xff\xff"
    out = pkt[MAD_OFFSET:MAD_OFFSET + 256]
    assert out[M_HOP_POINTER] == 1 and mb.tid(out) == TID_TAG | 0x1234
    assert out[INITIAL_PATH + 1:INITIAL_PATH + 4] == bytes([1, 3, 2])


@pytest.mark.parametrize("mad", [
    mb.dr_smp(mb.GET, NODE_INFO, path=[]),                 # HopCount 0: the local SMA answers
    mb.dr_smp(mb.GET, NODE_INFO, path=[2, 1]),             # InitialPath[1] is not our port
    mb.dr_smp(mb.GET, NODE_INFO, path=[1], dr_slid=5),     # a LID-routed head
    mb.pma(mb.GET, 0x0012),                                # GSI
], ids=["hop-count-0", "other-port", "lid-routed-head", "gsi"])
def test_what_the_hca_itself_answers_or_frames_differently_goes_by_the_mad_socket(port: DirectPort, mad: bytes) -> None:
    qp = 0 if mad[1] in (0x01, 0x81) else 1
    assert port._frame(SimRequest(0xFFFF, 0, qp, qp, mad)) is None


def test_lid_routed_smps_wait_for_our_lid_which_our_own_port_info_tells(port: DirectPort) -> None:
    lft = SimRequest(7, 0, 0, 0, mb.lr_smp(mb.SET, LFT, modifier=0, data=bytes(64)))
    assert port._frame(lft) is None  # no LID yet: the MAD socket fills in the SLID
    pi = bytearray(64)
    pi[16:18] = (9).to_bytes(2, "big")
    get_resp = bytearray(mb.dr_smp(mb.GET, PORT_INFO, path=[], data=bytes(pi)))
    get_resp[3], get_resp[4] = 0x81, 0x80
    port._learn_lid(bytes(get_resp), outgoing=False)
    assert port.lid == 9
    frame = port._frame(lft)
    assert frame is not None and frame[14 + 2:14 + 4] == b"\x00\x07" and frame[14 + 6:14 + 8] == b"\x00\x09"
    assert port._frame(SimRequest(9, 0, 0, 0, lft.mad)) is None  # to ourselves: loopback by the MAD socket
    pi[16:18] = (12).to_bytes(2, "big")
    port._learn_lid(mb.dr_smp(mb.SET, PORT_INFO, path=[], data=bytes(pi)), outgoing=True)
    assert port.lid == 12
    port._learn_lid(mb.dr_smp(mb.SET, PORT_INFO, path=[3], data=bytes(64)), outgoing=True)  # not ours
    assert port.lid == 12


def test_received_responses_are_checked_and_delivered_as_the_mad_socket_would(port: DirectPort) -> None:
    mad = mb.lr_smp(mb.GET, NODE_INFO, tid=77)
    got = port._parse(response(mad, dlid=9, slid=3))
    assert got is not None and (got.dlid, got.slid, got.dqp, got.sqp) == (9, 3, 0, 0)
    assert got.mad[3] == 0x81 and mb.tid(got.mad) == 77
    assert port._parse(response(mad, dlid=9, slid=3, corrupt=True)) is None
    assert port.stats["rx_bad_packet"] == 1
    assert port._parse(response(mad, dlid=9, slid=3)[:200]) is None
    assert port.stats["rx_bad_packet"] == 2


def test_a_trap_arriving_both_ways_is_handed_on_once(port: DirectPort) -> None:
    trap = bytearray(mb.lr_smp(0x05, 0x0002, tid=5))
    req = SimRequest(1, 4, 0, 0, bytes(trap))
    assert not port._is_repeat_trap(req)
    assert port._is_repeat_trap(req)       # the second copy (the MAD socket's)
    assert not port._is_repeat_trap(req)   # a third is a new trap
    other = SimRequest(1, 5, 0, 0, bytes(trap))  # another switch's
    assert not port._is_repeat_trap(other)
    assert port.stats["rx_trap_second_copy"] == 1


def test_a_traps_arrival_at_the_port_is_kept_for_the_sm_once(port: DirectPort) -> None:
    """The kernel's receive stamp of a trap that came by wire, on the emulated clock, taken by
    the SM once (its ``trap`` record's ``t_port_ns``); another trap's is its own; a frame
    without a stamp leaves none; only the last ``_ARRIVALS_KEPT`` are kept."""
    trap = mb.lr_smp(0x05, 0x0002, tid=5)
    req = SimRequest(1, 4, 0, 0, trap)
    wall = time.clock_gettime_ns(time.CLOCK_REALTIME) - 2_000_000  # received 2 ms ago
    port._note_arrival(req, wall)
    got = port.arrival_ns(req)
    assert got is not None and 1_000_000 <= clock.now_ns() - got <= 50_000_000
    assert port.arrival_ns(req) is None  # taken
    port._note_arrival(req, None)
    assert port.arrival_ns(req) is None
    for tid in range(directport._ARRIVALS_KEPT + 1):
        port._note_arrival(SimRequest(1, 4, 0, 0, mb.lr_smp(0x05, 0x0002, tid=100 + tid)), wall)
    assert port.arrival_ns(SimRequest(1, 4, 0, 0, mb.lr_smp(0x05, 0x0002, tid=100))) is None  # the oldest went
    assert port.arrival_ns(SimRequest(1, 4, 0, 0, mb.lr_smp(0x05, 0x0002, tid=101))) is not None


def test_the_socket_filter_takes_qp0_responses_and_traps_only() -> None:
    get = mb.dr_smp(mb.GET, NODE_INFO, path=[1])
    resp = response(get, dlid=0xFFFF, slid=0xFFFF)
    assert sockfilter.matches(sockfilter.SM_REPLIES, resp)
    trap = ETH + frame_mad(mb.lr_smp(0x05, 0x0002), dlid=1, slid=4, dqp=0, sqp=0, qkey=0, vl=15)
    assert sockfilter.matches(sockfilter.SM_REPLIES, trap)
    request = ETH + frame_mad(get, dlid=0xFFFF, slid=0xFFFF, dqp=0, sqp=0, qkey=0, vl=15)
    assert not sockfilter.matches(sockfilter.SM_REPLIES, request)  # the local SMA's
    gsi = ETH + frame_mad(mb.pma(0x81, 0x0012), dlid=1, slid=4, dqp=1, sqp=1, qkey=0x80010000)
    assert not sockfilter.matches(sockfilter.SM_REPLIES, gsi)
    data = bytearray(resp)
    data[14 + 12 + 3] = 5  # DestQP 5: a data QP
    assert not sockfilter.matches(sockfilter.SM_REPLIES, bytes(data))
    assert not sockfilter.matches(sockfilter.SM_REPLIES, resp[:30])


def test_the_sm_process_starts_without_scapy() -> None:
    """The SM's start-up is part of every bring-up figure: scapy alone costs it ~0.4 s."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", "import sys, ibemu.sm.__main__; print('scapy' in sys.modules)"],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


class _Umad:
    """The MAD socket side of a ``DirectPort``: what it was given."""

    def __init__(self) -> None:
        self.sent: list[SimRequest] = []

    def send_nowait(self, req: SimRequest) -> None:
        self.sent.append(req)


def test_a_batch_goes_out_in_one_sendmmsg_per_run_of_frames_and_the_rest_by_the_mad_socket() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.setblocking(False)
    b.setblocking(False)
    umad = _Umad()
    p = DirectPort(umad, a, ETH)  # type: ignore[arg-type]
    far = [SimRequest(0xFFFF, 0, 0, 0, mb.dr_smp(mb.GET, NODE_INFO, path=[1, 3, i], tid=i)) for i in range(5)]
    local = SimRequest(0xFFFF, 0, 0, 0, mb.dr_smp(mb.GET, NODE_INFO, path=[], tid=99))
    try:
        assert p.send_many_nowait([*far[:3], local, *far[3:]]) == 6
        frames = [b.recv(9000) for _ in range(5)]
        with pytest.raises(BlockingIOError):
            b.recv(9000)
        tids = [mb.tid(f[14 + MAD_OFFSET:14 + MAD_OFFSET + 256]) & 0xFFFF for f in frames]
        assert tids == [0, 1, 2, 3, 4] and all(f[:14] == ETH for f in frames)
        assert [r.tid for r in umad.sent] == [99]
        assert p.stats["tx_sendmmsg"] == 2 and p.stats["tx_direct"] == 5
        assert p.send_many_nowait([]) == 0
        b.close()  # nobody to take them: nothing goes, and a single send says why
        assert p.send_many_nowait(far) == 0
        with pytest.raises(OSError):
            p.send_nowait(far[0])
    finally:
        a.close()
        b.close()


def test_what_waits_on_the_wire_is_read_in_one_batch_checked_stamped_and_handed_on_in_order() -> None:
    """``_read_wire`` reads every waiting frame with one ``recvmmsg``: good responses and a
    trap go on in arrival order, a corrupt frame and the trap's second copy do not; each
    frame's wait since the kernel's stamp is counted, and the trap's arrival is kept."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.setblocking(False)
    packet.stamp_received(a)
    umad = _Umad()
    p = DirectPort(umad, a, ETH)  # type: ignore[arg-type]
    resps = [response(mb.lr_smp(mb.GET, NODE_INFO, tid=t), dlid=9, slid=3) for t in (1, 2, 3)]
    trap = ETH + frame_mad(mb.lr_smp(0x05, 0x0002, tid=7), dlid=9, slid=4, dqp=0, sqp=0, qkey=0, vl=15)
    bad = response(mb.lr_smp(mb.GET, NODE_INFO, tid=4), dlid=9, slid=3, corrupt=True)
    for frame in (resps[0], bad, trap, resps[1], trap, b"x" * 600, resps[2]):
        b.send(frame)

    async def main() -> list[SimRequest]:
        async with trio.open_nursery() as n:
            n.start_soon(p._read_wire)
            got: list[SimRequest] = []
            while len(got) < 4:
                got += await p.recv_many()
            n.cancel_scope.cancel()
        return got

    try:
        got = trio.run(main)
    finally:
        a.close()
        b.close()
    assert [(r.mad[3], mb.tid(r.mad)) for r in got] == [(0x81, 1), (0x05, 7), (0x81, 2), (0x81, 3)]
    assert p.stats["rx_direct"] == 4 and p.stats["rx_bad_packet"] == 1 and p.stats["rx_trap_second_copy"] == 1
    assert p.stats["rx_too_long"] == 1  # longer than a receive slot: counted, dropped
    assert len(p.wake_ns) == 6 and all(0 <= w < 10_000_000_000 for w in p.wake_ns)
    assert p.arrival_ns(got[1]) is not None


def _old_frame(port: DirectPort, req: SimRequest, psn: int) -> bytes | None:
    """How the port framed a request before it built frames in one buffer (the reference)."""
    buf = bytearray(req.mad)
    buf[8:10] = (TID_TAG >> 48).to_bytes(2, "big")
    if buf[1] == 0x81:
        from ibemu.agents import dr
        if dr.on_originate(buf, 0, port.port)[0] != dr.PORT:
            return None
        dlid = slid = 0xFFFF
    else:
        dlid, slid = req.dlid, port.lid
    return port.eth + frame_mad(buf, dlid=dlid, slid=slid, dqp=0, sqp=0, qkey=0, vl=15, psn=psn)


def test_frames_are_byte_for_byte_what_the_packet_builder_makes(port: DirectPort) -> None:
    """Directed-route SMPs of every hop count and LID-routed ones to any LID, Gets and Sets
    with data: the frame is the one ``frame_mad`` builds around the tagged MAD (the
    receive check holds, the PSN counts only frames made); a directed-route SMP whose hop
    pointer is already set is refused as before, without using a PSN."""
    import random

    rng = random.Random(7)
    port.lid = 3
    made = 0
    for i in range(200):
        data = bytes(rng.randrange(256) for _ in range(64))
        if i % 2:
            hops = rng.randrange(1, 64)
            path = [1] + [rng.randrange(1, 37) for _ in range(hops - 1)]
            mad = mb.dr_smp(rng.choice([mb.GET, mb.SET]), rng.choice([NODE_INFO, PORT_INFO, LFT]), path=path,
                            modifier=rng.randrange(1 << 16), data=data, tid=rng.randrange(1 << 32))
            req = SimRequest(0xFFFF, 0, 0, 0, mad)
        else:
            mad = mb.lr_smp(rng.choice([mb.GET, mb.SET]), LFT, modifier=rng.randrange(4), data=data,
                            tid=rng.randrange(1 << 32))
            req = SimRequest(rng.randrange(4, 0xBFFF), 0, 0, 0, mad)
        want = _old_frame(port, req, made + 1)
        got = port._frame(req)
        assert got == want and got is not None
        check(got[14:])
        made += 1
    bad = bytearray(mb.dr_smp(mb.GET, NODE_INFO, path=[1, 2]))
    bad[M_HOP_POINTER] = 1
    assert port._frame(SimRequest(0xFFFF, 0, 0, 0, bytes(bad))) is None
    assert port._psn == made


def test_an_attached_transport_is_handed_each_frame_by_the_reading_task_itself() -> None:
    """``attach``: what ``recv`` had not taken goes first, then each frame read is handed to
    the callback in order from the task that read it (no task switch between the socket and
    the handler); a request sent through a ``Transport`` on the port is answered so; after
    ``attach(None)`` frames queue for ``recv`` again."""
    from ibemu.sm.transport import Request, Transport

    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.setblocking(False)
    p = DirectPort(_Umad(), a, ETH)  # type: ignore[arg-type]
    p.lid = 9

    def answer(tid: int) -> bytes:
        return response(mb.lr_smp(mb.GET, NODE_INFO, tid=TID_TAG | tid), dlid=9, slid=3)

    async def main() -> None:
        async with trio.open_nursery() as n:
            n.start_soon(p._read_wire)
            b.send(answer(1))
            first = await p.recv_many()  # queued: no one attached yet
            assert [mb.tid(r.mad) & 0xFFFF for r in first] == [1]
            b.send(answer(2))
            await trio.sleep(0.05)  # read and queued
            got: list[tuple[int, object]] = []
            p.attach(lambda req: got.append((mb.tid(req.mad) & 0xFFFF, trio.lowlevel.current_task())))
            assert [t for t, _ in got] == [2]  # what was queued, at once
            for tid in (3, 4, 5):
                b.send(answer(tid))
            while len(got) < 4:
                await trio.sleep(0.01)
            assert [t for t, _ in got] == [2, 3, 4, 5]
            readers = {task for _, task in got[1:]}
            assert len(readers) == 1 and next(iter(readers)).name.endswith("_read_wire")
            p.attach(None)
            # a transport attaches itself while it serves: a request is answered by the wire
            t = Transport(p)
            async with trio.open_nursery() as tn:
                await tn.start(t.serve)
                assert p.deliver is not None

                async def answer_it() -> None:
                    while True:
                        try:
                            frame = b.recv(9000)
                        except BlockingIOError:
                            await trio.sleep(0.005)
                            continue
                        mad = frame[14 + MAD_OFFSET:14 + MAD_OFFSET + 256]
                        b.send(response(mad, dlid=9, slid=3))
                        return

                tn.start_soon(answer_it)
                reply = await t.request(Request(mb.lr_smp(mb.GET, NODE_INFO), dlid=3), timeout_s=2)
                assert reply is not None and reply.ok
                tn.cancel_scope.cancel()
            assert p.deliver is None
            n.cancel_scope.cancel()

    try:
        trio.run(main)
    finally:
        a.close()
        b.close()
