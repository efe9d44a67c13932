"""RC corner cases: READ response loss and duplicate READs, length errors, RNR timer codes,
multiple SGEs, reordering, determinism, and the verbs helpers."""

from __future__ import annotations

from ibemu.hca.transport import QpState, RecvWr, SendWr, Sge, WcOpcode, WcStatus, WrOpcode
from ibemu.hca.transport.actions import Send
from ibemu.hca.verbs import Access, connect_pair, open_device, sge
from ibemu.testing.loopback import Loopback, SimClock

from .harness import make_pair, sent_by


def test_lost_read_response_re_requests_the_rest() -> None:
    p = make_pair(mtu=256)
    p.dst.buf[:] = p.src.buf
    p.link.filter = lambda sender, idx, pkt: not (sender is p.b and idx == 2)  # 3rd response
    p.post([p.read(1, 0, 1500), p.write(2, 0, 10, 5000)])
    p.run()
    assert [(w.wr_id, w.status) for w in p.wcs_a] == [(1, WcStatus.SUCCESS), (2, WcStatus.SUCCESS)]
    assert p.sink.buf[:1500] == p.src.buf[:1500]
    reqs = [h for h in sent_by(p, p.a) if h.opcode == 0x0C]
    assert [h.psn for h in reqs] == [0, 2]  # the re-request starts at the lost response
    # go-back-N: the READ's rest (re-executed as a duplicate) and the WRITE behind it (re-ACKed)
    assert p.qb.stats.duplicates == 2 and p.qb.stats.acks_sent == 2


def test_duplicated_read_request_answered_again_and_ignored_by_requester() -> None:
    p = make_pair(mtu=256)
    p.dst.buf[:] = p.src.buf
    p.post(p.read(1, 100, 600))
    pkt = next(pk for _t, h, pk in p.link.trace or [] if h is p.a)
    p.run()
    p.link.send(p.a, [Send(1, pkt)])  # the request again, late
    p.run()
    assert [(w.wr_id, w.status) for w in p.wcs_a] == [(1, WcStatus.SUCCESS)]
    assert p.qb.stats.duplicates == 1 and p.qa.stats.duplicates == 3  # 3 responses re-sent
    assert p.sink.buf[:600] == p.src.buf[100:700]


def test_send_longer_than_the_receive_buffer() -> None:
    p = make_pair(mtu=256)
    p.recv(5, 0, 100)
    p.post([p.send(1, 0, 300), p.send(2, 0, 10)])
    p.run()
    assert [(w.wr_id, w.status) for w in p.wcs_b] == [(5, WcStatus.LOC_LEN_ERR)]
    assert [(w.wr_id, w.status) for w in p.wcs_a] == [(1, WcStatus.REM_INV_REQ_ERR),
                                                       (2, WcStatus.WR_FLUSH_ERR)]
    assert p.qb.stats.inv_req_naks_sent == 1


def test_rnr_nak_carries_the_timer_code() -> None:
    p = make_pair(mtu=256, min_rnr_timer=0x13, rnr_retry=0)
    p.post(p.send(1, 0, 10))
    p.run()
    nak = next(pk for _t, h, pk in p.link.trace or [] if h is p.b)
    assert nak[8] == 0x11 and nak[20] == 0x20 | 0x13
    assert [w.status for w in p.wcs_a] == [WcStatus.RNR_RETRY_EXC_ERR]


def test_multiple_sges_gather_and_scatter() -> None:
    p = make_pair(mtu=256)
    parts = [(10, 100), (500, 300), (2000, 7)]
    wr = SendWr(1, WrOpcode.SEND, [Sge(p.src.addr + o, n, p.src.lkey) for o, n in parts])
    p.qb.post_recv(RecvWr(2, [Sge(p.rbuf.addr + 1000, 50, p.rbuf.lkey),
                             Sge(p.rbuf.addr, 400, p.rbuf.lkey)]))
    p.post(wr)
    p.run()
    data = b"".join(bytes(p.src.buf[o : o + n]) for o, n in parts)
    assert [(w.wr_id, w.byte_len) for w in p.wcs_b] == [(2, 407)]
    assert p.rbuf.buf[1000:1050] == data[:50] and p.rbuf.buf[:357] == data[50:]


def test_reordering_recovers_in_order() -> None:
    p = make_pair(mtu=256, reorder=0.3, seed=11)
    for i in range(10):
        p.recv(i, i * 1000, 1000)
    p.post([p.send(i, i * 1000, 700) for i in range(10)])
    p.run()
    assert p.link.stats.reordered > 0
    assert [w.wr_id for w in p.wcs_b] == list(range(10))
    assert all(p.rbuf.buf[i * 1000 : i * 1000 + 700] == p.src.buf[i * 1000 : i * 1000 + 700]
               for i in range(10))


def test_loopback_is_deterministic() -> None:
    def run() -> list[tuple[int, bytes]]:
        p = make_pair(mtu=512, loss=0.1, dup=0.1, reorder=0.1, seed=5)
        p.src.buf[:] = bytes(range(256)) * (p.src.length // 256)
        p.post([p.write(i, 0, 3000, i * 3000) for i in range(5)])
        p.run()
        return [(t, pk) for t, _h, pk in p.link.trace or []]
    assert run() == run()


def test_verbs_api_end_to_end() -> None:
    clock = SimClock()
    a, b = open_device(1, clock=clock), open_device(2, clock=clock)
    ca, cb = a.create_cq(), b.create_cq()
    qa, qb = a.create_rc_qp(ca), b.create_rc_qp(cb)
    connect_pair(qa, qb, timeout=10)
    assert qa.state is QpState.RTS and qa.remote_qpn == qb.qpn
    mine = a.reg_mr(bytearray(b"hello, fabric!"))
    theirs = b.reg_mr(bytearray(64), Access.LOCAL_WRITE | Access.REMOTE_WRITE)
    qb.post_recv(RecvWr(9, [sge(theirs, 32)]))
    link = Loopback(a, b, clock)
    link.send(a, qa.post_send([
        SendWr(1, WrOpcode.RDMA_WRITE, [sge(mine)], remote_addr=theirs.addr, rkey=theirs.rkey),
        SendWr(2, WrOpcode.SEND_WITH_IMM, [sge(mine, 7)], imm=42)]))
    link.run()
    assert [(w.wr_id, w.opcode) for w in ca.poll()] == [(1, WcOpcode.RDMA_WRITE), (2, WcOpcode.SEND)]
    assert [(w.wr_id, w.byte_len, w.imm) for w in cb.poll()] == [(9, 7, 42)]
    assert theirs.buf[:14] == b"hello, fabric!" and theirs.buf[32:39] == b"fabric!"


def test_both_directions_at_once_over_a_lossy_cable() -> None:
    p = make_pair(mtu=512, loss=0.1, seed=21)
    back = p.b.reg_mr(bytearray(bytes(range(256)) * 64), Access.LOCAL_WRITE)
    land = p.a.reg_mr(bytearray(len(back.buf)), Access.LOCAL_WRITE | Access.REMOTE_WRITE)
    p.post([p.write(i, i * 4000, 4000, i * 4000) for i in range(4)])
    p.link.send(p.b, p.qb.post_send([
        SendWr(10 + i, WrOpcode.RDMA_WRITE, [Sge(back.addr + i * 4000, 4000, back.lkey)],
               remote_addr=land.addr + i * 4000, rkey=land.rkey) for i in range(4)]))
    p.run()
    assert [w.wr_id for w in p.wcs_a] == [0, 1, 2, 3] and [w.wr_id for w in p.wcs_b] == [10, 11, 12, 13]
    assert all(w.status is WcStatus.SUCCESS for w in p.wcs_a + p.wcs_b)
    assert p.dst.buf[:16000] == p.src.buf[:16000] and land.buf[:16000] == back.buf[:16000]
    assert p.link.stats.lost > 0
