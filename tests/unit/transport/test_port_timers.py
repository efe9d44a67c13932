"""``HcaPort``'s transport timers judge the fabric, not this process's scheduling.

Two ports of one process on an in-memory cable (an AF_UNIX datagram socket pair: one frame per
datagram, in order, never lost). A RC SEND leaves, then the whole process is off the CPU for
longer than the local ACK timeout (a blocking sleep: what a loaded machine does to it). When it
runs again the SEND is waiting in the responder's socket and nothing was lost: the requester's
timer must not fire (a spurious go-back-N: on a loaded machine these retransmitted whole
windows over and over, see ``HcaPort._timers``). A frame that never arrives still times out.
"""

from __future__ import annotations

import socket
import time

import pytest
import trio

from ibemu import clock
from ibemu.hca import nic
from ibemu.hca.nic import HcaPort
from ibemu.hca.transport import (
    Access,
    Hca,
    PathRecord,
    QpInfo,
    RcQp,
    RecvWr,
    SendWr,
    Sge,
    WcStatus,
    WrOpcode,
)

TIMEOUT = 10  # 4.096 us x 2^10 = 4.2 ms
STALL_S = 0.05  # the process off the CPU: over ten ACK timeouts


@pytest.fixture
def cable(monkeypatch: pytest.MonkeyPatch) -> tuple[socket.socket, socket.socket]:
    monkeypatch.setattr(nic, "mac_address", lambda sock: b"\x02\x00\x00\x00\x00\x01")
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.setblocking(False)
    b.setblocking(False)
    return a, b


def _ports(cable: tuple[socket.socket, socket.socket]) -> tuple[HcaPort, HcaPort, RcQp, RcQp]:
    peer = b"\x02\x00\x00\x00\x00\x02"
    pa = HcaPort(cable[0], Hca(lid=1, seed=1), peer, name="a")
    pb = HcaPort(cable[1], Hca(lid=2, seed=2), peer, name="b")
    qa = pa.hca.create_rc_qp(pa.hca.create_cq())
    qb = pb.hca.create_rc_qp(pb.hca.create_cq())
    qa.connect(QpInfo(qb.qpn, qb.sq_psn, 2), PathRecord(dlid=2), timeout=TIMEOUT, retry_cnt=7)
    qb.connect(QpInfo(qa.qpn, qa.sq_psn, 1), PathRecord(dlid=1), timeout=TIMEOUT, retry_cnt=7)
    rbuf = pb.hca.reg_mr(bytearray(4096), Access.LOCAL_WRITE)
    for i in range(16):
        qb.post_recv(RecvWr(i, [Sge(rbuf.addr + i * 256, 256, rbuf.lkey)]))
    return pa, pb, qa, qb


def _send(port: HcaPort, qp: RcQp, n: int) -> None:
    src = port.hca.reg_mr(bytearray(b"x" * 256 * n), Access.LOCAL_WRITE)
    port.post(qp, [SendWr(i, WrOpcode.SEND, [Sge(src.addr + i * 256, 256, src.lkey)]) for i in range(n)])


def test_frames_waiting_in_the_process_are_taken_before_an_ack_timeout(cable: tuple[socket.socket, socket.socket]) -> None:
    pa, pb, qa, qb = _ports(cable)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(pa.serve)
            await nursery.start(pb.serve)
            _send(pa, qa, 8)
            time.sleep(STALL_S)  # blocks the whole trio run, as a descheduled process
            with trio.fail_after(5):
                while qa.send_queue_depth:
                    await pa.wait_progress()
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert qb.stats.rx_packets == 8 and qb.stats.duplicates == 0
    assert qa.stats.timeouts == 0 and qa.stats.retransmitted == 0
    assert [wc.status for wc in qa.send_cq.poll(16)] == [WcStatus.SUCCESS] * 8


def test_a_frame_that_never_arrives_still_times_out(cable: tuple[socket.socket, socket.socket]) -> None:
    pa, pb, qa, qb = _ports(cable)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(pa.serve)
            await nursery.start(pb.serve)
            _send(pa, qa, 8)
            for _ in range(8):  # the cable lost them all: nothing can draw a NAK
                cable[1].recv(16384)
            time.sleep(STALL_S)
            with trio.fail_after(5):
                while qa.send_queue_depth:
                    await pa.wait_progress()
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert qa.stats.timeouts == 1 and qa.stats.retransmitted == 8
    assert qb.stats.rx_packets == 8 and qb.stats.duplicates == 0
    assert [wc.status for wc in qa.send_cq.poll(16)] == [WcStatus.SUCCESS] * 8


def test_a_catch_up_is_bounded(cable: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch) -> None:
    """More frames waiting than one catch-up reads: it stops at its bound and the timer is
    judged on what was read (here not the ACK: the deadline still stands), so a process that
    cannot keep up still fires its timers. (``catch_up`` is called by hand right after the
    stall, before any other task can run.)"""
    monkeypatch.setattr(nic, "CATCH_UP_FRAMES", 2)
    pa, pb, qa, _qb = _ports(cable)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(pa.serve)
            await nursery.start(pb.serve)
            _send(pa, qa, 8)
            time.sleep(STALL_S)
            assert nic.catch_up() == 2
            assert pb.caught_up == 2 and pa.caught_up == 0
            deadline = pa.hca.next_deadline()
            assert deadline is not None and deadline < clock.now_ns()  # still due: it fires
            assert qa.stats.acks_received == 0
            nursery.cancel_scope.cancel()

    trio.run(main)
