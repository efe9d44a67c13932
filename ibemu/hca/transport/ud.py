"""Unreliable-datagram queue pair: SEND Only (with/without Imm) with DETH, Q_Key checked."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ibemu.hca.transport.actions import Send
from ibemu.hca.transport.cq import CompletionQueue, WcOpcode, WcStatus, WorkCompletion
from ibemu.hca.transport.mr import gather, scatter
from ibemu.hca.transport.qp import QpState, QpStateError, QpType, QueuePair
from ibemu.hca.transport.segment import PSN_MASK
from ibemu.hca.transport.wr import SendWr, WrOpcode
from ibemu.wire import fast
from ibemu.wire.fast import NativeTemplate

if TYPE_CHECKING:
    from ibemu.hca.transport.hca import Hca

UD_SEND_ONLY = 0x64
UD_SEND_ONLY_IMM = 0x65
_DETH = struct.Struct("!II")
_U32 = struct.Struct("!I")


class UdQp(QueuePair):
    """A UD QP: no connection, one MTU per datagram, no ACKs; GRH-less (LNH=2).

    Received datagrams land at offset 0 of the receive buffer (no 40-byte GRH area).
    """

    qp_type = QpType.UD

    def __init__(self, hca: Hca, qpn: int, send_cq: CompletionQueue, recv_cq: CompletionQueue,
                 psn: int, max_send_wr: int, max_recv_wr: int) -> None:
        super().__init__(hca, qpn, send_cq, recv_cq, psn, max_recv_wr)
        self.qkey = 0
        self._templates: dict[tuple[int, int, int], NativeTemplate] = {}

    def modify_to_init(self, *, pkey_index: int = 0, qkey: int = 0) -> None:
        super().modify_to_init(pkey_index=pkey_index)
        self.qkey = qkey & 0xFFFFFFFF

    def modify_to_rtr(self) -> None:
        self._need(QpState.INIT)
        self.state = QpState.RTR

    def modify_to_rts(self) -> None:
        """RTR -> RTS, or SQE -> RTS after a send error."""
        self._need(QpState.RTR, QpState.SQE)
        self.state = QpState.RTS

    def activate(self, *, qkey: int, pkey_index: int = 0) -> None:
        """RESET -> INIT -> RTR -> RTS with ``qkey``."""
        self.modify_to_init(pkey_index=pkey_index, qkey=qkey)
        self.modify_to_rtr()
        self.modify_to_rts()

    def enter_error(self) -> None:
        self.state = QpState.ERROR
        self.flush_recv()

    def post_send(self, wrs: SendWr | Sequence[SendWr]) -> list[Send]:
        batch = [wrs] if isinstance(wrs, SendWr) else list(wrs)
        if self.state is not QpState.RTS:
            raise QpStateError(f"QP {self.qpn:#x} is {self.state.name}: post_send needs RTS")
        out: list[Send] = []
        hca = self.hca
        for wr in batch:
            if wr.opcode not in (WrOpcode.SEND, WrOpcode.SEND_WITH_IMM) or wr.ah is None:
                raise ValueError("UD QPs send SEND / SEND_WITH_IMM to an address handle")
            if self.state is QpState.SQE:  # the rest of a batch behind a send error
                self.send_cq.push(WorkCompletion(wr.wr_id, WcStatus.WR_FLUSH_ERR, WcOpcode.SEND, self.qpn))
                continue
            data = gather(hca.mrs.resolve(wr.sg_list, write=False))
            if len(data) > hca.mtu:  # a send error: the QP stops in SQE until modify_to_rts()
                self.send_cq.push(WorkCompletion(wr.wr_id, WcStatus.LOC_LEN_ERR, WcOpcode.SEND, self.qpn))
                self.state = QpState.SQE
                continue
            key = (wr.ah.dlid, wr.ah.sl, wr.remote_qpn)
            tmpl = self._templates.get(key)
            if tmpl is None:
                tmpl = NativeTemplate(slid=hca.lid, dlid=wr.ah.dlid, destqp=wr.remote_qpn,
                                      pkey=self.pkey, sl=wr.ah.sl, vl=wr.ah.sl)
                self._templates[key] = tmpl
            ext = fast.deth(wr.remote_qkey, self.qpn)
            op = UD_SEND_ONLY
            if wr.opcode is WrOpcode.SEND_WITH_IMM:
                op = UD_SEND_ONLY_IMM
                ext += fast.immdt(wr.imm or 0)
            out.append(Send(hca.port, tmpl.packet(op, self.sq_psn, data, se=wr.solicited, ext=ext)))
            self.sq_psn = (self.sq_psn + 1) & PSN_MASK
            self.stats.tx_packets += 1
            if wr.signaled:
                self.send_cq.push(WorkCompletion(wr.wr_id, WcStatus.SUCCESS, WcOpcode.SEND, self.qpn, len(data)))
        return out

    def receive(self, pkt: bytes | bytearray | memoryview, mv: memoryview, op: int, b1bth: int,
                ackreq: int, psn: int, n: int, out: list[Send]) -> None:
        if self.state not in (QpState.RTR, QpState.RTS, QpState.SQE) or op not in (UD_SEND_ONLY, UD_SEND_ONLY_IMM):
            self.stats.dropped += 1
            return
        qkey, srcqp = _DETH.unpack_from(pkt, 20)
        if qkey != self.qkey:
            self.stats.qkey_violations += 1
            self.hca.stats.qkey_violations += 1
            return
        hl = 28 if op == UD_SEND_ONLY else 32
        end = n - 6 - ((b1bth >> 4) & 3)
        if end < hl:
            self.stats.dropped += 1
            return
        self.stats.rx_packets += 1
        if not self.rq:
            self.stats.no_recv_drops += 1
            return
        r = self.rq.popleft()
        plen = end - hl
        imm = _U32.unpack_from(pkt, 28)[0] if op == UD_SEND_ONLY_IMM else None
        slid = (pkt[6] << 8) | pkt[7]
        if plen > r.capacity:
            self.recv_cq.push(WorkCompletion(r.wr_id, WcStatus.LOC_LEN_ERR, WcOpcode.RECV, self.qpn))
            return
        if plen:
            scatter(r.segs, 0, mv[hl:end])
        self.recv_cq.push(WorkCompletion(r.wr_id, WcStatus.SUCCESS, WcOpcode.RECV, self.qpn, plen, imm,
                                         srcqp & 0xFFFFFF, slid))

    def tick(self, now: int, out: list[Send]) -> None:
        return

    def next_deadline(self) -> int | None:
        return None
