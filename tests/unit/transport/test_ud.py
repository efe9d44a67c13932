"""UD: SEND Only with DETH (Q_Key, source QP), one MTU max, Q_Key and P_Key checked."""

from __future__ import annotations

import os

import pytest

from ibemu.hca.transport import (
    Access,
    AddressHandle,
    Hca,
    QpState,
    QpStateError,
    RecvWr,
    SendWr,
    Sge,
    UdQp,
    WcOpcode,
    WcStatus,
    WrOpcode,
)
from ibemu.wire import fast
from ibemu.wire.decode import decode_native


def _ud(pkeys_b: tuple[int, ...] = (0xFFFF,), qkey_b: int = 0x1111) -> tuple[Hca, Hca, UdQp, UdQp]:
    a = Hca(lid=5, mtu=1024, clock=lambda: 0)
    b = Hca(lid=9, mtu=1024, clock=lambda: 0, pkeys=pkeys_b)
    qa = a.create_ud_qp(a.create_cq())
    qb = b.create_ud_qp(b.create_cq())
    qa.activate(qkey=0x2222)
    qb.activate(qkey=qkey_b)
    return a, b, qa, qb


def _wr(a: Hca, qb: UdQp, n: int, *, qkey: int = 0x1111, imm: int | None = None) -> tuple[SendWr, bytes]:
    data = os.urandom(n)
    mr = a.reg_mr(bytearray(data))
    op = WrOpcode.SEND if imm is None else WrOpcode.SEND_WITH_IMM
    return SendWr(3, op, [Sge(mr.addr, n, mr.lkey)], imm=imm, ah=AddressHandle(dlid=9, sl=2),
                  remote_qpn=qb.qpn, remote_qkey=qkey), data


@pytest.mark.parametrize("n", [0, 1, 1023, 1024])
@pytest.mark.parametrize("imm", [None, 0x01020304])
def test_ud_send_delivers_with_source(n: int, imm: int | None) -> None:
    a, b, qa, qb = _ud()
    rmr = b.reg_mr(bytearray(2048), Access.LOCAL_WRITE)
    qb.post_recv(RecvWr(8, [Sge(rmr.addr, 2048, rmr.lkey)]))
    wr, data = _wr(a, qb, n, imm=imm)
    sends = qa.post_send(wr)
    assert [(w.wr_id, w.status) for w in qa.send_cq.poll()] == [(3, WcStatus.SUCCESS)]
    (pkt,) = [s.packet for s in sends]
    h = fast.peek(pkt)
    assert (h.opcode, h.lnh, h.sl, h.dlid, h.slid, h.destqp) == (0x65 if imm else 0x64, 2, 2, 9, 5, qb.qpn)
    assert decode_native(pkt) is not None
    assert b.receive(pkt) == []  # no ACKs on UD
    (wc,) = qb.recv_cq.poll()
    assert (wc.wr_id, wc.status, wc.opcode, wc.byte_len, wc.imm, wc.src_qp, wc.slid) == (
        8, WcStatus.SUCCESS, WcOpcode.RECV, n, imm, qa.qpn, 5)
    assert rmr.buf[:n] == data


def test_ud_larger_than_mtu_is_a_local_length_error_and_sqe() -> None:
    a, _b, qa, qb = _ud()
    big, _ = _wr(a, qb, 1025)
    small, _ = _wr(a, qb, 10)
    assert qa.post_send([big, small]) == []
    assert [w.status for w in qa.send_cq.poll()] == [WcStatus.LOC_LEN_ERR, WcStatus.WR_FLUSH_ERR]
    assert qa.state is QpState.SQE
    with pytest.raises(QpStateError):
        qa.post_send(small)
    qa.modify_to_rts()
    assert len(qa.post_send(small)) == 1


def test_ud_qkey_and_pkey_mismatch_dropped_and_counted() -> None:
    a, b, qa, qb = _ud()
    rmr = b.reg_mr(bytearray(64), Access.LOCAL_WRITE)
    for i in range(3):
        qb.post_recv(RecvWr(i, [Sge(rmr.addr, 64, rmr.lkey)]))
    wr, _ = _wr(a, qb, 10, qkey=0x9999)
    for s in qa.post_send(wr):
        b.receive(s.packet)
    assert b.stats.qkey_violations == 1 and qb.stats.qkey_violations == 1
    assert len(qb.recv_cq) == 0
    # a port whose QP is in another partition
    a, b, qa, qb = _ud(pkeys_b=(0x8005,))
    wr, _ = _wr(a, qb, 10)
    for s in qa.post_send(wr):
        b.receive(s.packet)
    assert b.stats.pkey_violations == 1 and len(qb.recv_cq) == 0


def test_ud_without_posted_receive_is_dropped() -> None:
    a, b, qa, qb = _ud()
    wr, _ = _wr(a, qb, 10)
    for s in qa.post_send(wr):
        b.receive(s.packet)
    assert qb.stats.no_recv_drops == 1
