"""QP state machine and verbs argument checks; DLID and unknown-QP drops."""

from __future__ import annotations

import pytest

from ibemu.hca.transport import Hca, QpState, QpStateError, RecvWr, SendWr, Sge, WcStatus, WrOpcode
from ibemu.hca.verbs import connect_pair, open_device, sge
from ibemu.testing.loopback import Loopback, SimClock

from .harness import make_pair


def test_states_gate_the_verbs() -> None:
    a = Hca(lid=1, clock=lambda: 0)
    cq = a.create_cq()
    qp = a.create_rc_qp(cq, psn=5)
    mr = a.reg_mr(bytearray(64))
    assert qp.state is QpState.RESET
    with pytest.raises(QpStateError):
        qp.post_recv(RecvWr(1, [Sge(mr.addr, 8, mr.lkey)]))
    qp.modify_to_init()
    qp.post_recv(RecvWr(1, [Sge(mr.addr, 8, mr.lkey)]))  # allowed from INIT on
    with pytest.raises(QpStateError):
        qp.post_send([])
    with pytest.raises(QpStateError):
        qp.modify_to_rts()
    qp.modify_to_rtr({"qpn": 0x99, "psn": 7, "lid": 2})
    assert qp.state is QpState.RTR and qp.resp.epsn == 7
    with pytest.raises(QpStateError):
        qp.post_send([])
    qp.modify_to_rts()
    assert qp.state is QpState.RTS and qp.info().psn == 5
    with pytest.raises(ValueError, match="lkey"):
        qp.post_recv(RecvWr(2, [Sge(mr.addr, 8, 0x4242)]))
    with pytest.raises(ValueError, match="outside"):
        qp.post_recv(RecvWr(2, [Sge(mr.addr + 60, 8, mr.lkey)]))


def test_bad_mtu_rejected() -> None:
    with pytest.raises(ValueError, match="MTU"):
        Hca(mtu=1500)


def test_sqd_holds_new_sends_until_rts() -> None:
    p = make_pair(mtu=256)
    p.qa.modify_to_sqd()
    assert p.qa.post_send(p.write(1, 0, 100)) == []
    p.run()
    assert p.wcs_a == []
    p.link.send(p.a, p.qa.modify_to_rts())
    p.run()
    assert [(w.wr_id, w.status) for w in p.wcs_a] == [(1, WcStatus.SUCCESS)]


def test_wrong_dlid_and_unknown_qp_are_dropped() -> None:
    clock = SimClock()
    a, b, c = (open_device(lid, clock=clock) for lid in (1, 2, 3))
    qa, qb = a.create_rc_qp(a.create_cq()), b.create_rc_qp(b.create_cq())
    connect_pair(qa, qb)
    qb.post_recv(RecvWr(1, [sge(b.reg_mr(bytearray(16)))]))
    mr = a.reg_mr(bytearray(8))
    (s,) = qa.post_send(SendWr(1, WrOpcode.SEND, [sge(mr)]))
    assert c.receive(s.packet) == [] and c.stats.dlid_mismatch == 1
    b.destroy_qp(qb)
    assert b.receive(s.packet) == [] and b.stats.unknown_qp == 1
    Loopback(a, b, clock).run()  # the armed ACK timer retries 7 times into the void
    assert b.stats.unknown_qp == 1 + 7 and qa.state is QpState.ERROR
    assert [w.status for w in qa.send_cq.poll()] == [WcStatus.RETRY_EXC_ERR]


def test_user_moves_qp_to_error_flushes_everything() -> None:
    p = make_pair(mtu=256)
    p.link.filter = lambda sender, idx, pkt: False  # nothing gets through
    p.recv(1, 0, 10)
    p.qa.post_recv(RecvWr(2, [Sge(p.sink.addr, 10, p.sink.lkey)]))
    p.post([p.write(3, 0, 10), p.send(4, 0, 10)])
    p.qa.enter_error()
    assert p.qa.state is QpState.ERROR and p.a.next_deadline() is None
    assert [(w.wr_id, w.status) for w in p.cqa.poll()] == [
        (3, WcStatus.WR_FLUSH_ERR), (4, WcStatus.WR_FLUSH_ERR), (2, WcStatus.WR_FLUSH_ERR)]
    p.qa.post_recv(RecvWr(5, [Sge(p.sink.addr, 10, p.sink.lkey)]))
    assert [(w.wr_id, w.status) for w in p.cqa.poll()] == [(5, WcStatus.WR_FLUSH_ERR)]
    p.qa.reset()
    assert p.qa.state is QpState.RESET
    p.qa.connect(p.qb.info())
    assert p.qa.state is QpState.RTS


def test_other_transports_opcodes_to_an_rc_qp_are_dropped() -> None:
    from ibemu.wire import fast

    p = make_pair(mtu=256)
    for opcode, ext in ((0x64, fast.deth(1, 2)), (0x24, b""), (0x81, b"")):
        t = fast.NativeTemplate(slid=1, dlid=2, destqp=p.qb.qpn)
        assert p.b.receive(t.packet(opcode, 0, b"x", ext=ext)) == []
    assert p.qb.stats.dropped == 3 and p.qb.resp.epsn == 0
    t = fast.NativeTemplate(slid=1, dlid=2, destqp=p.qb.qpn)  # an atomic: NAK invalid request
    (nak,) = p.b.receive(t.packet(0x14, 0, ext=fast.atomic_eth(0, 0, 1, 0)))
    assert nak.packet[20] == 0x61


def test_receive_takes_a_view_into_an_ethernet_frame() -> None:
    from ibemu.wire import fast

    p = make_pair(mtu=256)
    p.recv(1, 0, 600)
    eth = fast.ethernet_header(b"\2" * 6, b"\4" * 6)
    for s in p.qa.post_send(p.send(1, 0, 600)):
        frame = bytearray(eth + s.packet)
        for ack in p.b.receive(fast.frame_payload(frame)):
            p.a.receive(memoryview(ack.packet))
    assert [w.status for w in p.cqa.poll()] == [WcStatus.SUCCESS]
    assert p.rbuf.buf[:600] == p.src.buf[:600]


def test_timer_values() -> None:
    from ibemu.hca.transport.timers import ack_timeout_ns, rnr_delay_ns

    assert ack_timeout_ns(0) is None and ack_timeout_ns(1) == 8192 and ack_timeout_ns(14) == 67_108_864
    assert [rnr_delay_ns(c) for c in (0, 1, 5, 14, 31)] == [655_360_000, 10_000, 60_000, 1_280_000,
                                                            491_520_000]
    with pytest.raises(ValueError):
        ack_timeout_ns(32)
