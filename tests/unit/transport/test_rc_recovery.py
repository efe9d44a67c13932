"""RC recovery: sequence-error NAKs, go-back-N, timeouts, duplicates, retry exhaustion, RNR,
remote access errors, CRC and P_Key drops."""

from __future__ import annotations

import itertools

from ibemu.hca.transport import Access, Hca, QpState, RecvWr, SendWr, Sge, WcStatus, WrOpcode
from ibemu.hca.transport.timers import ack_timeout_ns, rnr_delay_ns
from ibemu.testing.loopback import Loopback, SimClock

from .harness import make_pair, sent_by


def drop_a(*indices: int):
    def f(sender: Hca, idx: int, pkt: bytes) -> bool:
        return not (sender.lid == 1 and idx in indices)
    return f


def drop_b(*indices: int):
    def f(sender: Hca, idx: int, pkt: bytes) -> bool:
        return not (sender.lid == 2 and idx in indices)
    return f


def test_lost_middle_packet_nak_once_then_go_back_n() -> None:
    p = make_pair(mtu=256)
    p.link.filter = drop_a(3)
    p.post(p.write(1, 0, 8 * 256))
    p.run()
    assert [(w.wr_id, w.status) for w in p.wcs_a] == [(1, WcStatus.SUCCESS)]
    assert p.dst.buf[:2048] == p.src.buf[:2048]
    assert p.qb.stats.seq_naks_sent == 1  # once, though packets 4..7 all arrived out of sequence
    assert p.qb.stats.dropped == 3
    assert p.qa.stats.seq_naks_received == 1
    assert p.qa.stats.retransmitted == 5  # PSNs 3..7
    assert p.qa.stats.timeouts == 0
    assert [h.psn for h in sent_by(p, p.a)] == [0, 1, 2, 3, 4, 5, 6, 7, 3, 4, 5, 6, 7]
    nak = next(pk for _t, h, pk in p.link.trace or [] if h is p.b)
    assert nak[20] == 0x60 and int.from_bytes(nak[17:20], "big") == 3


def test_lost_last_ack_timeout_retransmit_duplicate_detected() -> None:
    p = make_pair(mtu=1024, timeout=8)
    p.recv(9, 0, 4096)
    p.link.filter = drop_b(0)
    p.post(p.send(1, 0, 3000))
    p.run()
    assert [(w.wr_id, w.status) for w in p.wcs_a] == [(1, WcStatus.SUCCESS)]
    assert [(w.wr_id, w.byte_len) for w in p.wcs_b] == [(9, 3000)]  # delivered once
    assert p.qa.stats.timeouts == 1
    assert p.qa.stats.retransmitted == 3
    assert p.qb.stats.duplicates == 3
    assert p.qb.stats.acks_sent == 2  # the lost one and the re-ACK of the duplicate
    times = [t for t, h, _pk in p.link.trace or [] if h is p.a]
    assert times[3] - times[2] == ack_timeout_ns(8) == 4096 * 256


def test_retry_exhaustion_errors_and_flushes() -> None:
    p = make_pair(mtu=256, timeout=5, retry_cnt=3)
    p.link.filter = lambda sender, idx, pkt: sender is not p.a
    p.qa.post_recv(RecvWr(50, [Sge(p.sink.addr, 16, p.sink.lkey)]))
    p.post([p.write(1, 0, 600), p.send(2, 0, 10), p.read(3, 0, 10)])
    p.run()
    assert p.qa.stats.timeouts == 4  # the first try and three retries
    assert p.qa.state is QpState.ERROR
    assert [(w.wr_id, w.status) for w in p.wcs_a] == [
        (1, WcStatus.RETRY_EXC_ERR), (2, WcStatus.WR_FLUSH_ERR), (3, WcStatus.WR_FLUSH_ERR),
        (50, WcStatus.WR_FLUSH_ERR)]
    assert p.a.next_deadline() is None
    # in ERROR, new work completes at once with a flush error
    assert p.qa.post_send(p.write(4, 0, 10)) == []
    assert [(w.wr_id, w.status) for w in p.cqa.poll()] == [(4, WcStatus.WR_FLUSH_ERR)]


def test_rnr_nak_then_retry_succeeds() -> None:
    p = make_pair(mtu=256, min_rnr_timer=14)  # 1.28 ms
    p.post([p.write(1, 0, 300), p.send(2, 0, 700), p.write(3, 0, 600, 1000)])
    p.run(until_ns=rnr_delay_ns(14) * 3 + 10)
    assert p.qb.stats.rnr_naks_sent >= 2
    assert p.qb.stats.seq_naks_sent == 0  # packets after the RNR'd one are dropped silently
    assert [w.wr_id for w in p.wcs_a] == [1]
    p.recv(77, 0, 1024)
    p.run()
    assert [(w.wr_id, w.status) for w in p.wcs_a] == [(i, WcStatus.SUCCESS) for i in (1, 2, 3)]
    assert [(w.wr_id, w.byte_len) for w in p.wcs_b] == [(77, 700)]
    assert p.rbuf.buf[:700] == p.src.buf[:700] and p.dst.buf[1000:1600] == p.src.buf[:600]
    # each retry waited the RNR delay: SEND First (PSN 2) went out at least that far apart
    sends = [t for t, h, pk in p.link.trace or [] if h is p.a and pk[8] == 0x00]
    assert all(b - a >= rnr_delay_ns(14) for a, b in itertools.pairwise(sends))


def test_rnr_retry_exhaustion() -> None:
    p = make_pair(mtu=256, rnr_retry=2)
    p.post(p.send(1, 0, 10))
    p.run()
    assert p.qa.stats.rnr_naks_received == 3
    assert [(w.wr_id, w.status) for w in p.wcs_a] == [(1, WcStatus.RNR_RETRY_EXC_ERR)]
    assert p.qa.state is QpState.ERROR


def test_bad_rkey_remote_access_error() -> None:
    for bad in ("rkey", "range", "right", "read"):
        p = make_pair(mtu=256)
        if bad == "rkey":
            wr = p.write(1, 0, 100)
            wr.rkey ^= 0x100
        elif bad == "range":
            wr = p.write(1, 0, 600, p.dst.length - 500)
        elif bad == "right":
            wr = SendWr(1, WrOpcode.RDMA_WRITE, [Sge(p.src.addr, 10, p.src.lkey)],
                        remote_addr=p.rbuf.addr, rkey=p.rbuf.rkey)  # LOCAL_WRITE only
        else:
            wr = p.read(1, 0, 100)
            wr.rkey = 12345
        p.post([p.write(0, 0, 10), wr, p.write(2, 0, 10)])
        p.run()
        assert [(w.wr_id, w.status) for w in p.wcs_a] == [
            (0, WcStatus.SUCCESS), (1, WcStatus.REM_ACCESS_ERR), (2, WcStatus.WR_FLUSH_ERR)], bad
        assert p.qb.stats.access_naks_sent == 1
        assert p.qa.state is QpState.ERROR
        assert p.dst.buf[10:] == bytes(p.dst.length - 10)


def test_corrupted_packets_dropped_counted_and_recovered() -> None:
    p = make_pair(mtu=512, corrupt=0.15, seed=3)
    for i in range(20):
        p.recv(i, i * 2000, 2000)
    p.post([p.send(i, i * 2000, 1500 + i) for i in range(20)] + [p.write(99, 0, 40000)])
    p.run()
    assert p.link.stats.corrupted > 5
    assert p.a.stats.crc_errors + p.b.stats.crc_errors + p.a.stats.malformed + p.b.stats.malformed \
        == p.link.stats.corrupted
    assert all(w.status is WcStatus.SUCCESS for w in p.wcs_a) and len(p.wcs_a) == 21
    assert [w.wr_id for w in p.wcs_b] == list(range(20))
    assert p.dst.buf[:40000] == p.src.buf[:40000]


def test_every_single_bit_flip_is_dropped() -> None:
    p = make_pair(mtu=256)
    p.recv(1, 0, 100)
    pkt = p.qa.post_send(p.send(1, 0, 37))[0].packet
    for i in range(len(pkt)):
        bad = bytearray(pkt)
        bad[i] ^= 0x10
        assert p.b.receive(bytes(bad)) == []
    assert p.b.stats.crc_errors + p.b.stats.malformed == len(pkt)
    assert p.qb.stats.rx_packets == 0
    assert len(p.b.receive(pkt)) == 1  # the intact one is accepted and ACKed


def _pkey_pair(pa: int, pb: int) -> tuple[Loopback, Hca, Hca, object, object]:
    clock = SimClock()
    a = Hca(lid=1, clock=clock, pkeys=(pa,))
    b = Hca(lid=2, clock=clock, pkeys=(pb,))
    link = Loopback(a, b, clock)
    qa, qb = a.create_rc_qp(a.create_cq(), psn=0), b.create_rc_qp(b.create_cq(), psn=0)
    qa.connect(qb.info(), timeout=4, retry_cnt=1)
    qb.connect(qa.info(), timeout=4, retry_cnt=1)
    src = a.reg_mr(bytearray(100))
    dst = b.reg_mr(bytearray(100), Access.REMOTE_WRITE)
    link.send(a, qa.post_send(SendWr(1, WrOpcode.RDMA_WRITE, [Sge(src.addr, 10, src.lkey)],
                                     remote_addr=dst.addr, rkey=dst.rkey)))
    link.run()
    return link, a, b, qa, qb


def test_pkey_checked_in_every_packet() -> None:
    for pa, pb, ok in ((0xFFFF, 0xFFFF, True), (0x8001, 0x8002, False), (0x8001, 0x0001, True),
                       (0x0001, 0x0001, False), (0x0001, 0x8001, True)):
        _link, _a, b, qa, _qb = _pkey_pair(pa, pb)
        assert (b.stats.pkey_violations == 0) is ok, (hex(pa), hex(pb))
        assert (qa.state is QpState.RTS) is ok  # type: ignore[attr-defined]
        if not ok:
            assert b.stats.pkey_violations == 2  # the try and one retry, each dropped
