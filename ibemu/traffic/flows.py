"""A scenario's traffic as running flows, and the registry of traffic kinds.

``TRAFFIC_KINDS`` is the one table of traffic kinds: per name, the keys a scenario entry of
that kind takes, which hosts it names (a pair, many to one, a group), its default size and
the function that runs it. The scenario loader validates through it, the runner and
``run_flow`` dispatch through it; a new kind is one entry (and its generator).

``run_flow`` turns one flow description (the scenario's ``TrafficSpec`` as a dict, the form
the traffic worker receives) into the generator its kind names and returns a ``FlowOutput``:
deliveries over time (for throughput plots and blackouts) and the kind's own figures.
Bandwidth kinds and collectives run from ``start_s`` to ``stop_s`` (a pair's bandwidth kinds as
fast as their window allows, or paced at ``rate_pps`` messages per second when the scenario
says so); latency kinds run their iterations once; streams send at ``rate_pps`` until ``stop_s``;
training jobs (``ibemu.traffic.training``) run whole steps until ``stop_s`` (a step under way ends).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import trio

from ibemu import clock
from ibemu.errors import leaves
from ibemu.hca.nic import HcaPort
from ibemu.traffic import collectives, perftest, stream, training
from ibemu.traffic.perftest import BwResult, Deliveries, LatResult, PerfOptions

log = logging.getLogger(__name__)

LAT_ITERATIONS = 1000
WINDOW = 256
USER_DATAPATH_WINDOW = 64
"""On the user datapath every switch is a Python forwarder, much slower than tc: a window it
cannot drain within the ACK timeout would go back N for nothing (IB's link credits would
have held the sender back instead)."""
BW_TIMEOUT = 14
"""Bandwidth flows: local ACK timeout 4.096 us x 2^14 = 67 ms (a lost window's tail waits
this long: nothing behind it can draw a NAK)."""
SHARED_BW_TIMEOUT = 16
"""... 268 ms when many pairs share this process and drain their windows slowly."""


@dataclass
class FlowOutput:
    """What one flow did, in a JSON-friendly shape."""

    name: str
    kind: str
    src: str | list[str]
    dst: str | list[str]
    t_ns: list[int] = field(default_factory=list)
    nbytes: list[int] = field(default_factory=list)
    packets: int = 0
    retransmitted: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    # streams only: what was sent when, and which sequence numbers arrived
    sent_t_ns: list[int] = field(default_factory=list)
    recv_seq: list[int] = field(default_factory=list)
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FlowOutput:
        return cls(**d)


def _add(out: FlowOutput, d: Deliveries) -> None:
    out.t_ns.extend(d.t_ns)
    out.nbytes.extend(d.nbytes)


def _perf_opts(spec: dict[str, Any], test: str, duration_s: float | None, *, sharing: int = 1) -> PerfOptions:
    """Options of one pair; ``sharing`` pairs run in this process.

    One process emulates every HCA of a many-pair kind (incast, permutation): what it can
    move is shared, so each pair keeps a smaller window, drained well within its ACK timeout
    (a window the process cannot drain in time would time out and go back N for nothing).
    """
    user = spec.get("datapath") == "user"  # switches forward in Python: far less to go round
    window = (USER_DATAPATH_WINDOW if user else WINDOW) // sharing
    rate = spec.get("rate_pps")
    return PerfOptions(test=test, size=int(spec.get("size", 65536)), qps=int(spec.get("qps", 1)),
                       bidirectional=bool(spec.get("bidirectional", False)),
                       rate_pps=float(rate) if rate and test in perftest.BW_TESTS else None,
                       duration_s=duration_s, iterations=LAT_ITERATIONS, tx_depth=16,
                       window=max(16, window), reorder_window=int(spec.get("reorder_window", 0)),
                       timeout=BW_TIMEOUT if sharing == 1 and not user else SHARED_BW_TIMEOUT)


async def _bw_pair(src: HcaPort, dst: HcaPort, opts: PerfOptions, stop: trio.Event,
                   out: FlowOutput) -> BwResult:
    a, b = perftest.connected_sides(src, dst, opts)
    done = trio.Event()
    deliveries = Deliveries()  # filled as it goes: kept if the QP fails half way
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(perftest.bw_server, b, done)
            result = await perftest.bw_client(a, stop=stop, deliveries=deliveries)
            done.set()
    finally:
        _add(out, deliveries)
        pkts = max(1, -(-opts.size // opts.mtu))
        out.packets += sum(deliveries.nbytes) // opts.size * pkts
        out.retransmitted += sum(qp.stats.retransmitted for qp in a.qps)
    return result



def permutation_pairs(hosts: list[str], seed: int) -> list[tuple[str, str]]:
    """A derangement of ``hosts`` (nobody sends to itself), reproducible from ``seed``."""
    rng = random.Random(seed)
    n = len(hosts)
    if n < 2:
        raise ValueError("a permutation needs at least 2 hosts")
    while True:
        perm = hosts[:]
        rng.shuffle(perm)
        if all(a != b for a, b in zip(hosts, perm, strict=True)):
            return list(zip(hosts, perm, strict=True))


async def run_flow(spec: dict[str, Any], ports: dict[str, HcaPort], t0_ns: int,
                   abort: trio.Event | None = None, drained: trio.Event | None = None) -> FlowOutput:
    """Run one flow from ``start_s`` to ``stop_s`` after ``t0_ns`` (monotonic).

    ``abort`` ends it early the same way ``stop_s`` does: what was measured is returned.
    ``drained`` is set when the flow's traffic is over (its last packets drained), before
    its kind turns what it measured into the output (a stream sorts its deliveries: 50-80 ms
    of one CPU for 160,000 of them, which is not the process falling behind the fabric).
    """
    drained = trio.Event() if drained is None else drained
    try:
        return await _run_flow(spec, ports, t0_ns, abort, drained)
    finally:
        drained.set()


async def _run_flow(spec: dict[str, Any], ports: dict[str, HcaPort], t0_ns: int,
                    abort: trio.Event | None, drained: trio.Event) -> FlowOutput:
    kind = spec["kind"]
    hosts: list[str] = list(spec["hosts"])
    src = spec.get("src") or hosts[0]
    dst = spec.get("dst") or hosts[-1]
    entry = TRAFFIC_KINDS.get(kind)
    if entry is None:
        raise ValueError(f"unknown traffic kind {kind!r}")
    many = entry.hosts == "group"
    out = FlowOutput(spec["name"], kind, hosts if many else (hosts[:-1] if entry.hosts == "fan_in" else src),
                     hosts if many else dst)
    abort = trio.Event() if abort is None else abort
    start_ns = t0_ns + int(float(spec.get("start_s", 0.0)) * 1e9)
    stop_ns = t0_ns + int(float(spec["stop_s"]) * 1e9)
    with trio.move_on_after(max(0.0, (start_ns - clock.now_ns()) / 1e9)):
        await abort.wait()
    if abort.is_set():
        out.error = "interrupted before it started"
        return out
    stop = trio.Event()

    async def _stopper() -> None:
        with trio.move_on_after(max(0.0, (stop_ns - clock.now_ns()) / 1e9)):
            await abort.wait()
        stop.set()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_stopper)
            await entry.run(Flow(kind, spec, ports, hosts, src, dst, stop, out, drained))
            nursery.cancel_scope.cancel()
    except* perftest.TransportError as group:  # a QP gave up (retries exhausted): said, kept
        out.error = str(leaves(group)[0])
        log.warning("flow %s: %s", out.name, out.error)
    if abort.is_set() and not out.error:
        out.error = "interrupted"
    return out


@dataclass(frozen=True, slots=True)
class Flow:
    """One flow as its kind's generator runs it: ``out`` is filled as it goes."""

    kind: str
    spec: dict[str, Any]
    ports: dict[str, HcaPort]
    hosts: list[str]
    src: str
    dst: str
    stop: trio.Event
    out: FlowOutput
    drained: trio.Event = field(default_factory=trio.Event)
    """Set by a kind when its traffic is over and only the output is left to compute."""

    @property
    def size(self) -> int:
        return int(self.spec.get("size", 65536))


async def _bw(f: Flow) -> None:
    r = await _bw_pair(f.ports[f.src], f.ports[f.dst], _perf_opts(f.spec, f.kind, 1e9), f.stop, f.out)
    f.out.extra = {"peak_mibps": round(r.peak_mibps, 2), "avg_mibps": round(r.avg_mibps, 2),
                   "msg_rate_mpps": round(r.msg_rate_mpps, 6), "iterations": r.iterations}
    if f.spec.get("rate_pps"):
        f.out.extra["rate_pps"] = float(f.spec["rate_pps"])


async def _pairs(f: Flow) -> None:
    """Many write_bw pairs at once: every sender to one host (incast), or a permutation."""
    out = f.out
    pairs = ([(h, f.dst) for h in f.hosts[:-1]] if f.kind == "incast"
             else permutation_pairs(f.hosts, int(f.spec.get("seed", 0))))
    async with trio.open_nursery() as nursery:
        for a, b in pairs:
            nursery.start_soon(_bw_pair, f.ports[a], f.ports[b],
                               _perf_opts(f.spec, "write_bw", 1e9, sharing=len(pairs)), f.stop, out)
    out.extra = {"pairs": [f"{a}->{b}" for a, b in pairs]}
    order = sorted(range(len(out.t_ns)), key=out.t_ns.__getitem__)
    out.t_ns = [out.t_ns[i] for i in order]
    out.nbytes = [out.nbytes[i] for i in order]


async def _lat(f: Flow) -> None:
    lat = await perftest.run_local(f.ports[f.src], f.ports[f.dst], _perf_opts(f.spec, f.kind, None))
    assert isinstance(lat, LatResult)
    f.out.extra = {k: round(v, 3) for k, v in lat.stats_us().items()}
    f.out.packets = 2 * lat.iterations


async def _collective(f: Flow) -> None:
    out = f.out
    runs: list[collectives.CollectiveResult] = []
    group = [f.ports[h] for h in f.hosts]
    it = 0
    while not f.stop.is_set():
        cr = await collectives.run_collective(f.kind, group, f.size, iterations=1,
                                              warmup=1 if not it else 0,
                                              rc=collectives.RcTimers.from_spec(f.spec), stop=f.stop)
        runs.append(cr)
        out.t_ns.append(clock.now_ns())
        out.nbytes.append(cr.size)
        it += 1
    if runs:
        secs = [s for c in runs for s in c.seconds]
        best = runs[0]
        summary = collectives.CollectiveResult(f.kind, best.ranks, best.size, len(secs), secs,
                                               sum(c.wrong for c in runs),
                                               sum(c.retransmitted for c in runs))
        out.retransmitted = summary.retransmitted
        out.extra = {"iterations": len(secs), "time_us": round(summary.time_us, 1),
                     "algbw_gbs": round(summary.algbw_gbs, 4),
                     "busbw_gbs": round(summary.busbw_gbs, 4), "wrong": summary.wrong,
                     "retransmitted": summary.retransmitted}


async def _training(f: Flow) -> None:
    """A training job (``training.JobPlan``, scaled down by its ``scale``) on ``hosts``, its
    servers' CAs rail by rail, in ``pipeline`` stages of ``servers / pipeline`` consecutive
    servers each (one stage: pure data parallelism). Each step runs GPipe's schedule in emulated
    time: every stage runs the m microbatches' forward passes in order (each the modelled compute
    and TP time), each waiting for its activations from the stage before and sending its own on to
    the next as real RDMA writes (``collectives.PipeLink``: every server of a stage to the server
    in the same place of the next, rail by rail), then the backward passes in reverse order, the
    gradients going back the same way. A stage's data-parallel allreduce starts once ``1 -
    overlap`` of its last backward pass has run: the NVLink reduce-scatter and all-gather as
    their modelled time, between them one allreduce per rail among the stage's servers over
    RDMA, all rails at once (a ring, or a double binary tree for ``algorithm: tree``); a stage of
    one server has only NVLink to allreduce over. The step ends when every stage is done."""
    out = f.out
    plan = training.JobPlan.from_json(f.spec["training"])
    job, c = plan.job, plan.cluster
    rails, per, p, m = c.rails, job.stage_servers, job.pipeline, job.m
    servers = [f.hosts[i:i + rails] for i in range(0, len(f.hosts), rails)]
    stages = [servers[k * per:(k + 1) * per] for k in range(p)]
    algorithm = "tree" if job.algorithm == "tree" else "ring"
    rc = collectives.RcTimers.from_spec(f.spec)
    mtu = int(f.spec.get("mtu", 4096))
    dp: list[list[collectives.CollectiveGroup]] = [
        [collectives.CollectiveGroup("allreduce", [f.ports[sv[r]] for sv in st], plan.rail_bytes, mtu=mtu,
                                     algorithm=algorithm, rc=rc) for r in range(rails)] if per >= 2 else []
        for st in stages]
    links = [[collectives.PipeLink(f.ports[stages[k][j][r]], f.ports[stages[k + 1][j][r]], plan.pp_bytes, m,
                                   mtu=mtu, rc=rc) for j in range(per) for r in range(rails)]
             for k in range(p - 1)]
    o = job.overlap
    steps: list[training.StepMeasure] = []

    async def _recv(group: list[collectives.PipeLink], direction: int, it: int, mb: int) -> None:
        async with collectives.stall_bound(group, f.stop), trio.open_nursery() as n:
            for lk in group:
                n.start_soon(lk.recv, direction, it, mb)

    def _send(group: list[collectives.PipeLink], direction: int, it: int, mb: int) -> None:
        for lk in group:
            lk.send(direction, it, mb)

    fabric_ns = [0] * p  # this step's DP fabric time, per stage
    pipe_end = [0]  # when the first stage's last backward pass ended

    async def _allreduce(k: int, it: int) -> None:
        if not dp[k]:
            await trio.sleep(plan.nvlink_s)  # one server a stage: all NVLink
            return
        await trio.sleep(plan.nvlink_s / 2)
        t = clock.now_ns()
        async with collectives.stall_bound(dp[k], f.stop), trio.open_nursery() as rails_n:
            for g in dp[k]:
                rails_n.start_soon(g.run, it)
        fabric_ns[k] = clock.now_ns() - t
        await trio.sleep(plan.nvlink_s / 2)

    async def _last_backward(k: int, it: int) -> None:
        await trio.sleep(o * plan.mb_backward_s)
        if k > 0:
            _send(links[k - 1], 1, it, 0)
        else:
            pipe_end[0] = clock.now_ns()

    async def _stage(k: int, it: int) -> None:
        for mb in range(m):  # forward passes
            if k > 0:
                await _recv(links[k - 1], 0, it, mb)
            await trio.sleep(plan.mb_forward_s)
            if k < p - 1:
                _send(links[k], 0, it, mb)
        for mb in reversed(range(m)):  # backward passes
            if k < p - 1:
                await _recv(links[k], 1, it, mb)
            if mb:
                await trio.sleep(plan.mb_backward_s)
                if k > 0:
                    _send(links[k - 1], 1, it, mb)
                continue
            await trio.sleep((1 - o) * plan.mb_backward_s)
            async with trio.open_nursery() as n:
                n.start_soon(_last_backward, k, it)
                n.start_soon(_allreduce, k, it)
        for lk in links[k] if k < p - 1 else ():
            lk.reap()

    try:
        it = 0
        while not f.stop.is_set():
            fabric_ns[:] = [0] * p
            t0 = clock.now_ns()
            async with trio.open_nursery() as n:
                for k in range(p):
                    n.start_soon(_stage, k, it)
            t1 = clock.now_ns()
            steps.append(training.StepMeasure((t1 - t0) / 1e9, max(fabric_ns) / 1e9,
                                              (pipe_end[0] - t0) / 1e9 if p > 1 else 0.0))
            out.t_ns.append(t1)
            out.nbytes.append(sum(g.size for st in dp for g in st) + sum(2 * m * lk.size for b in links for lk in b))
            it += 1
    finally:
        f.drained.set()
        everything: list[collectives.RankSet] = [
            *(g for st in dp for g in st), *(lk for b in links for lk in b)]
        out.retransmitted = sum(x.retransmitted for x in everything)
        out.packets = sum(out.nbytes) // max(1, mtu)
        out.extra = {**training.measured_figures(plan, steps), "wrong": sum(x.wrong for x in everything),
                     "retransmitted": out.retransmitted}
        for x in everything:
            x.close()


async def _stream(f: Flow) -> None:
    out, size = f.out, f.size
    opts = stream.StreamOptions(rate_pps=float(f.spec.get("rate_pps") or 1000), size=size,
                                transport=str(f.spec.get("transport", "rc")),
                                reorder_window=int(f.spec.get("reorder_window", 0)))
    s = stream.Stream(f.ports[f.src], f.ports[f.dst], opts)
    rec = await s.run(stop=f.stop)
    f.drained.set()
    order = sorted(range(len(rec.recv_t_ns)), key=rec.recv_t_ns.__getitem__)
    out.t_ns = [rec.recv_t_ns[i] for i in order]
    out.nbytes = [size] * len(order)
    out.recv_seq = [rec.recv_seq[i] for i in order]
    out.sent_t_ns = list(rec.sent_t_ns)
    out.packets = rec.delivered
    out.retransmitted = rec.retransmitted
    out.extra = {"sent": rec.sent, "delivered": rec.delivered, "lost": rec.lost,
                 "rate_pps": opts.rate_pps, "transport": opts.transport}
    if rec.counters:
        out.extra["rc"] = rec.counters
    if rec.errors:
        out.error = "; ".join(rec.errors[:3])


# ---------------------------------------------------------------------- the registry


@dataclass(frozen=True, slots=True)
class TrafficKind:
    """One traffic kind: what a scenario entry of it says, and what runs it."""

    keys: tuple[str, ...]
    """Keys an entry takes besides the common ones (``name``, ``kind``, ``start_s``, ``stop_s``,
    ``sl``), in the order errors list them."""
    hosts: Literal["pair", "fan_in", "group"]
    """Which hosts it names: ``from``/``to`` (a pair), a list ``from`` to one ``to`` (many to
    one), or a list ``hosts`` (a group; ``all`` by default)."""
    run: Callable[[Flow], Awaitable[None]]
    """Run the flow until ``stop`` (or its iterations are done), filling ``out``."""
    size: int | None = None
    """Its default message size (None: the scenario's ``DEFAULT_SIZE``)."""
    timestamps: bool = False
    """Its hosts' ports stamp each frame (the worker opens them so)."""


TRAFFIC_KINDS: dict[str, TrafficKind] = {
    "write_bw": TrafficKind(("from", "to", "size", "qps", "bidirectional", "rate_pps"), "pair", _bw),
    "read_bw": TrafficKind(("from", "to", "size", "qps", "bidirectional", "rate_pps"), "pair", _bw),
    "send_bw": TrafficKind(("from", "to", "size", "qps", "bidirectional", "rate_pps"), "pair", _bw),
    "write_lat": TrafficKind(("from", "to", "size"), "pair", _lat, size=64),
    "send_lat": TrafficKind(("from", "to", "size"), "pair", _lat, size=64),
    "allreduce": TrafficKind(("hosts", "size", "rc_timeout", "rc_retry_cnt"), "group", _collective, size=1 << 20),
    "alltoall": TrafficKind(("hosts", "size", "rc_timeout", "rc_retry_cnt"), "group", _collective, size=1 << 20),
    "incast": TrafficKind(("from", "to", "size", "qps"), "fan_in", _pairs),
    "permutation": TrafficKind(("hosts", "size", "qps", "seed"), "group", _pairs),
    "stream": TrafficKind(("from", "to", "size", "rate_pps", "transport"), "pair", _stream, size=256,
                          timestamps=True),
    "training": TrafficKind(("hosts", "model", "tokens_per_step", "mfu", "algorithm", "overlap", "scale",
                             "train_tokens", "servers", "tensor", "pipeline", "microbatches", "rc_timeout",
                             "rc_retry_cnt"), "group", _training),
}
"""Every traffic kind, by name (the order scenario errors list them in)."""
