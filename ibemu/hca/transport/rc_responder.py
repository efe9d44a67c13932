"""RC responder: PSN checking, placement into receives and MRs, READ responses, ACK/NAK.

Out-of-order arrivals (adaptive routing sprays a QP's packets over several paths): by
default the responder is IBA's, in order: a request PSN ahead of ePSN is a sequence error,
NAKed once (``seq_naks_sent``), and the requester goes back N. With a reorder window
(``reorder_window`` > 0, ``RcQp.modify_to_rtr(reorder_window=N)``, for
QPs on adaptively routed paths) a request up to N - 1 PSNs ahead is held, not NAKed, and
executed in PSN order once the gap is filled, so placement, completions and ACKs stay those
of in-order delivery; a request beyond the window, or one arriving with the window full,
is a sequence error as before: a lost packet costs a NAK once the window fills behind it,
or the requester's ACK timeout when too few packets follow it (IBA's responder NAKs at the
first packet after the gap). Held packets are copies (the caller's buffer is reused). Only
requests are held: READ responses and ACKs reaching the requester out of order are handled
as before (a response ahead of the expected PSN re-requests the rest). Either way ``out_of_order`` counts the
requests that arrived ahead of ePSN (outside a NAK already outstanding): the reordering the
fabric caused, per QP.
"""

from __future__ import annotations

import logging
import struct
from typing import TYPE_CHECKING

from ibemu.hca.transport.actions import Send
from ibemu.hca.transport.cq import WcOpcode, WcStatus, WorkCompletion
from ibemu.hca.transport.mr import Access, MemoryRegion, scatter
from ibemu.hca.transport.qp import RecvWqe
from ibemu.hca.transport.segment import HEADER_LEN, PSN_HALF, PSN_MASK, READ_RESP_OPS, npkts
from ibemu.wire import fast
from ibemu.wire.opcodes import Op

if TYPE_CHECKING:
    from ibemu.hca.transport.rc import RcQp

log = logging.getLogger(__name__)

_RETH = struct.Struct("!QII")
_U32 = struct.Struct("!I")
_aeth = fast.aeth
_ACK = int(Op.ACKNOWLEDGE)
_REMOTE_WRITE = int(Access.REMOTE_WRITE)
_REMOTE_READ = int(Access.REMOTE_READ)
CREDITS_UNLIMITED = 0x1F
NAK_SEQ = 0x60
NAK_INV_REQ = 0x61
NAK_ACCESS = 0x62
NAK_REM_OP = 0x63
RNR_NAK = 0x20

_SEND_FIRST, _SEND_MIDDLE, _SEND_LAST, _SEND_LAST_IMM, _SEND_ONLY, _SEND_ONLY_IMM = range(6)
_W_FIRST, _W_MIDDLE, _W_LAST, _W_LAST_IMM, _W_ONLY, _W_ONLY_IMM, _READ = range(6, 13)
_NONE, _IN_SEND, _IN_WRITE = 0, 1, 2


class RcResponder:
    """The receive side of one RC QP (IBA 9.7.5 responder behaviour)."""

    def __init__(self, qp: RcQp) -> None:
        self.qp = qp
        self.epsn = 0
        self.msn = 0
        self.min_rnr_timer = 1  # RNR timer code sent in RNR NAKs (1 = 10 us)
        self.nak_pending = False  # one NAK per sequence error / RNR, until ePSN arrives
        self._in = _NONE
        self._recv: RecvWqe | None = None
        self._off = 0
        self._wbuf: bytearray = bytearray()
        self._woff = 0
        self._wleft = 0
        self._wlen = 0
        self.reorder_window = 0
        """Requests held up to this many PSNs ahead of ePSN (0: in order only; module docstring)."""
        self._held: dict[int, tuple[bytes, int, int, int, int]] = {}
        """PSN -> (packet, opcode, BTH byte 1, AckReq, length) of requests held for a gap."""

    def _reply(self, syndrome: int, psn: int, out: list[Send]) -> None:
        qp = self.qp
        out.append(Send(qp.hca.port, qp.tmpl.packet(_ACK, psn, ext=_aeth(syndrome, self.msn))))
        qp.stats.tx_packets += 1

    def _nak(self, syndrome: int, out: list[Send]) -> None:
        st = self.qp.stats
        if syndrome == NAK_ACCESS:
            st.access_naks_sent += 1
        elif syndrome == NAK_SEQ:
            st.seq_naks_sent += 1
        elif syndrome & 0xE0 == RNR_NAK:
            st.rnr_naks_sent += 1
        else:
            st.inv_req_naks_sent += 1
        self.nak_pending = True
        if syndrome != NAK_SEQ and syndrome & 0xE0 != RNR_NAK:
            self._in = _NONE
        self._reply(syndrome, self.epsn, out)

    def _rnr(self, out: list[Send]) -> None:
        self._nak(RNR_NAK | self.min_rnr_timer, out)

    def on_request(self, pkt: bytes | bytearray | memoryview, mv: memoryview, op: int, b1bth: int,
                   ackreq: int, psn: int, n: int, out: list[Send]) -> None:
        self._on_request(pkt, mv, op, b1bth, ackreq, psn, n, out)
        held = self._held
        while held:  # the gap before them filled: the held requests in PSN order
            nxt = held.pop(self.epsn, None)
            if nxt is None:
                epsn = self.epsn
                for k in [k for k in held if (k - epsn) & PSN_MASK >= PSN_HALF]:
                    del held[k]  # passed (a retransmission was executed instead)
                break
            b, op2, b1, ack2, n2 = nxt
            self._on_request(b, memoryview(b), op2, b1, ack2, self.epsn, n2, out)

    def _on_request(self, pkt: bytes | bytearray | memoryview, mv: memoryview, op: int, b1bth: int,
                    ackreq: int, psn: int, n: int, out: list[Send]) -> None:
        qp = self.qp
        d = (psn - self.epsn) & PSN_MASK
        if d:
            if d >= PSN_HALF:  # duplicate: re-ACK, re-read
                qp.stats.duplicates += 1
                if op == _READ:
                    self._read(pkt, psn, out, dup=True)
                elif ackreq:
                    self._reply(CREDITS_UNLIMITED, (self.epsn - 1) & PSN_MASK, out)
                    qp.stats.acks_sent += 1
                return
            if not self.nak_pending:
                qp.stats.out_of_order += 1
            if d < self.reorder_window and len(self._held) < self.reorder_window - 1:
                if psn not in self._held:
                    self._held[psn] = (bytes(pkt), op, b1bth, ackreq, n)
                return
            if self.nak_pending:
                qp.stats.dropped += 1
            else:
                self._nak(NAK_SEQ, out)
            return
        self.nak_pending = False
        end = n - 6 - ((b1bth >> 4) & 3)
        hl = HEADER_LEN[op]
        if end < hl:
            self._nak(NAK_INV_REQ, out)
            return
        payload = mv[hl:end]
        plen = end - hl
        mtu = qp.mtu
        if op <= _SEND_ONLY_IMM:
            if op == _SEND_FIRST or op >= _SEND_ONLY:
                if self._in:
                    self._nak(NAK_INV_REQ, out)
                    return
                if not qp.rq:
                    self._rnr(out)
                    return
                r = qp.rq[0]
                if plen > r.capacity or (op == _SEND_FIRST and plen != mtu):
                    self._length_error(qp.rq.popleft(), out)
                    return
                qp.rq.popleft()
                if plen:
                    scatter(r.segs, 0, payload)
                if op == _SEND_FIRST:
                    self._in = _IN_SEND
                    self._recv = r
                    self._off = plen
                else:
                    imm = _U32.unpack_from(pkt, 20)[0] if op == _SEND_ONLY_IMM else None
                    self._deliver(r.wr_id, WcOpcode.RECV, plen, imm)
            else:
                r2 = self._recv
                if self._in != _IN_SEND or r2 is None:
                    self._nak(NAK_INV_REQ, out)
                    return
                off = self._off
                if off + plen > r2.capacity or (op == _SEND_MIDDLE and plen != mtu):
                    self._in = _NONE
                    self._length_error(r2, out)
                    return
                if plen:
                    scatter(r2.segs, off, payload)
                self._off = off + plen
                if op != _SEND_MIDDLE:
                    self._in = _NONE
                    imm = _U32.unpack_from(pkt, 20)[0] if op == _SEND_LAST_IMM else None
                    self._deliver(r2.wr_id, WcOpcode.RECV, off + plen, imm)
        elif op in (_W_FIRST, _W_ONLY, _W_ONLY_IMM):
            if self._in:
                self._nak(NAK_INV_REQ, out)
                return
            va, rkey, dlen = _RETH.unpack_from(pkt, 20)
            res = qp.hca.mrs.remote(rkey, va, dlen, _REMOTE_WRITE)
            if res is None:
                log.debug("QP %#x: remote access error rkey %#x va %#x+%d", qp.qpn, rkey, va, dlen)
                self._nak(NAK_ACCESS, out)
                return
            mr, off = res
            if (plen != dlen) if op != _W_FIRST else (plen != mtu or dlen <= mtu):
                self._nak(NAK_INV_REQ, out)
                return
            if op == _W_ONLY_IMM and not qp.rq:
                self._rnr(out)
                return
            buf = mr.buf
            if plen:
                buf[off : off + plen] = payload
            if op == _W_FIRST:
                self._in = _IN_WRITE
                self._wbuf = buf
                self._woff = off + plen
                self._wleft = dlen - plen
                self._wlen = dlen
            elif op == _W_ONLY_IMM:
                self._deliver(qp.rq.popleft().wr_id, WcOpcode.RECV_RDMA_WITH_IMM, dlen,
                              _U32.unpack_from(pkt, 36)[0])
            else:
                self.msn += 1
        elif op <= _W_LAST_IMM:
            left = self._wleft
            if self._in != _IN_WRITE or (plen != mtu or plen >= left if op == _W_MIDDLE else plen != left):
                self._nak(NAK_INV_REQ, out)
                return
            if op == _W_LAST_IMM and not qp.rq:
                self._rnr(out)
                return
            off = self._woff
            self._wbuf[off : off + plen] = payload
            self._woff = off + plen
            self._wleft = left - plen
            if op != _W_MIDDLE:
                self._in = _NONE
                self._wbuf = bytearray()
                if op == _W_LAST_IMM:
                    self._deliver(qp.rq.popleft().wr_id, WcOpcode.RECV_RDMA_WITH_IMM, self._wlen,
                                  _U32.unpack_from(pkt, 20)[0])
                else:
                    self.msn += 1
        elif op == _READ:
            if self._in:
                self._nak(NAK_INV_REQ, out)
                return
            self._read(pkt, psn, out, dup=False)
            return
        else:
            self._nak(NAK_INV_REQ, out)  # atomics and anything else: not supported
            return
        self.epsn = (psn + 1) & PSN_MASK
        if ackreq:
            self._reply(CREDITS_UNLIMITED, psn, out)
            qp.stats.acks_sent += 1

    def _deliver(self, wr_id: int, opcode: WcOpcode, byte_len: int, imm: int | None) -> None:
        qp = self.qp
        self.msn += 1
        qp.recv_cq.push(WorkCompletion(wr_id, WcStatus.SUCCESS, opcode, qp.qpn, byte_len, imm,
                                       qp.remote_qpn, qp.path_dlid))

    def _length_error(self, r: RecvWqe, out: list[Send]) -> None:
        qp = self.qp
        qp.recv_cq.push(WorkCompletion(r.wr_id, WcStatus.LOC_LEN_ERR, WcOpcode.RECV, qp.qpn))
        self._nak(NAK_INV_REQ, out)

    def _read(self, pkt: bytes | bytearray | memoryview, psn: int, out: list[Send], *, dup: bool) -> None:
        qp = self.qp
        va, rkey, dlen = _RETH.unpack_from(pkt, 20)
        res = qp.hca.mrs.remote(rkey, va, dlen, _REMOTE_READ)
        if res is None:
            if not dup:
                self._nak(NAK_ACCESS, out)
            return
        mr, off = res
        mtu = qp.mtu
        n = npkts(dlen, mtu)
        if not dup:
            self.msn += 1
            self.epsn = (psn + n) & PSN_MASK
        self._respond(mr, off, dlen, psn, n, out)

    def _respond(self, mr: MemoryRegion, off: int, dlen: int, psn: int, n: int, out: list[Send]) -> None:
        qp = self.qp
        tmpl = qp.tmpl
        port = qp.hca.port
        mtu = qp.mtu
        data = memoryview(mr.buf)[off : off + dlen]
        ext = _aeth(CREDITS_UNLIMITED, self.msn)
        first, middle, last, only = READ_RESP_OPS
        for i in range(n):
            if n == 1:
                op, e = only, ext
            elif i == 0:
                op, e = first, ext
            elif i == n - 1:
                op, e = last, ext
            else:
                op, e = middle, b""
            out.append(Send(port, tmpl.packet(op, (psn + i) & PSN_MASK, data[i * mtu : (i + 1) * mtu], ext=e)))
        qp.stats.tx_packets += n
