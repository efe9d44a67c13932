"""DCQCN at a RoCE sender (the reaction point), sans-IO: a rate per QP, cut by CNPs, recovering.

Zhu et al., "Congestion Control for Large-Scale RDMA Deployments" (SIGCOMM 2015), as NICs
implement it, with the timers evaluated lazily (each call catches up on the periods that
passed, so no timer task is needed):

- a CNP (at most one cut per ``cut_interval_ns``): target ``rt = rc``, ``rc *= 1 - alpha/2``,
  ``alpha = (1 - g) alpha + g``; the increase stages restart;
- every ``alpha_period_ns`` without a CNP: ``alpha *= 1 - g``;
- every ``increase_period_ns`` without a CNP: one increase stage: the first ``fast_stages``
  are fast recovery (``rc = (rt + rc) / 2``), later ones additive (``rt += ai_gbps`` first);
  rates never exceed the line rate, nor fall below ``min_gbps``.

``Pacer`` spaces one flow's frames at its current rate.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class DcqcnParams:
    line_gbps: float = 10.0
    min_gbps: float = 0.2
    g: float = 1 / 256
    ai_gbps: float = 0.05
    fast_stages: int = 5
    alpha_period_ns: int = 55_000
    increase_period_ns: int = 300_000
    cut_interval_ns: int = 50_000


@dataclass(slots=True)
class DcqcnState:
    """One QP's reaction point."""

    params: DcqcnParams
    rc: float = 0.0
    """Current rate, Gb/s."""
    rt: float = 0.0
    """Target rate, Gb/s."""
    alpha: float = 1.0
    stage: int = 0
    t_alpha: int = 0
    t_increase: int = 0
    t_cut: int = -(1 << 62)
    cnps: int = 0
    cuts: int = 0

    def __post_init__(self) -> None:
        self.rc = self.rt = self.params.line_gbps

    @property
    def limited(self) -> bool:
        return self.rc < self.params.line_gbps

    def on_cnp(self, now: int) -> None:
        self.advance(now)
        self.cnps += 1
        p = self.params
        if now - self.t_cut < p.cut_interval_ns:
            return
        self.t_cut = now
        self.cuts += 1
        self.rt = self.rc
        self.rc = max(p.min_gbps, self.rc * (1 - self.alpha / 2))
        self.alpha = (1 - p.g) * self.alpha + p.g
        self.stage = 0
        self.t_alpha = self.t_increase = now

    def advance(self, now: int) -> None:
        """Catch up on the alpha and increase periods that passed by ``now``."""
        p = self.params
        if not self.limited:
            self.t_alpha = self.t_increase = now
            return
        n = (now - self.t_alpha) // p.alpha_period_ns
        if n > 0:
            self.alpha *= (1 - p.g) ** min(n, 1 << 16)
            self.t_alpha += n * p.alpha_period_ns
        n = (now - self.t_increase) // p.increase_period_ns
        for _ in range(min(n, 256)):
            self.stage += 1
            if self.stage > p.fast_stages:
                self.rt = min(p.line_gbps, self.rt + p.ai_gbps)
            self.rc = min(p.line_gbps, (self.rt + self.rc) / 2)
            if self.rc >= p.line_gbps * 0.999:
                self.rc = self.rt = p.line_gbps
                break
        if n > 0:
            self.t_increase += n * p.increase_period_ns

    def rate_gbps(self, now: int) -> float:
        self.advance(now)
        return self.rc


@dataclass(slots=True)
class Pacer:
    """A flow's departure times at its rate: ``due(now, nbytes)`` is when a frame may leave."""

    state: DcqcnState
    next_ns: int = 0
    sent: int = field(default=0)

    def due(self, now: int, nbytes: int) -> int:
        rate = self.state.rate_gbps(now)
        at = max(now, self.next_ns)
        self.next_ns = at + int(nbytes * 8 / rate)  # Gb/s = bits per ns
        self.sent += 1
        return at
