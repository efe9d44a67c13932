"""perftest-like tests over real HCA ports: ``write_bw``, ``read_bw``, ``send_bw``, ``write_lat``,
``send_lat``.

A test has two sides, each a ``Side`` (QPs, a CQ and a registered buffer on one ``HcaPort``),
which exchange ``info()`` out of band and ``connect``. Then the client side drives the test
and the server side serves it (for SEND it keeps receives posted; for the latency tests it
answers every ping). Both sides may live in one process (the scenario runner) or in two
(``ibemu perf`` on two hosts, exchanging the info over a UNIX socket).

As in perftest: one buffer of ``size`` bytes per QP on each side, every iteration moves it
once; ``tx_depth`` messages in flight per QP; completions requested every ``cq_mod``
messages; bandwidth in MB/s of 2^20 bytes.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from ibemu import clock
from ibemu.hca.nic import HcaPort
from ibemu.hca.transport import (
    Access,
    CompletionQueue,
    MemoryRegion,
    PathRecord,
    QpInfo,
    RcQp,
    RecvWr,
    SendWr,
    Sge,
    WcOpcode,
    WcStatus,
    WrOpcode,
)

BW_TESTS = ("write_bw", "read_bw", "send_bw")
LAT_TESTS = ("write_lat", "send_lat")
TESTS = BW_TESTS + LAT_TESTS
_OPS = {"write": WrOpcode.RDMA_WRITE, "read": WrOpcode.RDMA_READ, "send": WrOpcode.SEND}


class TransportError(RuntimeError):
    """A work request completed in error (retries exhausted, remote access error, ...)."""


@dataclass
class PerfOptions:
    """The options perftest users know (``-s``, ``-n``, ``-D``, ``-q``, ``-t``, ``-m``, ``-b``)."""

    test: str = "write_bw"
    size: int = 65536
    iterations: int = 5000
    duration_s: float | None = None
    qps: int = 1
    tx_depth: int = 128
    mtu: int = 4096
    bidirectional: bool = False
    cq_mod: int = 16
    timeout: int = 14
    """Local ACK timeout exponent (4.096 us x 2^timeout)."""
    retry_cnt: int = 7
    window: int = 512
    """Packets a QP may have unacknowledged: what the receiving socket can queue (a real HCA
    has link credits; a veth drops what the receiver's queue cannot take)."""
    ack_every: int = 128
    """AckReq every N packets (and on each signaled message's last): fewer ACKs, fewer wake-ups
    (16 -> 64 -> 128 took the sender from 9.4 to 5.8 to ~5.5 us of user time per packet)."""
    reorder_window: int = 0
    """RC responders hold requests up to this many PSNs ahead instead of NAKing them (paths
    under adaptive routing; ``hca.transport.rc_responder``); 0: in order only."""
    rate_pps: float | None = None
    """Bandwidth tests: post at most this many messages per second (all QPs together), on the
    emulated clock; None: as fast as the window allows (perftest's behaviour)."""

    def __post_init__(self) -> None:
        if self.test not in TESTS:
            raise ValueError(f"unknown test {self.test!r}: one of {', '.join(TESTS)}")
        if not 1 <= self.size <= 1 << 30:
            raise ValueError("size must be 1 B .. 1 GiB")
        if self.iterations < 1 and self.duration_s is None:
            raise ValueError("iterations must be >= 1")
        if not 1 <= self.qps <= 256 or not 1 <= self.tx_depth <= 4096 or self.cq_mod < 1:
            raise ValueError("qps 1..256, tx_depth 1..4096, cq_mod >= 1")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ValueError("duration must be > 0")
        if self.rate_pps is not None and not 0 < self.rate_pps <= 10_000_000:
            raise ValueError("rate_pps must be in (0, 10,000,000]")

    @property
    def op(self) -> WrOpcode:
        return _OPS[self.test.split("_")[0]]

    @property
    def is_latency(self) -> bool:
        return self.test in LAT_TESTS


@dataclass
class Side:
    """One end of a test: QPs, their CQ and one buffer per QP, on ``port``."""

    port: HcaPort
    opts: PerfOptions
    cq: CompletionQueue
    qps: list[RcQp]
    mrs: list[MemoryRegion]
    remote: list[dict[str, int]] = field(default_factory=list)

    @classmethod
    def create(cls, port: HcaPort, opts: PerfOptions) -> Side:
        hca = port.hca
        cq = hca.create_cq()
        access = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ
        qps, mrs = [], []
        # Latency tests keep what the peer writes (first half) apart from what this side
        # sends (second half): each side polls its own first half.
        length = opts.size * (2 if opts.is_latency else 1)
        for _ in range(opts.qps):
            qps.append(hca.create_rc_qp(cq, max_send_wr=max(4096, opts.tx_depth * 2)))
            buf = bytearray(os.urandom(min(length, 64)).ljust(length, b"\x5a"))
            if opts.is_latency:
                # The mark byte polled (the first half's last) starts at 0, a value no
                # iteration writes (perftest zeroes its buffers): random content there made a
                # side see its own mark before the peer wrote it, 1 time in 256, and hang.
                buf[opts.size - 1] = 0
            mrs.append(hca.reg_mr(buf, access))
        return cls(port, opts, cq, qps, mrs)

    def info(self) -> dict[str, Any]:
        """What the other side needs to connect and address this side's buffers."""
        return {"lid": self.port.hca.lid, "size": self.opts.size, "qps": [
            {"qpn": qp.qpn, "psn": qp.sq_psn, "addr": mr.addr, "rkey": mr.rkey}
            for qp, mr in zip(self.qps, self.mrs, strict=True)]}

    def source(self, i: int = 0) -> Sge:
        """The bytes QP ``i`` sends: its whole buffer, or the second half for latency tests."""
        mr, size = self.mrs[i], self.opts.size
        return Sge(mr.addr + mr.length - size, size, mr.lkey)

    def landing(self, i: int = 0) -> Sge:
        """Where QP ``i``'s incoming SENDs land (the first ``size`` bytes)."""
        mr = self.mrs[i]
        return Sge(mr.addr, self.opts.size, mr.lkey)

    def connect(self, peer: dict[str, Any]) -> None:
        """Connect every QP to its counterpart in ``peer`` (the other side's ``info()``)."""
        if len(peer["qps"]) != len(self.qps):
            raise ValueError(f"the peer has {len(peer['qps'])} QPs, this side {len(self.qps)}")
        path = PathRecord(dlid=int(peer["lid"]), mtu=self.opts.mtu)
        for qp, rq in zip(self.qps, peer["qps"], strict=True):
            qp.connect(QpInfo(int(rq["qpn"]), int(rq["psn"]), int(peer["lid"])), path,
                       timeout=self.opts.timeout, retry_cnt=self.opts.retry_cnt,
                       max_inflight=self.opts.window, ack_every=self.opts.ack_every,
                       reorder_window=self.opts.reorder_window)
        self.remote = [dict(q) for q in peer["qps"]]
        if self.opts.op is WrOpcode.SEND or self.opts.is_latency:
            for i, qp in enumerate(self.qps):
                for k in range(min(self.opts.tx_depth * 2, 4096)):
                    qp.post_recv(RecvWr(k, [self.landing(i)]))


@dataclass
class Deliveries:
    """When units of a flow (messages, packets) completed: monotonic ns and bytes, compact."""

    t_ns: array = field(default_factory=lambda: array("q"))
    nbytes: array = field(default_factory=lambda: array("q"))

    def add(self, t_ns: int, n: int) -> None:
        self.t_ns.append(t_ns)
        self.nbytes.append(n)

    def total(self) -> int:
        return sum(self.nbytes)


@dataclass
class BwResult:
    test: str
    size: int
    iterations: int
    seconds: float
    bytes: int
    peak_mibps: float
    avg_mibps: float
    msg_rate_mpps: float
    packets: int
    retransmitted: int
    deliveries: Deliveries
    cpu: tuple[float, float] = (0.0, 0.0)
    """This process's user and kernel CPU seconds during the test (``os.times``): the kernel
    share includes the emulated switches' tc forwarding, done in the sender's system calls."""

    @property
    def gbps(self) -> float:
        return self.bytes * 8 / self.seconds / 1e9 if self.seconds else 0.0


@dataclass
class LatResult:
    test: str
    size: int
    iterations: int
    samples_ns: list[int]
    """Half round trips, one per iteration."""

    def stats_us(self) -> dict[str, float]:
        s = sorted(self.samples_ns)
        n = len(s)
        if not n:
            return dict.fromkeys(("t_min", "t_max", "t_typical", "t_avg", "t_stdev", "p99", "p999"), 0.0)
        avg = sum(s) / n
        var = sum((x - avg) ** 2 for x in s) / n
        pct: Callable[[float], float] = lambda q: s[min(n - 1, int(q * n))] / 1e3  # noqa: E731
        return {"t_min": s[0] / 1e3, "t_max": s[-1] / 1e3, "t_typical": s[n // 2] / 1e3,
                "t_avg": avg / 1e3, "t_stdev": var ** 0.5 / 1e3, "p99": pct(0.99), "p999": pct(0.999)}


PEAK_WINDOW_NS = 100_000_000
"""BW peak: the best 100 ms window of completions (perftest takes its fastest iteration)."""


def _peak_mibps(d: Deliveries) -> float:
    """The most bytes completed in any ``PEAK_WINDOW_NS`` window ending at a completion."""
    t, b = d.t_ns, d.nbytes
    if len(t) < 2:
        return 0.0
    window = min(PEAK_WINDOW_NS, t[-1] - t[0]) or 1
    best, lo, acc = 0, 0, 0
    for hi in range(len(t)):
        acc += b[hi]
        while t[hi] - t[lo] >= window:
            acc -= b[lo]
            lo += 1
        best = max(best, acc)
    return best / window * 1e9 / (1 << 20)


def _check(wc_status: WcStatus, qp: RcQp) -> None:
    if wc_status is not WcStatus.SUCCESS:
        st = qp.stats
        raise TransportError(
            f"QP {qp.qpn:#x} to LID {qp.path_dlid}: work request completed with "
            f"{wc_status.name} (timeouts {st.timeouts}, retransmitted "
            f"{st.retransmitted}, NAKs seq {st.seq_naks_received} rnr {st.rnr_naks_received})")


async def bw_client(side: Side, *, stop: trio.Event | None = None,
                    deliveries: Deliveries | None = None) -> BwResult:
    """Drive a bandwidth test from this side; returns when every message completed.

    ``deliveries`` (default: a new one) records completions as they come.
    """
    opts, port, cq = side.opts, side.port, side.cq
    op, size = opts.op, opts.size
    deadline = None if opts.duration_s is None else clock.now_ns() + int(opts.duration_s * 1e9)
    total = None if deadline is not None else opts.iterations
    pkts_per_msg = max(1, -(-size // min(opts.mtu, port.hca.mtu)))
    inflight = [0] * len(side.qps)
    batch_of: dict[int, tuple[int, int]] = {}  # signaled wr_id -> (qp index, messages it covers)
    posted = done = 0
    next_id = 0
    deliveries = Deliveries() if deliveries is None else deliveries
    by_qpn = {qp.qpn: i for i, qp in enumerate(side.qps)}
    t0 = clock.now_ns()
    cpu0 = os.times()
    period_ns = 1e9 / opts.rate_pps if opts.rate_pps else 0.0
    while True:
        now = clock.now_ns()
        stopping = (stop is not None and stop.is_set()) or (deadline is not None and now >= deadline)
        # paced: message k is due at t0 + k x period (a late wake-up posts what fell due meanwhile)
        allowed = int((now - t0) / period_ns) + 1 if period_ns else None
        for i, (qp, rem) in enumerate(zip(side.qps, side.remote, strict=True)):
            while not stopping and inflight[i] < opts.tx_depth and (total is None or posted < total) \
                    and (allowed is None or posted < allowed):
                n = min(opts.cq_mod, opts.tx_depth - inflight[i],
                        opts.cq_mod if total is None else total - posted,
                        opts.cq_mod if allowed is None else allowed - posted)
                sg = [side.source(i)]
                wrs = [SendWr(next_id + k, op, sg, remote_addr=rem["addr"], rkey=rem["rkey"],
                              signaled=k == n - 1) for k in range(n)]
                next_id += n
                batch_of[next_id - 1] = (i, n)
                port.post(qp, wrs)
                inflight[i] += n
                posted += n
        if done >= posted and (stopping or (total is not None and posted >= total)):
            break
        if allowed is not None and posted >= allowed and not stopping:
            # the next message falls due before any completion may come: wake for it too
            due = t0 + posted * period_ns
            with trio.move_on_after(max(0.0, (due - clock.now_ns()) / 1e9)):
                await port.wait_progress()
        else:
            await port.wait_progress()
        now = clock.now_ns()
        for wc in cq.poll(1 << 16):
            qi = by_qpn.get(wc.qpn)
            if qi is None:
                continue
            _check(wc.status, side.qps[qi])  # an unsignaled WR's error completes too
            if wc.wr_id not in batch_of:
                continue
            i, n = batch_of.pop(wc.wr_id)
            inflight[i] -= n
            done += n
            deliveries.add(now, n * size)
    seconds = (clock.now_ns() - t0) / 1e9
    cpu1 = os.times()
    nbytes = done * size
    return BwResult(opts.test, size, done, seconds, nbytes, _peak_mibps(deliveries),
                    nbytes / seconds / (1 << 20) if seconds else 0.0,
                    done / seconds / 1e6 if seconds else 0.0, done * pkts_per_msg,
                    sum(qp.stats.retransmitted for qp in side.qps), deliveries,
                    (cpu1.user - cpu0.user, cpu1.system - cpu0.system))


async def bw_server(side: Side, done: trio.Event) -> None:
    """Serve a bandwidth test until ``done``: keep receives posted (SEND), else only answer."""
    if side.opts.op is not WrOpcode.SEND:
        await done.wait()
        return
    by_qpn = {qp.qpn: (qp, side.landing(i)) for i, qp in enumerate(side.qps)}
    with trio.CancelScope() as scope:
        async def _watch() -> None:
            await done.wait()
            scope.cancel()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_watch)
            while True:
                await side.port.wait_progress()
                for wc in side.cq.poll(1 << 16):
                    if wc.opcode >= WcOpcode.RECV and wc.status is WcStatus.SUCCESS:
                        qp, landing = by_qpn[wc.qpn]
                        qp.post_recv(RecvWr(wc.wr_id, [landing]))


async def _wait_mark(port: HcaPort, mr: MemoryRegion, at: int, value: int) -> int:
    """Until byte ``at`` of ``mr`` is ``value`` (perftest's write_lat polls memory); when."""
    buf = mr.buf
    while buf[at] != value:
        await port.wait_progress()
    return clock.now_ns()


async def _wait_recv(side: Side) -> int:
    qp = side.qps[0]
    while True:
        for wc in side.cq.poll(64):
            _check(wc.status, qp)
            if wc.opcode >= WcOpcode.RECV:
                qp.post_recv(RecvWr(wc.wr_id, [side.landing()]))
                return clock.now_ns()
        await side.port.wait_progress()


async def lat_ping(side: Side, initiator: bool) -> LatResult:
    """One end of a ping-pong: the initiator sends first and times the round trips.

    Each message carries the iteration's mark in its last byte; write_lat sees the peer's
    message land by polling that byte, send_lat by its receive completion.
    """
    opts, port = side.opts, side.port
    qp, mr, rem = side.qps[0], side.mrs[0], side.remote[0]
    write = opts.op is WrOpcode.RDMA_WRITE
    size = opts.size
    samples: list[int] = []
    for it in range(opts.iterations + 1):  # iteration 0 warms the path up and is not counted
        value = (it % 255) + 1
        if initiator:
            t0 = clock.now_ns()
            _ping(side, qp, rem, write, it, value)
            t1 = await (_wait_mark(port, mr, size - 1, value) if write else _wait_recv(side))
            if it:
                samples.append((t1 - t0) // 2)
        else:
            await (_wait_mark(port, mr, size - 1, value) if write else _wait_recv(side))
            _ping(side, qp, rem, write, it, value)
        _reap_sends(side)
    return LatResult(opts.test, size, opts.iterations, samples)


def _ping(side: Side, qp: RcQp, rem: dict[str, int], write: bool, it: int, value: int) -> None:
    src = side.source()
    side.mrs[0].buf[-1] = value  # the last byte of the source half
    op = WrOpcode.RDMA_WRITE if write else WrOpcode.SEND
    side.port.post(qp, SendWr(it, op, [src], remote_addr=rem["addr"], rkey=rem["rkey"],
                              signaled=it % 64 == 63))


def _reap_sends(side: Side) -> None:
    """Take send completions off the CQ (receives are taken where they are awaited)."""
    if len(side.cq) > 1024:
        for wc in side.cq.poll(len(side.cq)):
            _check(wc.status, side.qps[0])


def connected_sides(client: HcaPort, server: HcaPort, opts: PerfOptions) -> tuple[Side, Side]:
    """Both sides of a test in this process, connected to each other."""
    a, b = Side.create(client, opts), Side.create(server, opts)
    a.connect(b.info())
    b.connect(a.info())
    return a, b


async def run_local(client: HcaPort, server: HcaPort, opts: PerfOptions) -> BwResult | LatResult:
    """Both sides of a test in this process (their ports already serving)."""
    return await run_sides(*connected_sides(client, server, opts))


async def run_sides(a: Side, b: Side) -> BwResult | LatResult:
    """Run a test between two connected sides of this process; ``a`` is the client."""
    opts = a.opts
    if opts.is_latency:
        result: list[LatResult] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lat_ping, b, False)

            async def _client() -> None:
                result.append(await lat_ping(a, True))
            nursery.start_soon(_client)
        return result[0]
    done = trio.Event()
    results: list[BwResult] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(bw_server, b, done)
        if opts.bidirectional:
            nursery.start_soon(bw_server, a, done)

        async def _drive(side: Side) -> None:
            results.append(await bw_client(side))
        async with trio.open_nursery() as clients:
            clients.start_soon(_drive, a)
            if opts.bidirectional:
                clients.start_soon(_drive, b)
        done.set()
    if len(results) == 1:
        return results[0]
    return _combine(results)


def _combine(results: list[BwResult]) -> BwResult:
    """Bidirectional: both directions' bytes over the longer of the two runs."""
    merged = Deliveries()
    for t, n in sorted(p for r in results for p in zip(r.deliveries.t_ns, r.deliveries.nbytes, strict=True)):
        merged.add(t, n)
    secs = max(r.seconds for r in results)
    nbytes = sum(r.bytes for r in results)
    iters = sum(r.iterations for r in results)
    r0 = results[0]
    return BwResult(r0.test, r0.size, iters, secs, nbytes, _peak_mibps(merged),
                    nbytes / secs / (1 << 20) if secs else 0.0, iters / secs / 1e6 if secs else 0.0,
                    sum(r.packets for r in results), sum(r.retransmitted for r in results), merged)


# ------------------------------------------------------------------------------ output


def bw_header() -> str:
    return (" #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]")


def bw_line(r: BwResult) -> str:
    return f" {r.size:<10d} {r.iterations:<14d} {r.peak_mibps:<18.2f} {r.avg_mibps:<20.2f} {r.msg_rate_mpps:.6f}"


def lat_header() -> str:
    return (" #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]"
            "    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]")


def lat_line(r: LatResult) -> str:
    s = r.stats_us()
    return (f" {r.size:<6d} {r.iterations:<10d} {s['t_min']:>13.2f} {s['t_max']:>14.2f} "
            f"{s['t_typical']:>16.2f} {s['t_avg']:>14.2f} {s['t_stdev']:>16.2f} "
            f"{s['p99']:>22.2f} {s['p999']:>24.2f}")


def cpu_line(cpu: tuple[float, float], packets: int, role: str) -> str:
    """CPU per packet of this process: user (the HCA in Python) and kernel (syscalls, and the
    emulated switches' forwarding the sender's system calls carry)."""
    n = max(packets, 1)
    return (f" # CPU per packet ({role}): {cpu[0] / n * 1e6:.2f} us user + {cpu[1] / n * 1e6:.2f} us kernel"
            f" = {(cpu[0] + cpu[1]) / n * 1e6:.2f} us")


_TEST_NAMES = {"write_bw": "RDMA_Write_BW", "read_bw": "RDMA_Read_BW", "send_bw": "Send_BW",
               "write_lat": "RDMA_Write_Latency", "send_lat": "Send_Latency"}


def json_report(r: BwResult | LatResult, opts: PerfOptions, *, link_type: str = "IB") -> dict[str, Any]:
    """``r`` as perftest's ``--out_json`` writes it: ``test_info`` (the test, QPs, transport,
    connection type, MTU, link type) and ``results`` with perftest's keys and units (bandwidth
    ``BW_peak``/``BW_average`` in MiB/s, ``MsgRate`` in Mpps; latency ``t_min`` ..
    ``percentile_99.9`` in usec)."""
    bidir = "Bidirectional_" if opts.bidirectional and not opts.is_latency else ""
    info: dict[str, Any] = {"test": f"{_TEST_NAMES.get(r.test, r.test)}_{bidir}Test",
                            "Dual_port": "OFF", "Device": "ibemu", "Number_of_qps": opts.qps,
                            "Transport_type": "IB", "Connection_type": "RC", "Using_SRQ": "OFF",
                            "Mtu": opts.mtu, "Link_type": link_type}
    if isinstance(r, LatResult):
        st = r.stats_us()
        res: dict[str, Any] = {"MsgSize": r.size, "n_iterations": r.iterations,
                               **{k: round(st[k], 2) for k in ("t_min", "t_max", "t_typical", "t_avg", "t_stdev")},
                               "percentile_99": round(st["p99"], 2), "percentile_99.9": round(st["p999"], 2)}
    else:
        info["TX_depth"] = opts.tx_depth
        res = {"MsgSize": r.size, "n_iterations": r.iterations, "BW_peak": round(r.peak_mibps, 2),
               "BW_average": round(r.avg_mibps, 2), "MsgRate": round(r.msg_rate_mpps, 6)}
    return {"test_info": info, "results": res}


def report(r: BwResult | LatResult) -> str:
    """perftest's result table for ``r`` (and, for bandwidth, this side's CPU per packet)."""
    bar = "-" * 91
    if isinstance(r, LatResult):
        return "\n".join((bar, lat_header(), lat_line(r), bar))
    return "\n".join((bar, bw_header(), bw_line(r), bar, cpu_line(r.cpu, r.packets, "sender")))
