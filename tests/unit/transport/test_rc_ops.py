"""RC SEND / WRITE / READ at every MTU and the edge sizes; segmentation, PadCnt, coalescing."""

from __future__ import annotations

import pytest

from ibemu.hca.transport import WcOpcode, WcStatus
from ibemu.hca.transport.segment import MTUS
from ibemu.wire.decode import decode_native

from .harness import make_pair, padcnt, sent_by


def sizes(mtu: int) -> list[int]:
    return [0, 1, mtu - 1, mtu, mtu + 1, 5 * mtu + 3]


@pytest.mark.parametrize("mtu", MTUS)
def test_write_every_size_lands_exactly(mtu: int) -> None:
    p = make_pair(mtu=mtu)
    off = 0
    for i, n in enumerate(sizes(mtu)):
        p.post(p.write(i, off, n, off))
        off += n + 7
    p.run()
    assert [(w.wr_id, w.status, w.opcode) for w in p.wcs_a] == [
        (i, WcStatus.SUCCESS, WcOpcode.RDMA_WRITE) for i in range(6)]
    assert p.dst.buf[:off] == bytes(
        b"".join(p.src.buf[o : o + n] + b"\0" * 7 for o, n in _offsets(sizes(mtu))))[:off]
    assert p.wcs_b == []  # plain WRITEs consume no receive


def _offsets(ns: list[int]) -> list[tuple[int, int]]:
    out, off = [], 0
    for n in ns:
        out.append((off, n))
        off += n + 7
    return out


@pytest.mark.parametrize("mtu", MTUS)
def test_read_every_size(mtu: int) -> None:
    p = make_pair(mtu=mtu)
    p.dst.buf[:] = p.src.buf  # remote contents to read
    for i, (off, n) in enumerate(_offsets(sizes(mtu))):
        p.post(p.read(i, off, n, off))
    p.run()
    assert [(w.wr_id, w.status, w.opcode, w.byte_len) for w in p.wcs_a] == [
        (i, WcStatus.SUCCESS, WcOpcode.RDMA_READ, n) for i, n in enumerate(sizes(mtu))]
    for off, n in _offsets(sizes(mtu)):
        assert p.sink.buf[off : off + n] == p.src.buf[off : off + n]
    # READ responses: First/Middle/Last/Only with AETH, payload MTU-sized but the last
    resp = sent_by(p, p.b)
    assert {x.opcode for x in resp} == {0x0D, 0x0E, 0x0F, 0x10}


@pytest.mark.parametrize("mtu", MTUS)
def test_send_every_size_with_and_without_imm(mtu: int) -> None:
    p = make_pair(mtu=mtu)
    cases = _offsets(sizes(mtu))
    for i, (off, n) in enumerate(cases):
        p.recv(100 + i, off, n + 1)
    for i, (off, n) in enumerate(cases):
        p.post(p.send(i, off, n, imm=(0xABC000 + i) if i % 2 else None))
    p.run()
    assert [w.status for w in p.wcs_a] == [WcStatus.SUCCESS] * len(cases)
    got = [(w.wr_id, w.status, w.opcode, w.byte_len, w.imm, w.src_qp, w.slid) for w in p.wcs_b]
    assert got == [(100 + i, WcStatus.SUCCESS, WcOpcode.RECV, n, (0xABC000 + i) if i % 2 else None,
                    p.qa.qpn, 1) for i, (_o, n) in enumerate(cases)]
    for off, n in cases:
        assert p.rbuf.buf[off : off + n] == p.src.buf[off : off + n]


def test_write_with_immediate_consumes_a_receive() -> None:
    p = make_pair(mtu=256)
    p.recv(7, 0, 16)
    p.recv(8, 0, 16)
    p.post([p.write(1, 0, 1000, 0, imm=0xDEADBEEF), p.write(2, 0, 3, 2000, imm=5)])
    p.run()
    assert [(w.wr_id, w.opcode, w.byte_len, w.imm) for w in p.wcs_b] == [
        (7, WcOpcode.RECV_RDMA_WITH_IMM, 1000, 0xDEADBEEF), (8, WcOpcode.RECV_RDMA_WITH_IMM, 3, 5)]
    assert p.dst.buf[:1000] == p.src.buf[:1000] and p.dst.buf[2000:2003] == p.src.buf[:3]
    ops = [x.opcode for x in sent_by(p, p.a)]
    assert ops == [0x06, 0x07, 0x07, 0x09, 0x0B]


@pytest.mark.parametrize(("kind", "ops"), [
    ("write", {1: [0x0A], 2: [0x06, 0x08], 4: [0x06, 0x07, 0x07, 0x08]}),
    ("send", {1: [0x04], 2: [0x00, 0x02], 4: [0x00, 0x01, 0x01, 0x02]}),
])
def test_segmentation_opcodes_psns_and_padcnt(kind: str, ops: dict[int, list[int]]) -> None:
    mtu = 512
    for npk, want in ops.items():
        p = make_pair(mtu=mtu, psn_a=100)
        n = (npk - 1) * mtu + 3  # last packet carries 3 bytes: PadCnt 1
        p.recv(1, 0, 1 << 16)
        p.post(p.write(1, 0, n) if kind == "write" else p.send(1, 0, n))
        p.run()
        assert p.wcs_a[0].status is WcStatus.SUCCESS
        pkts = [pk for _t, h, pk in p.link.trace or [] if h is p.a]
        hdrs = sent_by(p, p.a)
        assert [h.opcode for h in hdrs] == want
        assert [h.psn for h in hdrs] == list(range(100, 100 + npk))
        assert [padcnt(pk) for pk in pkts] == [0] * (npk - 1) + [1]
        assert [h.ackreq for h in hdrs] == [0] * (npk - 1) + [1]
        for pk in pkts:  # the strict (scapy) decoder accepts them: lengths and CRCs right
            decode_native(pk)


def test_ack_coalescing_every_n_and_per_signaled_message() -> None:
    p = make_pair(mtu=256, ack_every=16)
    p.post(p.write(1, 0, 100 * 256))  # 100 packets: AckReq at 16, 32, .. 96 and 100
    p.run()
    assert p.qb.stats.acks_sent == 7
    assert [h.opcode for h in sent_by(p, p.b)] == [0x11] * 7
    # ten unsignaled SENDs and a signaled one: one ACK
    p = make_pair(mtu=256, ack_every=16)
    for i in range(11):
        p.recv(i, i * 64, 64)
    p.post([p.send(i, i * 64, 64, signaled=i == 10) for i in range(11)])
    p.run()
    assert p.qb.stats.acks_sent == 1
    assert [w.wr_id for w in p.wcs_a] == [10]
    assert len(p.wcs_b) == 11
    # the ACK carries credits 0x1F (unlimited) and the MSN (11 messages)
    ack = next(pk for _t, h, pk in p.link.trace or [] if h is p.b)
    assert ack[20] == 0x1F and int.from_bytes(ack[21:24], "big") == 11


def test_psn_wraps_at_2_24() -> None:
    start = (1 << 24) - 3
    p = make_pair(mtu=256, psn_a=start)
    p.dst.buf[:4096] = p.src.buf[4096:8192]
    p.post([p.write(1, 0, 2048), p.read(2, 0, 1024, 0), p.write(3, 2048, 512, 2048)])
    p.run()
    assert [(w.wr_id, w.status) for w in p.wcs_a] == [(i, WcStatus.SUCCESS) for i in (1, 2, 3)]
    psns = [h.psn for h in sent_by(p, p.a)]
    assert psns[:4] == [start, start + 1, start + 2, 0]
    assert p.qa.req.next_psn == (start + 8 + 4 + 2) & 0xFFFFFF == 11
    assert p.dst.buf[:2048] == p.src.buf[:2048]
    assert p.sink.buf[:1024] == p.src.buf[:1024]


def test_window_limits_unacknowledged_psns() -> None:
    p = make_pair(mtu=256, max_inflight=8, ack_every=4)
    p.post([p.write(i, i * 1024, 1024, i * 1024) for i in range(10)])  # 4 packets each
    first = [pk for _t, h, pk in p.link.trace or [] if h is p.a]
    assert len(first) == 8  # two WQEs started, eight waiting for ACKs
    p.run()
    assert [(w.wr_id, w.status) for w in p.wcs_a] == [(i, WcStatus.SUCCESS) for i in range(10)]
    assert p.dst.buf[:10240] == p.src.buf[:10240]
    # at no time were more than 8 + 3 PSNs sent and not yet acknowledged
    acked, worst = -1, 0
    for _t, h, pk in p.link.trace or []:
        psn = int.from_bytes(pk[17:20], "big")
        if h is p.b:
            acked = max(acked, psn)
        else:
            worst = max(worst, psn - acked)
    assert worst <= 8
