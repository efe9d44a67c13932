"""From a run's event logs and flow records to the reroute phases and blackouts of each fault.

Every ibemu process stamps with ``ibemu.clock.now_ns()`` (emulated time) at the source, so the phases are
differences of stamps taken where things happened (no runner latency in them):

- ``detect``: the first ``carrier`` change a port of the fabric logged after the fault;
- ``trap``: the SM received a trap (ibemu's SM ``trap`` event; OpenSM's from its flushed log,
  moved onto the monotonic clock by ``ibemu.fabric.opensm_log``);
- ``routed``: the SM's ``reroute`` whose trap (or sweep) followed the fault: ``t_routed``
  (OpenSM: its "tables configured" line of the sweep that trap started);
- ``programmed``: that reroute's last LFT block acknowledged (``t_programmed``); for an SM
  without such events, the last ``lft_programmed`` a switch logged within the fault's window.

Each phase is milliseconds since the fault was injected. A fault's window ends at the next
fault (or the end of the run).

A takeover (``sm_down`` with a standby SM, ``sm.standby``) has phases of its own, from the
standby's log: ``sm_silent`` (its first poll the master did not answer), ``sm_noticed`` (it
gave up on the master: ``sm_master_lost``), ``sm_master`` (it entered the MASTER state) and
``sm_swept`` (its takeover sweep ended: every LFT written again; OpenSM: its SUBNET UP). They
are looked for up to ``TAKEOVER_SETTLE_NS`` after the fault (the polling takes seconds).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ibemu.events import Kind
from ibemu.events import read_events as read_events  # ibemu.scenario.runner reads the logs with it
from ibemu.traffic import training
from ibemu.traffic.blackout import DEFAULT_WINDOW_NS, analyse, lost_between, timeline
from ibemu.traffic.flows import FlowOutput

SETTLE_NS = 5_000_000_000
"""How long after a fault its consequences are looked for, at most."""
TAKEOVER_SETTLE_NS = 120_000_000_000
"""The same for a takeover's phases (a standby polls for seconds before it takes over)."""
TAKEOVER_PHASES = ("sm_silent", "sm_noticed", "sm_master", "sm_swept")


def _first(records: Iterable[dict[str, Any]], kind: str, lo: int, hi: int, key: str = "t_ns") -> int | None:
    best = None
    for r in records:
        if r.get("kind") != kind:
            continue
        t = r.get(key)
        if isinstance(t, int) and lo <= t < hi and (best is None or t < best):
            best = t
    return best


def _ms(t: int | None, t_fault: int) -> float | None:
    return None if t is None else round((t - t_fault) / 1e6, 3)


def fault_phases(t_fault: int, window_end: int, fabric: Sequence[dict[str, Any]],
                 sm: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """The phases of one fault, in ms since ``t_fault``."""
    hi = min(window_end, t_fault + SETTLE_NS)
    detect = _first(fabric, Kind.CARRIER, t_fault, hi)
    trap = _first(sm, Kind.TRAP, t_fault, hi)
    routed = programmed = None
    reroutes = [r for r in sm if r.get("kind") == Kind.REROUTE
                and isinstance(r.get("t_routed"), int) and t_fault <= r["t_routed"] < hi]
    if reroutes:
        first = min(reroutes, key=lambda r: r["t_routed"])
        routed = first["t_routed"]
        programmed = first.get("t_programmed") if isinstance(first.get("t_programmed"), int) else None
    if programmed is None:
        acks = [r["t_ns"] for r in fabric if r.get("kind") == Kind.LFT_PROGRAMMED
                and isinstance(r.get("t_ns"), int) and t_fault <= r["t_ns"] < hi]
        programmed = max(acks) if acks else None
    out = {"detect": _ms(detect, t_fault), "trap": _ms(trap, t_fault),
           "routed": _ms(routed, t_fault), "programmed": _ms(programmed, t_fault)}
    failover = _first(fabric, Kind.LOCAL_FAILOVER, t_fault, hi)  # a switch on its alternates
    if failover is not None:
        out["local_failover"] = _ms(failover, t_fault)
    out.update(takeover_phases(t_fault, min(window_end, t_fault + TAKEOVER_SETTLE_NS), sm))
    return out


def takeover_phases(t_fault: int, hi: int, sm: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """A standby taking over after ``t_fault`` (module docstring); {} when no SM became master
    in the window."""
    master = next((r["t_ns"] for r in sm if r.get("kind") == Kind.SM_STATE and r.get("new") == "master"
                   and isinstance(r.get("t_ns"), int) and t_fault <= r["t_ns"] < hi), None)
    if master is None:
        return {}
    silent = _first(sm, Kind.SM_POLL_FAILED, t_fault, master + 1)
    noticed = _first(sm, Kind.SM_MASTER_LOST, t_fault, master + 1)
    swept = next((r["t_ns"] for r in sm if r.get("kind") == Kind.SWEEP_END and r.get("reason") == "takeover"
                  and r.get("ok") and isinstance(r.get("t_ns"), int) and master <= r["t_ns"] < hi), None)
    if swept is None:  # OpenSM: its SUBNET UP as master
        swept = _first(sm, Kind.SUBNET_UP, master, hi)
    return {"sm_silent": _ms(silent, t_fault), "sm_noticed": _ms(noticed, t_fault),
            "sm_master": _ms(master, t_fault), "sm_swept": _ms(swept, t_fault)}


def flow_impact(flow: FlowOutput, t_fault: int, window_end: int, until_ns: int) -> dict[str, Any]:
    """A flow's blackout across a fault, its loss and retransmissions in the fault's window; a
    training job's stall and slower steps too (``training.fault_impact``, up to the next fault)."""
    window = min(DEFAULT_WINDOW_NS, min(window_end, until_ns) - t_fault)
    b = analyse(flow.t_ns, t_fault, window_ns=window, until_ns=until_ns)
    lost = 0
    if flow.sent_t_ns and flow.kind == "stream":
        lost = lost_between(flow.sent_t_ns, set(flow.recv_seq), t_fault, min(window_end, until_ns))
    out: dict[str, Any] = {"flow": flow.name, **b.as_ms(), "lost": lost, "retransmitted": flow.retransmitted}
    if flow.kind == "training" and flow.extra.get("step_us"):  # its steps are its deliveries
        out["training"] = training.fault_impact(flow.t_ns, flow.extra["step_us"], t_fault, window_end)
    return out


def traffic_entry(flow: FlowOutput, t0_ns: int, t1_ns: int, bin_s: float) -> dict[str, Any]:
    """The ``traffic`` record of one flow (throughput over the run, its figures)."""
    total = sum(flow.nbytes)
    first = flow.t_ns[0] if flow.t_ns else t0_ns
    last = flow.t_ns[-1] if flow.t_ns else t0_ns
    active_s = max((last - first) / 1e9, 1e-9)
    t_s, gbps = timeline(flow.t_ns, flow.nbytes, t0_ns, t1_ns, bin_s)
    extra = dict(flow.extra)
    if flow.error:
        extra["error"] = flow.error
    return {"name": flow.name, "kind": flow.kind, "from": flow.src, "to": flow.dst,
            "gbps": round(total * 8 / active_s / 1e9, 6) if len(flow.t_ns) > 1 else 0.0,
            "packets": flow.packets, "bytes": total, "timeline": {"t_s": t_s, "gbps": gbps},
            "extra": extra}
