"""``time: {dilation: auto}``: the dilation factor a scenario needs on this machine, and why.

Sans-IO: ``offered_load`` reads a scenario, ``choose`` compares its load with a capacity;
the capacity (frame-hops/s this machine's user datapath sustains) is measured and cached by
``ibemu.fabric.calibrate``, and the CLI prints the choice (``Choice.line``).

The offered load, in emulated frame-hops per second, at the busiest moment of the run:

- each flow's frames per second: ``rate_pps`` x frames per message where the flow is paced
  (streams); otherwise (an unpaced bandwidth flow, a collective, an incast) the rate of the
  links it leaves and enters (``ibemu.topo.rates``: the slower of the source's and the
  destination's cable; the unpaced flows leaving one host share its cable) divided by its
  frame's bits on the wire (payload up to the path's MTU, plus ``HEADER_BYTES``). Latency
  kinds keep one message in flight: their load is set by the round trip, not by a rate, and
  is not counted. Collectives and permutations count each host sending to one peer at a time
  (its ring neighbour), bidirectional flows both ways;
- times the switches on its min-hop path (``ibemu.topo.analysis.hop_distances``): each is one
  forwarding decision of the user datapath (a frame-hop);
- the flows' ``start_s``..``stop_s`` windows: the load is the highest sum of the flows active
  at one time.

A kernel-datapath fabric forwards in the kernel: its switch hops cost ibemu nothing, and the
load counted is the frames the hosts' Python endpoints send and receive, in the same unit: 2
per frame (its sender and its receiver), 4 for a stream's (``STREAM_ENDPOINT_TOUCHES``: each
message is its own completion, send stamp and acknowledgement; measured, an RC stream's worker
spends 38-51 us of CPU a message, against 10-24 us per calibrated frame-hop, where a bulk
flow's 4 KiB frame, completions and ACKs coalesced, costs about 2 frame-hops). RoCE fabrics are judged against the IB user datapath's calibration (a RoCE
router's hop costs about the same Python work; not calibrated separately).

The choice: the smallest integer N with ``load / N <= capacity x headroom`` (``HEADROOM``:
the datapath shares this machine's cores with the traffic workers, the SM and the runner) and
with the busiest traffic worker's own load (its flows' endpoint touches, ``ENDPOINT_TOUCHES``
or ``STREAM_ENDPOINT_TOUCHES`` a frame, on either datapath; on the kernel datapath also
``KERNEL_HOP_UNITS`` for each switch a frame crosses, twice that for a stream's frame and its
ACK) ``/ N <= capacity x WORKER_HEADROOM``: a worker is one process at nice 10 on one core, preempted for the
scheduler's slices of a few ms by anything at nice 0, and only slack absorbs that (seen: a
30 kpps RC stream's worker at N = 3, 0.45 of a core, 6 ms late at p99 in real time, 2 ms of
emulated time: invalid; at 0.25 of a core it keeps up). 1 when the load fits undilated, and a ``ValueError`` when N would exceed ``MAX_DILATION``
(the run would take more than that many times its duration: the scenario cannot be run
validly here at a sane factor).

What the run is then judged on (``ibemu.scenario.fidelity``): every process's p99 lag under 2 ms
of emulated time when it reports no time figure finer than that, else under 2 ms of *real* time
(2000/N us emulated), relaxed at most to 5% of the run's smallest time figure. A
larger N does not loosen that for a process that is idle but descheduled (its lag is the same
in real time at any N); it loosens it for a busy one, whose real load is its load / N. So ``auto``
secures real slack, which is what the headroom rules above are (real utilisation of the
datapath and of the busiest worker's core), and says the threshold at N (:func:`judged`). The
old judge, 2 ms of emulated time (2N ms real), hid a choice too small by a factor of up to N.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from ibemu.scenario.fidelity import DEFAULT_REAL_THRESHOLD_US, FIGURE_FRACTION, lag_text, threshold
from ibemu.scenario.schema import Scenario, TimeSpec, TrafficSpec
from ibemu.topo import analysis
from ibemu.topo.model import Topology
from ibemu.topo.rates import DEFAULT_MTU
from ibemu.traffic.flows import TRAFFIC_KINDS

HEADROOM = 0.5
"""The share of the calibrated capacity a run may use."""
KERNEL_HOP_UNITS = 0.5
"""On the kernel datapath a frame's switches forward it inside its sender's ``send`` (the veth
chain runs in the system call): each switch crossed costs the sending worker about half a
calibrated frame-hop (a veth hop 4-4.5 us, against 10-24 us a user-datapath frame-hop).
Measured: an RC stream over 5 switches took 0.55-0.67 of a core at 5 kpps, 110-134 us a
message, 11-13 units; counted here as 4 + 0.5 x 5 x 2 = 9."""
WORKER_HEADROOM = 0.25
"""The share of the calibrated capacity one traffic worker may use (see the module docstring)."""
MAX_DILATION = 1000
"""The largest factor ``auto`` picks: beyond it a run lasts over 1000 times its duration."""
HEADER_BYTES = 42
"""IB headers of a data frame on the wire: LRH 8, BTH 12, RETH 16, ICRC 4, VCRC 2."""
LATENCY_KINDS = ("write_lat", "send_lat")
ENDPOINT_TOUCHES = 2
"""A kernel-datapath frame costs ibemu its sending and its receiving endpoint."""
STREAM_ENDPOINT_TOUCHES = 4
"""A stream's message (one frame, its own completion and ACK) costs its endpoints about twice
that (see the module docstring)."""


@dataclass(frozen=True, slots=True)
class FlowLoad:
    """One flow's share of the offered load."""

    name: str
    frames_per_s: float
    hops: int
    """Frame-hops per frame: switches on its path (user datapath) or endpoint touches."""
    how: str
    start_s: float
    stop_s: float

    @property
    def frame_hops_per_s(self) -> float:
        return self.frames_per_s * self.hops


@dataclass(frozen=True, slots=True)
class Load:
    """A scenario's offered load: the peak of its flows' frame-hops/s."""

    frame_hops_per_s: float
    flows: tuple[FlowLoad, ...] = ()
    frame_bytes: int = 0
    """The largest data frame of the scenario (what the calibration measures with)."""
    notes: tuple[str, ...] = ()
    worker: tuple[str, float] = ("", 0.0)
    """The busiest traffic worker: its flow's name and its endpoint touches per second (in
    frame-hops/s, the calibration's unit)."""


@dataclass(frozen=True, slots=True)
class Choice:
    """The factor ``auto`` picked and why."""

    dilation: int
    load: float
    capacity: float
    headroom: float
    reasons: tuple[str, ...] = field(default=())

    def line(self, capacity_note: str = "") -> str:
        """One line: offered load, calibrated capacity, chosen N."""
        cap = f"capacity {_si(self.capacity)} frame-hops/s" + (f" ({capacity_note})" if capacity_note else "")
        why = f": {'; '.join(self.reasons)}" if self.reasons else ""
        return (f"dilation auto: offered load {_si(self.load)} frame-hops/s, {cap}, headroom {self.headroom:.0%} "
                f"-> N = {self.dilation}{why}")


def _si(x: float) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.3g}"


def choose(load: float, capacity: float, headroom: float = HEADROOM, *, cap: int = MAX_DILATION,
           worker: tuple[str, float] = ("", 0.0), worker_headroom: float = WORKER_HEADROOM) -> Choice:
    """The smallest integer N >= 1 with ``load / N <= capacity * headroom`` and, for the
    busiest traffic worker ``worker`` (name, endpoint touches/s), ``touches / N <= capacity *
    worker_headroom``.

    ``ValueError`` when ``capacity`` or a headroom is not positive, a load is negative or
    not finite, or N would exceed ``cap``."""
    if not (math.isfinite(capacity) and capacity > 0):
        raise ValueError(f"no usable calibration: capacity {capacity!r} frame-hops/s")
    for h in (headroom, worker_headroom):
        if not (0 < h <= 1):
            raise ValueError(f"headroom must be in (0, 1], not {h!r}")
    wname, wload = worker
    for x in (load, wload):
        if not (math.isfinite(x) and x >= 0):
            raise ValueError(f"offered load must be a finite number >= 0, not {x!r}")
    budget, wbudget = capacity * headroom, capacity * worker_headroom
    if load <= budget and wload <= wbudget:
        why = "no traffic" if load == 0 and wload == 0 else f"the load fits in {_si(budget)} frame-hops/s undilated"
        return Choice(1, load, capacity, headroom, (why,))
    n_all = math.ceil(load / budget - 1e-9) if load > budget else 1
    n_worker = math.ceil(wload / wbudget - 1e-9) if wload > wbudget else 1
    n = max(n_all, n_worker)
    if n > cap:
        raise ValueError(f"offered load {_si(load)} frame-hops/s (busiest worker {_si(wload)}) needs dilation {n} "
                         f"on this machine (capacity {_si(capacity)} frame-hops/s x headroom {headroom:.0%}, "
                         f"{worker_headroom:.0%} for one worker), above the cap of {cap}: the scenario cannot be run "
                         "validly here: pace its flows (rate_pps) or lower its link rates")
    reasons = [f"{_si(load)} / {n} = {_si(load / n)} <= {_si(budget)} frame-hops/s"]
    if n_worker >= n_all:
        reasons.append(f"worker {wname}: {_si(wload)} / {n} = {_si(wload / n)} <= {_si(wbudget)} "
                       f"({worker_headroom:.0%} of the capacity, one process)")
    return Choice(n, load, capacity, headroom, tuple(reasons))


def judged(dilation: float, spec: TimeSpec | None = None) -> str:
    """What a run at ``dilation`` will be judged on, in one line (``ibemu.scenario.fidelity``)."""
    spec = spec or TimeSpec()
    t = threshold(dilation, emulated_us=spec.lag_threshold_us, real_us=spec.lag_threshold_real_us)
    if spec.lag_threshold_us is not None or dilation == 1:
        return f"judged on: every process's p99 lag < {lag_text(t.us, dilation)} ({t.basis})"
    if spec.lag_threshold_real_us is not None:
        return (f"judged on: every process's p99 lag < {lag_text(t.us, dilation)} (relaxed up to "
                f"{FIGURE_FRACTION:.0%} of the run's smallest time figure)")
    real = threshold(dilation, real_us=DEFAULT_REAL_THRESHOLD_US)
    return (f"judged on: every process's p99 lag < {lag_text(t.us, dilation)}; with a time figure (a latency, "
            f"a training step) < {lag_text(real.us, dilation)}, relaxed up to {FIGURE_FRACTION:.0%} of the smallest")


def _pairs(t: TrafficSpec) -> list[tuple[str, str]]:
    shape = TRAFFIC_KINDS[t.kind].hosts if t.kind in TRAFFIC_KINDS else "pair"
    if shape == "pair":
        assert t.src is not None and t.dst is not None
        return [(t.src, t.dst), (t.dst, t.src)] if t.bidirectional else [(t.src, t.dst)]
    hosts = list(t.hosts)
    if shape == "fan_in":
        return [(h, hosts[-1]) for h in hosts[:-1]]
    return [(h, hosts[(i + 1) % len(hosts)]) for i, h in enumerate(hosts)] if len(hosts) > 1 else []


def _cable(topo: Topology, host: str) -> tuple[float, int]:
    """(Gb/s, MTU) of ``host``'s first cabled port."""
    for port in topo.node(host).port_range:
        lk = topo.link_at(host, port)
        if lk is not None:
            return topo.rate_of(lk).gbps, topo.mtu_of(lk)
    return 0.0, DEFAULT_MTU


def offered_load(scen: Scenario, *, user_datapath: bool | None = None) -> Load:
    """The scenario's peak offered load (see the module docstring)."""
    topo = scen.topology
    user = scen.fabric.datapath == "user" if user_datapath is None else user_datapath
    dist: dict[str, dict[str, int]] = {}
    unpaced_from: dict[str, int] = {}
    for t in scen.traffic:
        if t.kind not in LATENCY_KINDS and t.rate_pps is None:
            for src, _ in _pairs(t):
                unpaced_from[src] = unpaced_from.get(src, 0) + 1
    flows: list[FlowLoad] = []
    weights: dict[str, float] = {}  # per traffic worker (one a traffic entry): its own load
    notes: list[str] = []
    frame_bytes = 0
    for t in scen.traffic:
        stop = min(t.stop_s, scen.duration_s)
        if t.kind in LATENCY_KINDS:
            notes.append(f"{t.name}: {t.kind} keeps one message in flight (not counted)")
            continue
        for src, dst in _pairs(t):
            if src not in dist:
                dist[src] = analysis.hop_distances(topo, src)
            links = dist[src].get(dst)
            if links is None:
                raise ValueError(f"{t.name}: no path from {src} to {dst}")
            src_gbps, src_mtu = _cable(topo, src)
            dst_gbps, dst_mtu = _cable(topo, dst)
            mtu = min(src_mtu, dst_mtu)
            per_msg = max(1, math.ceil(t.size / mtu))
            frame = min(t.size, mtu) + HEADER_BYTES
            frame_bytes = max(frame_bytes, frame)
            touches = STREAM_ENDPOINT_TOUCHES if t.kind == "stream" else ENDPOINT_TOUCHES
            hops = max(0, links - 1) if user else touches
            # the worker's own share: its endpoints, and on the kernel datapath the switches its
            # frames (and a stream's ACKs) cross inside its send calls
            crossings = 0 if user else max(0, links - 1) * (2 if t.kind == "stream" else 1)
            if t.rate_pps is not None:
                fps = float(t.rate_pps * per_msg)
                how = f"{t.rate_pps} msg/s x {per_msg} frames"
            else:
                gbps = min(src_gbps, dst_gbps) / unpaced_from.get(src, 1)
                fps = gbps * 1e9 / 8 / frame
                how = f"unpaced at {gbps:g} Gb/s, {frame} B frames"
            flows.append(FlowLoad(f"{t.name} {src}->{dst}", fps, hops, how, t.start_s, stop))
            weights[t.name] = weights.get(t.name, 0.0) + fps * (touches + KERNEL_HOP_UNITS * crossings)
    worker = max(weights.items(), key=lambda w: w[1], default=("", 0.0))
    if not user and flows:
        notes.append("kernel datapath: its switch hops are the kernel's; counted: each frame's 2 endpoints "
                     f"({STREAM_ENDPOINT_TOUCHES} for a stream's: a completion and an ACK a message)")
    return Load(_peak(flows), tuple(flows), frame_bytes, tuple(notes), worker)


def _peak(flows: Sequence[FlowLoad]) -> float:
    """The highest sum of frame-hops/s of the flows active at one instant."""
    best = 0.0
    for f in flows:
        t = f.start_s  # the sum is highest at some flow's start
        best = max(best, sum(g.frame_hops_per_s for g in flows if g.start_s <= t < g.stop_s))
    return best
