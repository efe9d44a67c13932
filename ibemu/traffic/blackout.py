"""What a fault did to a flow: its blackout, when it resumed, what it lost.

Pure functions over delivery times (monotonic ns, the clock every ibemu process stamps with).
The blackout across a fault at ``t_fault`` is the first gap between consecutive deliveries,
from the one holding the fault on, that is clearly longer than the flow's usual pace (see
``analyse``). ``resume`` is the first delivery after that gap, relative to the fault. A flow
the fault did not touch shows a gap of about one inter-arrival time.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_WINDOW_NS = 500_000_000


@dataclass(frozen=True, slots=True)
class Blackout:
    blackout_ns: int | None
    """The longest gap between deliveries around the fault (None: no delivery after it)."""
    resume_ns: int | None
    """First delivery after that gap, since the fault."""
    gap_start_ns: int | None
    """The last delivery before the gap, since the fault (negative: before it)."""

    def as_ms(self) -> dict[str, float | None]:
        ms = lambda v: None if v is None else round(v / 1e6, 3)  # noqa: E731
        return {"blackout_ms": ms(self.blackout_ns), "resume_ms": ms(self.resume_ns)}


def analyse(t_ns: Sequence[int], t_fault: int, *, window_ns: int = DEFAULT_WINDOW_NS,
            until_ns: int | None = None) -> Blackout:
    """The blackout of a flow delivered at the sorted times ``t_ns`` across a fault.

    The flow's usual pace is the median gap between its deliveries in the second before the
    fault; the blackout is the first gap from the fault on (within ``window_ns``) longer than
    three times that pace plus 1 ms: the disruption the fault caused, not a later hiccup. A
    flow with no such gap was not disrupted: its gap holding the fault is reported.
    ``until_ns``: the end of the measurement; a flow silent from the fault to then has a
    blackout that lasts until it (and no resume). A flow with no delivery before the fault
    (it started after it, or late) has no blackout to measure: None, resume at its first
    delivery.
    """
    n = len(t_ns)
    after = bisect_right(t_ns, t_fault)  # the first delivery after the fault
    if after == n:  # silent since the fault
        if not n:
            return Blackout(None, None, None)
        end = None if until_ns is None else max(0, until_ns - t_ns[-1])
        return Blackout(end, None, t_ns[-1] - t_fault)
    if not after:
        return Blackout(None, t_ns[0] - t_fault, None)
    start = t_ns[after - 1]
    first = Blackout(t_ns[after] - start, t_ns[after] - t_fault, start - t_fault)
    threshold = 3 * _pace(t_ns, after, t_fault) + 1_000_000
    if first.blackout_ns is not None and first.blackout_ns > threshold:
        return first
    stop = min(bisect_left(t_ns, t_fault + window_ns), n - 1)
    for i in range(after, stop):
        gap = t_ns[i + 1] - t_ns[i]
        if gap > threshold:
            return Blackout(gap, t_ns[i + 1] - t_fault, t_ns[i] - t_fault)
    return first


def _pace(t_ns: Sequence[int], after: int, t_fault: int) -> int:
    """Median gap between deliveries in the second before the fault (0 if too few)."""
    lo = bisect_left(t_ns, t_fault - 1_000_000_000)
    gaps = sorted(t_ns[i + 1] - t_ns[i] for i in range(lo, after - 1))
    return gaps[len(gaps) // 2] if gaps else 0


def lost_between(sent_t_ns: Sequence[int], delivered_seqs: set[int], start_ns: int, end_ns: int) -> int:
    """Messages sent in ``[start_ns, end_ns)`` that never arrived."""
    a, b = bisect_left(sent_t_ns, start_ns), bisect_left(sent_t_ns, end_ns)
    return sum(1 for seq in range(a, b) if seq not in delivered_seqs)


def timeline(t_ns: Sequence[int], nbytes: Sequence[int], t0_ns: int, t1_ns: int,
             bin_s: float = 0.1) -> tuple[list[float], list[float]]:
    """Throughput per bin (Gb/s) from deliveries: bin starts in seconds since ``t0_ns``."""
    width = int(bin_s * 1e9)
    nbins = max(1, -(-(t1_ns - t0_ns) // width))
    acc = [0] * nbins
    for t, n in zip(t_ns, nbytes, strict=True):
        k = (t - t0_ns) // width
        if 0 <= k < nbins:
            acc[k] += n
    return [round(k * bin_s, 6) for k in range(nbins)], [round(b * 8 / bin_s / 1e9, 6) for b in acc]


@dataclass(slots=True)
class LiveGaps:
    """A running watch of the frames a traffic worker's ports receive, for live metrics:
    the longest silence between two frames since the flows' time zero, so far (the blackout
    a fault is causing, seen while it lasts: ``silence_ns`` grows until frames come back).
    Called with each frame's receive stamp (``HcaPort.on_frame``); one comparison a frame.
    One worker runs one flow and the kernel gives it only its own QPs' frames, so these are
    the flow's (its data, and its ACKs at the sender)."""

    since_ns: int = 0
    frames: int = 0
    last_ns: int = 0
    longest_ns: int = 0
    longest_end_ns: int = 0

    def __call__(self, t_ns: int) -> None:
        if t_ns < self.since_ns:
            return
        self.frames += 1
        if self.last_ns:
            gap = t_ns - self.last_ns
            if gap > self.longest_ns:
                self.longest_ns, self.longest_end_ns = gap, t_ns
        if t_ns > self.last_ns:
            self.last_ns = t_ns

    def as_dict(self, now_ns: int) -> dict[str, int]:
        """The watch now: ``silence_ns`` since the last frame (the gap still open)."""
        return {"frames": self.frames, "last_ns": self.last_ns, "longest_gap_ns": self.longest_ns,
                "longest_gap_end_ns": self.longest_end_ns,
                "silence_ns": max(0, now_ns - self.last_ns) if self.last_ns else 0}

