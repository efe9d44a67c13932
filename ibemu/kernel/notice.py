"""Fault notices handled in the kernel: the eBPF SMA's second program (``bpf_src/notice.c``).

The kernel SMA (``sma``) checks a FaultNotice (ibemu's vendor attribute 0xFF32,
``ibemu.agents.switch``) like any SMP it takes: canonical frame, CRCs, a port it knows whose
link is up, a directed route at its last hop with DrDLID permissive; one hop (HopCount 1),
method Trap, on a switch. It then tail-calls this program (``sma_tail[0]``) with the device
and the ingress port in ``skb->cb[1..2]``. The program does what the switch agent's
``_rx_fault_notice`` does, in the kernel, so that a notice costs each hop one program run
instead of a trip through the agent host's loop (measured before: 2-7 ms a hop, mostly
waiting for the loop; README, "Fault notices between switches"):

- it takes the notice only if the switch's FailoverConfig (published by the agent into
  ``sma_attr`` as ``(0xFF31, 0)``, as every other image) has notices on and the ingress port
  among the ports facing a switch, the switch has at most 63 ports (the per-LID state keeps
  a bit per port) and its maps are there; anything else goes up to the agent unchanged,
  which counts and ignores it (``notice_ignored``, ``notice_not_neighbour``);
- for each LID of the bitmap (0 < LID <= LinearFDBTop) whose ways include the ingress port
  (the ways: the LFT entry, the SM's entry of a LID repaired before, the alternates of
  ``ibemu_lft_alt``, reached through the map of maps ``sma_alt``; each with its link up in
  the agent's PortInfo and not a dead end) the port becomes a dead end; if it was the way in
  use, the LID moves to the first other way (the raw LFT ``sma_lft``, shared with the
  agent's ``Lft``, and the forwarding map ``ibemu_lft`` written, as ``LftUpdate(local=True)``
  would), else, if none is left, it is announced onwards once;
- the LIDs to announce go out at once: the frame is rewritten into the agent's notice
  (bitmap, TID, hop fields, both paths cleared, ICRC and VCRC recomputed once) and cloned to
  every other port facing a switch whose link is up (``bpf_clone_redirect``), each clone with
  InitialPath[1] = its port and both CRCs patched by a table (``sma_ndelta``: the CRCs are
  linear, so setting one byte of a fixed-length frame changes them by a constant per value);
- one record per notice to the ring buffer ``sma_nlog`` (:class:`NoticeRecord`): what moved
  (entry before and after), what was noted, lost and announced, how many notices went out,
  the kernel's time. The frame itself is consumed.

The agent stays the reference model and sees the same state: the agent host reads the
records and hands each to ``SwitchAgent.notice_in_kernel``, which updates the agent's dead
ends, repairs, announcements and counters from it and writes the ``local_failover`` and
``fault_notice_sent`` events stamped with the kernel's time, acting no second time (no LFT
write, nothing sent). The kernel keeps its own state per (switch, 64-LID block) in
``sma_nstate`` (dead-end port bits, the SM's entry and the repaired entry, the LIDs
announced), tagged with the FailoverConfig generation: a new generation published by the
agent (the SM's ``groups_programmed``) ends the kernel's repairs with the agent's.
``tests/integration/test_notice_bpf.py`` proves kernel and agent equal on generated tables
and notices (BPF_PROG_TEST_RUN).

A switch's own port losing its signal is announced by the same program (``announce_loss``,
LOSS: ``skb->cb[0]`` bit 8): at a cut the agent host runs it on a notice of the LIDs the LFT
sends to the lost port, as if that port's neighbour had sent it, with three differences:
the port counts as up and in use whatever its PortInfo says yet, no dead end is noted and
nothing moves (the forwarding classifier takes the alternates of a port without signal by
itself), and only an announcement leaves a record (flagged LOSS, taken by
``SwitchAgent.lost_in_kernel``). It is the agent's ``announce_port_lost``, proven equal by
the same test file. The run is a BPF_PROG_TEST_RUN with the switch's device as the packet's
(``bpf.skb_ctx``), from a thread inside the switch's namespace (a test run's redirects go to
the devices of the namespace the device is looked up in): the clones leave from there as
the softirq's would, and the cascade they set off runs inside that system call. Before, the
agent built and sent these notices in Python in the cutting thread: 180-250 us of CPU for an
aggregation switch above a k=8 cut (hand-timed). A LOSS run has its own per-CPU work record
(a softirq may interrupt it on its CPU); runs from two threads at once on one CPU would
share it (the agent host cuts from one thread at a time).

Deviations (documented, deliberate):
- The onward notices' TID: ``node GUID & 0xFFFF << 48 | 1 << 47 | 1 << 46 | n``, one per
  announcement for all its ports (the agent: bit 46 clear, one per port sent); their BTH PSN
  is the received notice's. Nothing reads either.
- LIDs the agent announced itself on a carrier loss are not in the kernel's state: a notice
  that later makes the kernel find them without a way announces them once more, and the
  neighbours ignore a LID they no longer route through the sender.
- LFT Sets the agent answers itself end its repairs of that block (``_forget_repairs``); the
  kernel's state of those LIDs stays until the next generation.
- The TID counter is not atomic (two CPUs announcing for one switch at once may repeat one).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass

from ibemu.kernel import bpf
from ibemu.wire import madcodec as mb
from ibemu.wire.madpacket import MAD_OFFSET, frame_mad, reseal

SRC = os.path.join(os.path.dirname(__file__), "bpf_src", "notice.c")
TX_SRC = os.path.join(os.path.dirname(__file__), "bpf_src", "notice_tx.c")
ATTR_FAILOVER_CONFIG = 0xFF31
FRAME = 290
"""A management packet's bytes, LRH .. VCRC (the program sees 14 more: Ethernet)."""
IP1_AT = 28 + 128 + 1
"""InitialPath[1] in the packet (LRH at 0)."""
_REC = struct.Struct("=QIIIHH64s64s64s64s64s512s512s")
LOSS = 1 << 8
"""``skb->cb[0]`` of a LOSS run (``announce_loss``); a record's flag bit 0."""
ETH_P_IB = 0x88B5
LIDS_PER_NOTICE = 512
TRAP = 5
ATTR_FAULT_NOTICE = 0xFF32


def crc_deltas() -> bytes:
    """``sma_ndelta``: per value v of InitialPath[1], (ICRC, VCRC) of a management packet
    with v there XOR the same packet with 0 there (any packet: CRCs of equal lengths are
    linear), 256 entries of two u32."""
    base = bytearray(FRAME)
    base[0] = 0xF0
    base[1] = 0x02
    zero = reseal(bytearray(base))
    out = bytearray()
    for v in range(256):
        b = bytearray(base)
        b[IP1_AT] = v
        sealed = reseal(b)
        icrc = int.from_bytes(sealed[-6:-2], "little") ^ int.from_bytes(zero[-6:-2], "little")
        vcrc = int.from_bytes(sealed[-2:], "little") ^ int.from_bytes(zero[-2:], "little")
        out += struct.pack("=II", icrc, vcrc)
    return bytes(out)


def _bits(bitmap: bytes, base: int) -> list[int]:
    return [base + i * 8 + b for i, byte in enumerate(bitmap) if byte for b in range(8) if byte >> b & 1]


def loss_frame(block: int, lids: Iterable[int]) -> bytes:
    """The frame a LOSS run starts from: a FaultNotice as the agent builds it (one-hop
    directed route, permissive LIDs, VL15, TID 0) for ``lids`` of 512-LID ``block``, behind an
    Ethernet header the program rewrites per port."""
    bitmap = bytearray(64)
    for lid in lids:
        off = lid - block * LIDS_PER_NOTICE
        bitmap[off >> 3] |= 1 << (off & 7)
    mad = bytearray(mb.dr_smp(TRAP, ATTR_FAULT_NOTICE, path=[0], modifier=block, tid=0, data=bytes(bitmap)))
    mad[mb.M_HOP_POINTER] = 1  # at its one hop, as a neighbour's notice arrives
    return bytes(12) + ETH_P_IB.to_bytes(2, "big") + frame_mad(mad, dlid=0xFFFF, slid=0xFFFF, dqp=0, sqp=0,
                                                               qkey=0, vl=15)


def announce_loss(prog_fd: int, dev: int, port: int, ifindex: int, lids: Iterable[int]) -> list[int] | None:
    """Port ``port`` of switch ``dev`` has lost its signal: the kernel announces the LIDs of
    ``lids`` (those the LFT sends to the port) that have no other way, as the agent's
    ``announce_port_lost`` would, and sends the notices itself (``notice.c``, LOSS). Runs the
    program (BPF_PROG_TEST_RUN, the GIL kept) on the device ``ifindex``, which the calling
    thread must see (its network namespace: the program's clones go to that namespace's
    devices). Returns the LIDs announced now (the kernel's record follows on the ring), or
    None when the program declined (notices off, a switch it does not take: the agent's
    own ``announce_port_lost`` then, which declines likewise or does the work)."""
    blocks: dict[int, list[int]] = {}
    for lid in lids:
        blocks.setdefault(lid // LIDS_PER_NOTICE, []).append(lid)
    fresh: list[int] = []
    for block, some in sorted(blocks.items()):
        ctx = bpf.skb_ctx(ifindex=ifindex, cb=(LOSS, dev, port))
        ret, out, _ns = bpf.test_run(prog_fd, loss_frame(block, some), ctx_in=ctx, hold_gil=True)
        if ret != bpf.TC_ACT_SHOT:
            return None
        mad = 14 + MAD_OFFSET
        if len(out) >= mad + 128 and any(out[mad + 8:mad + 16]):  # a TID: it announced
            fresh += _bits(out[mad + 64:mad + 128], block * LIDS_PER_NOTICE)
    return fresh


def warm(prog_fd: int) -> None:
    """A LOSS run on no switch (the program declines at once): the system call's path made
    warm for the real one that follows. A first test run after the thread slept costs ~100 us
    more than the next (hand-timed, this machine, CPUs awake: 83-216 us against 13-18 us),
    which the agent host takes before a cut's stamp, as it readies the netlink request."""
    bpf.test_run(prog_fd, _WARM_FRAME, ctx_in=_WARM_CTX, hold_gil=True)


@dataclass(frozen=True, slots=True)
class NoticeRecord:
    """One notice the kernel handled (``sma_nlog``); LIDs absolute."""

    t_ns: int
    """``CLOCK_MONOTONIC`` once the maps had every move (before the onward notices left)."""
    dev: int
    port: int
    block: int
    sent: int
    """Onward notices sent (ports)."""
    lids: tuple[int, ...]
    moved: dict[int, tuple[int, int]]
    """LID -> (entry before, entry after)."""
    noted: tuple[int, ...]
    lost: tuple[int, ...]
    fresh: tuple[int, ...]
    loss: bool = False
    """A LOSS run's record (``announce_loss``): the switch's own port, LIDs announced."""

    @classmethod
    def parse(cls, raw: bytes | memoryview) -> NoticeRecord:
        (t_ns, dev, port, block, sent, flags, bitmap, moved, noted, lost, fresh, prev,
         now) = _REC.unpack_from(raw)
        base = block * 512
        return cls(t_ns, dev, port, block, sent, tuple(_bits(bitmap, base)),
                   {lid: (prev[lid - base], now[lid - base]) for lid in _bits(moved, base)},
                   tuple(_bits(noted, base)), tuple(_bits(lost, base)), tuple(_bits(fresh, base)),
                   bool(flags & 1))


class NoticeLog(bpf.RecordRing[NoticeRecord]):
    """The agent host's reader of ``sma_nlog``: ``fd`` polls readable when records wait."""

    def __init__(self, ring: bpf.Map) -> None:
        super().__init__(ring, _REC.size, NoticeRecord.parse)


_WARM_FRAME = loss_frame(0, ())
_WARM_CTX = bpf.skb_ctx(cb=(LOSS, 0xFFFFFFFF, 1))  # no such device: declined at once

__all__ = ["ATTR_FAILOVER_CONFIG", "LOSS", "NoticeLog", "NoticeRecord", "announce_loss", "crc_deltas", "loss_frame", "warm"]
