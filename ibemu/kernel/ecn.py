"""ECN marking at the routers of a RoCE fabric: a virtual queue per port, in eBPF on its egress.

An emulated cable has no line rate (a veth hands a frame to its peer at once), so no queue
ever builds where a RED or fq_codel qdisc could mark (and this kernel has neither). Each
router port instead keeps a virtual queue (a phantom queue): every frame adds its length,
and the queue drains at ``line_gbps``; an ECN-capable (ECT) IPv4 frame that finds more than
``mark_kb`` in it gets Congestion Experienced (``bpf_skb_ecn_set_ce``, which also fixes the
IP checksum). The RoCE ports' receivers answer CE with CNPs and their senders slow down
(DCQCN, ``ibemu.hca.dcqcn``). One direct-action ``bpf`` program per port, its queue in one
array map slot (two u64: last update, bytes queued); updates from two CPUs may race, which
only blurs the estimate.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

from ibemu.kernel import bpf, clsact
from ibemu.kernel.bpf import R0, R1, R2, R3, R4, R6, R7, R8, R10, Asm

log = logging.getLogger(__name__)

FN_MAP_LOOKUP_ELEM = 1
FN_KTIME_GET_NS = 5
FN_SKB_ECN_SET_CE = 97
PROG_NAME = "roce_ecn"
SLOT = 16
"""Bytes of one port's queue state: last update (ns), bytes queued."""


@dataclass(frozen=True, slots=True)
class EcnMarking:
    mark_kb: float
    """Mark CE when a frame finds more than this many KiB in the port's virtual queue."""
    line_gbps: float
    """The rate the virtual queue drains at."""

    @property
    def bytes_per_1024ns(self) -> int:
        return max(1, round(self.line_gbps * 128))

    @property
    def threshold_bytes(self) -> int:
        return round(self.mark_kb * 1024)


def marking_program(ecn: EcnMarking, map_fd: int, slot: int) -> bytes:
    """SCHED_CLS, direct action, never drops (TC_ACT_UNSPEC: the next filter decides, and
    without one the frame passes): the virtual queue of map slot ``slot``."""
    a = Asm()
    a.mov(R6, R1)
    a.ldx(4, R2, R6, bpf.SKB_DATA)
    a.ldx(4, R3, R6, bpf.SKB_DATA_END)
    a.mov(R4, R2)
    a.alu64("add", R4, 16)
    a.jmp("jgt", R4, R3, "pass", reg=True)
    a.ldx(2, R4, R2, 12)
    a.jmp("jne", R4, 0x0008, "pass")          # IPv4 (little-endian load of 0x0800)
    a.ldx(1, R4, R2, 15)
    a.alu64("and", R4, 3)
    a.jmp("jeq", R4, 0, "pass")               # Not-ECT: nothing to mark
    a.st(4, R10, -4, slot)
    a.ld_map_fd(R1, map_fd)
    a.mov(R2, R10)
    a.alu64("add", R2, -4)
    a.call(FN_MAP_LOOKUP_ELEM)
    a.jmp("jeq", R0, 0, "pass")
    a.mov(R7, R0)
    a.call(FN_KTIME_GET_NS)
    a.mov(R8, R0)                             # now
    a.ldx(8, R1, R7, 0)                       # last update
    a.ldx(8, R2, R7, 8)                       # bytes queued
    a.movi(R3, 0)
    a.jmp("jlt", R8, R1, "drained", reg=True)  # another CPU stamped later: no drain
    a.mov(R3, R8)
    a.alu64("sub", R3, R1, reg=True)
    a.alu64("rsh", R3, 10)
    a.alu64("mul", R3, ecn.bytes_per_1024ns)
    a.label("drained")
    a.jmp("jge", R3, R2, "empty", reg=True)
    a.alu64("sub", R2, R3, reg=True)
    a.goto("add")
    a.label("empty")
    a.movi(R2, 0)
    a.label("add")
    a.ldx(4, R4, R6, bpf.SKB_LEN)
    a.alu64("add", R2, R4, reg=True)
    a.stx(8, R7, 0, R8)
    a.stx(8, R7, 8, R2)
    a.jmp("jle", R2, ecn.threshold_bytes, "pass")
    a.mov(R1, R6)
    a.call(FN_SKB_ECN_SET_CE)
    a.label("pass")
    a.movi(R0, bpf.TC_ACT_UNSPEC)                 # go on: a cable impairment filter may follow
    a.exit()
    return a.assemble()


class EcnMarker:
    """The virtual queues of a fabric's router ports (the map lives as long as the filters)."""

    def __init__(self, ecn: EcnMarking, ports: Sequence[tuple[str, str]]) -> None:
        self.ecn = ecn
        self.ports = list(ports)
        self.map = bpf.Map(bpf.BPF_MAP_TYPE_ARRAY, 4, SLOT, max(1, len(self.ports)), name="roce_ecn_vq")

    def install(self) -> int:
        """A marking filter on the egress of every port (clsact created); returns how many."""
        by_ns: dict[str, list[tuple[int, str]]] = {}
        for slot, (ns, ifname) in enumerate(self.ports):
            by_ns.setdefault(ns, []).append((slot, ifname))
        for ns, ends in by_ns.items():
            progs = [bpf.load_program(marking_program(self.ecn, self.map.fd, slot), name=PROG_NAME)
                     for slot, _ in ends]
            try:  # priority 1: before any impairment
                clsact.attach_bpf(ns, [clsact.BpfHook(ifname, prog) for (_, ifname), prog in zip(ends, progs, strict=True)],
                                  parent=clsact.EGRESS, prio=1, name=PROG_NAME, what=f"{ns}: ECN marking")
            finally:
                for prog in progs:
                    os.close(prog)
        log.info("ECN marking %s on %d router ports", self.ecn, len(self.ports))
        return len(self.ports)

    def close(self) -> None:
        self.map.close()  # the filters hold their own references
