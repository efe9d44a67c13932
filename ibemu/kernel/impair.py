"""Lossy, slower Ethernet cables for a RoCE fabric: an eBPF program on every cable end's egress.

``fabric: {kind: roce, loss_pct: P, delay_us: D}`` makes every cable, in each direction,
drop P% of its frames and add D us. This kernel has neither netem nor gact, so both are done
by one direct-action ``bpf`` filter on the clsact egress hook of every cable end (hosts and
routers): ``bpf_get_prandom_u32() < P/100 * 2^32`` drops the frame (``TC_ACT_SHOT``), and
the delay sets ``skb->tstamp = bpf_ktime_get_ns() + D`` (earliest departure time), which
only the ``fq`` qdisc honours: each cable end then gets a root ``fq`` qdisc. A kernel without
``sch_fq`` (this machine's: no CONFIG_NET_SCH_FQ, nor netem, nor etf) cannot delay frames
at all; :func:`check_supported` says so before anything is built.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import socket
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from ibemu.errors import ConfigError
from ibemu.kernel import bpf, clsact, netlink
from ibemu.kernel.bpf import R0, R1, R2, R6, Asm
from ibemu.kernel.commands import batch

log = logging.getLogger(__name__)

FN_KTIME_GET_NS = 5
FN_GET_PRANDOM_U32 = 7
CLONE_NEWNET = 0x40000000
SKB_TSTAMP = 152
"""Offset of ``tstamp`` (u64) in ``struct __sk_buff``."""
PROG_NAME = "roce_impair"
FQ_LIMIT = 100_000
FQ_FLOW_LIMIT = 10_000
"""Frames fq may hold (in all, per flow): a whole RC window of a flow waits out its delay."""


@dataclass(frozen=True, slots=True)
class Impairment:
    loss_pct: float = 0.0
    delay_us: float = 0.0

    def __bool__(self) -> bool:
        return bool(self.loss_pct or self.delay_us)


def loss_threshold(loss_pct: float) -> int:
    """The u32 below which a random draw drops the frame."""
    return min(0xFFFFFFFF, round(loss_pct / 100 * (1 << 32)))


def impair_program(imp: Impairment) -> bytes:
    """SCHED_CLS, direct action: drop ``loss_pct``% of frames, stamp the rest now + ``delay_us``."""
    a = Asm()
    a.mov(R6, R1)
    if imp.loss_pct:
        a.call(FN_GET_PRANDOM_U32)
        a.alu32("mov", R2, loss_threshold(imp.loss_pct))  # zero-extended: an unsigned compare
        a.jmp("jlt", R0, R2, "drop", reg=True)
    if imp.delay_us:
        a.call(FN_KTIME_GET_NS)
        a.alu64("add", R0, round(imp.delay_us * 1000))
        a.stx(8, R6, SKB_TSTAMP, R0)
    a.movi(R0, bpf.TC_ACT_OK)
    a.exit()
    if imp.loss_pct:
        a.label("drop")
        a.movi(R0, bpf.TC_ACT_SHOT)
        a.exit()
    return a.assemble()


@functools.cache
def has_sch_fq() -> bool:
    """Whether this kernel has the fq qdisc: tried on ``lo`` of a throw-away network namespace
    (a thread's own, gone with the thread)."""
    found: list[bool] = []

    def probe() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(CLONE_NEWNET) != 0:
            log.info("fq probe: unshare: %s", os.strerror(ctypes.get_errno()))
            found.append(False)
            return
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, 0)
        try:
            sock.bind((0, 0))
            body = clsact.TCMSG.pack(0, 1, 0, clsact.TC_H_ROOT, 0) + netlink.attr(clsact.TCA_KIND, b"fq\0")
            create = netlink.NLM_F_REQUEST | netlink.NLM_F_ACK | netlink.NLM_F_CREATE | netlink.NLM_F_EXCL
            try:
                netlink.request(sock, [netlink.message(clsact.RTM_NEWQDISC, create, 1, body)], "fq probe")
                found.append(True)
            except Exception as exc:
                log.info("no sch_fq: %s", exc)
                found.append(False)
        finally:
            sock.close()

    t = threading.Thread(target=probe, name="fq-probe")
    t.start()
    t.join()
    return bool(found and found[0])


def check_supported(imp: Impairment, where: str = "fabric.delay_us") -> None:
    """What this kernel cannot do of ``imp``, said before anything is built."""
    if imp.delay_us and not has_sch_fq():
        raise ConfigError(f"a cable delay needs the fq qdisc (it holds frames to the departure time the eBPF "
                          f"program sets), and this kernel ({os.uname().release}) has none (CONFIG_NET_SCH_FQ); "
                          "loss_pct works without it", where)


def _fq_lines(ifnames: Iterable[str]) -> list[str]:
    return [f"qdisc replace dev {i} root fq limit {FQ_LIMIT} flow_limit {FQ_FLOW_LIMIT}" for i in ifnames]


def impair_ports(ports: Iterable[tuple[str, str, bool]], imp: Impairment) -> int:
    """The impairment on the egress of each ``(namespace, interface, has_clsact)``; returns the
    number of cable ends impaired. ``has_clsact``: the port already has its clsact qdisc (a
    host's, from its ingress guard)."""
    check_supported(imp)
    prog = bpf.load_program(impair_program(imp), name=PROG_NAME)
    n = 0
    try:
        by_ns: dict[str, list[clsact.BpfHook]] = {}
        for ns, ifname, has_clsact in ports:
            by_ns.setdefault(ns, []).append(clsact.BpfHook(ifname, prog, add_clsact=not has_clsact))
        for ns, hooks in by_ns.items():  # priority 2: after the ECN marking
            clsact.attach_bpf(ns, hooks, parent=clsact.EGRESS, prio=2, name=PROG_NAME,
                              what=f"{ns}: cable impairment")
            if imp.delay_us:
                batch("tc", _fq_lines(h.ifname for h in hooks), netns=ns)
            n += len(hooks)
    finally:
        os.close(prog)  # the filters keep it alive
    log.info("cable impairment %s on %d cable ends", imp, n)
    return n

