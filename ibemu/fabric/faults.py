"""Fault injection on a live fabric, and the registry of fault actions.

``FaultSpec`` is one fault (a scenario's ``faults:`` entry, resolved by
:mod:`ibemu.scenario.loader`). ``FAULT_ACTIONS`` is the one table of fault actions: per name,
the keys a scenario entry takes, the fabric kinds and IB datapaths it applies to, how it is
carried out on schedule (by either fabric's injector: :class:`FaultInjector` here, the RoCE
one in :mod:`ibemu.fabric.roce_runtime`) and on demand (the daemon's control channel,
:mod:`ibemu.fabric.control`). The scenario loader, the runner's ``check_runnable``, both
injectors and the control channel read it; a new action is one entry (and, if it needs one, a
new primitive on the injectors).

Every fault is stamped ``t_fault`` (``clock.now_ns()``, the clock every ibemu process
shares; for a cable, as the netlink request leaves for the kernel, after the namespace switch
and socket set-up that are the emulator's own cost) in the fabric's event log as a ``fault`` event, so the reroute phases after it can be
measured: the agents log ``carrier`` (t_detect) and ``trap_sent``, the SM its trap, routing
and LFT acknowledgements.

- ``link_down``/``link_up``: one end of a cable goes administratively down (both ends lose
  carrier, as when a cable is pulled).
- ``switch_down``/``switch_up``: every port down and the agent silent; back up it is a fresh
  device (no LID, empty LFT) that the SM must bring up again.
- ``port_flap``: ``count`` down/up cycles of ``period_s``.
- ``smp_loss``: a share of the management frames reaching the agents is lost.
- ``corrupt``: a share of the frames a switch sends on a link gets a flipped bit (user datapath).
- ``sm_down``/``sm_up``: the master SM's process is killed (SIGKILL: its host died, no goodbye),
  or started again on its host (it finds the standby become master and stands by). The SM
  control is the fabric runtime's (``FabricRuntime.sm_power``), given to the injector.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import trio

from ibemu import clock
from ibemu.events import Kind
from ibemu.topo.model import Endpoint, Link, Topology

if TYPE_CHECKING:
    from ibemu.fabric.agenthost import Agent, AgentHost

log = logging.getLogger(__name__)

AgentMaker = Callable[[str], "Agent"]


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """One fault injected at ``at_s`` (a scenario's ``faults:`` entry, targets resolved)."""

    at_s: float
    action: str
    link: Link | None = None
    switch: str | None = None
    period_s: float | None = None
    count: int = 1
    percent: float | None = None
    duration_s: float | None = None
    where: str = ""

    @property
    def sm(self) -> str | None:
        """The target of ``sm_down``/``sm_up`` (the master SM), for their down/up alternation."""
        return "master" if self.action in ("sm_down", "sm_up") else None


class Injector(Protocol):
    """What a fault action needs of a fabric's injector: its primitives, each stamped and
    returning t_fault (``FaultInjector``, ``RoceFaultInjector``)."""

    topo: Topology
    fabric_kind: str
    """The fabric kind (``ib``, ``roce``): which actions apply (``FaultAction.fabrics``)."""

    def link(self, link: Link, up: bool, *, end: int = 0) -> int: ...
    def switch(self, name: str, up: bool) -> int: ...
    def smp_loss(self, percent: float, switch: str | None = None) -> int: ...
    def corrupt(self, link: Link, percent: float) -> int: ...
    def sm(self, up: bool) -> int: ...


class Request(Protocol):
    """A control-channel request as an action reads its arguments; :mod:`ibemu.fabric.control`
    parses them (names resolved as in scenarios) and refuses bad ones."""

    def link(self) -> Link: ...
    def end(self, link: Link) -> int: ...
    def percent(self) -> float: ...
    def switch(self) -> str: ...
    def optional_switch(self) -> str | None: ...


Run = Callable[[Injector, FaultSpec], Awaitable[None]]
OnDemand = Callable[[Injector, Request], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class FaultAction:
    """One fault action: what it takes, where it applies, how it is carried out."""

    keys: tuple[str, ...]
    """Keys a scenario entry takes besides ``at_s`` and ``action``, in the order errors list them."""
    required: tuple[str, ...]
    """Of ``keys``, the ones it must have."""
    run: Run
    """Carry out a scheduled fault (on either fabric's injector)."""
    on_demand: OnDemand | None = None
    """Carry out a control-channel request: its reply (``ok`` added); None: not on the channel."""
    fabrics: tuple[str, ...] = ("ib", "roce")
    """The fabric kinds it applies to."""
    datapaths: tuple[str, ...] = ("kernel", "user")
    """The datapaths it needs (checked on an IB fabric; a RoCE one checks ``fabrics``)."""
    refusal: str = ""
    """Why it does not apply to the other fabric kinds (said by the control channel)."""
    sets: tuple[str, bool] | None = None
    """(target key, up?) when it takes a link or switch down or up: down and up must alternate."""


# ---------------------------------------------------------------------- the actions


def _set_link(up: bool) -> Run:
    async def run(inj: Injector, f: FaultSpec) -> None:
        assert f.link is not None
        await trio.to_thread.run_sync(functools.partial(inj.link, f.link, up))
    return run


def _set_switch(up: bool) -> Run:
    async def run(inj: Injector, f: FaultSpec) -> None:
        assert f.switch is not None
        await trio.to_thread.run_sync(inj.switch, f.switch, up)
    return run


async def flap(inj: Injector, link: Link, period_s: float, count: int) -> None:
    """``count`` down/up cycles of ``period_s`` on one end of ``link``."""
    for _ in range(count):
        await trio.to_thread.run_sync(inj.link, link, False)
        await trio.sleep(period_s / 2)
        await trio.to_thread.run_sync(inj.link, link, True)
        await trio.sleep(period_s / 2)


async def _port_flap(inj: Injector, f: FaultSpec) -> None:
    assert f.link is not None and f.period_s is not None
    await flap(inj, f.link, f.period_s, f.count)


async def _smp_loss(inj: Injector, f: FaultSpec) -> None:
    inj.smp_loss(f.percent or 0.0, f.switch)
    if f.duration_s:
        await trio.sleep(f.duration_s)
        inj.smp_loss(0.0, f.switch)


async def _corrupt(inj: Injector, f: FaultSpec) -> None:
    assert f.link is not None
    inj.corrupt(f.link, f.percent or 0.0)
    if f.duration_s:
        await trio.sleep(f.duration_s)
        inj.corrupt(f.link, 0.0)


def _set_sm(up: bool) -> Run:
    async def run(inj: Injector, f: FaultSpec) -> None:
        await trio.to_thread.run_sync(inj.sm, up)
    return run


def _sm_now(up: bool) -> OnDemand:
    def now(inj: Injector, req: Request) -> dict[str, Any]:
        return {"t_fault_ns": inj.sm(up)}
    return now


def _link_now(up: bool) -> OnDemand:
    def now(inj: Injector, req: Request) -> dict[str, Any]:
        link = req.link()
        end = req.end(link)
        return {"link": str(link), "t_fault_ns": inj.link(link, up, end=end)}
    return now


def _switch_now(up: bool) -> OnDemand:
    def now(inj: Injector, req: Request) -> dict[str, Any]:
        name = req.switch()
        return {"switch": name, "t_fault_ns": inj.switch(name, up)}
    return now


def _smp_loss_now(inj: Injector, req: Request) -> dict[str, Any]:
    name = req.optional_switch()
    return {"t_fault_ns": inj.smp_loss(req.percent(), name)}


def _corrupt_now(inj: Injector, req: Request) -> dict[str, Any]:
    link = req.link()
    return {"link": str(link), "t_fault_ns": inj.corrupt(link, req.percent())}


FAULT_ACTIONS: dict[str, FaultAction] = {
    "link_down": FaultAction(("link",), ("link",), _set_link(False), _link_now(False), sets=("link", False)),
    "link_up": FaultAction(("link",), ("link",), _set_link(True), _link_now(True), sets=("link", True)),
    "switch_down": FaultAction(("switch",), ("switch",), _set_switch(False), _switch_now(False),
                               sets=("switch", False)),
    "switch_up": FaultAction(("switch",), ("switch",), _set_switch(True), _switch_now(True), sets=("switch", True)),
    "port_flap": FaultAction(("link", "period_s", "count"), ("link", "period_s"), _port_flap),
    "smp_loss": FaultAction(("percent", "switch", "duration_s"), ("percent",), _smp_loss, _smp_loss_now,
                            fabrics=("ib",), refusal="a RoCE fabric has no SMPs"),
    "corrupt": FaultAction(("percent", "link", "duration_s"), ("percent",), _corrupt, _corrupt_now,
                           fabrics=("ib",), datapaths=("user",),
                           refusal="frame corruption is a fault of the IB user datapath"),
    "sm_down": FaultAction((), (), _set_sm(False), _sm_now(False), fabrics=("ib",),
                           refusal="a RoCE fabric has no subnet manager", sets=("sm", False)),
    "sm_up": FaultAction((), (), _set_sm(True), _sm_now(True), fabrics=("ib",),
                         refusal="a RoCE fabric has no subnet manager", sets=("sm", True)),
}
"""Every fault action, by name (the order scenario errors list them in)."""


def actions_on(fabric: str) -> tuple[str, ...]:
    """The actions that apply to a fabric kind, in registry order."""
    return tuple(name for name, a in FAULT_ACTIONS.items() if fabric in a.fabrics)


def on_demand() -> tuple[str, ...]:
    """The actions the control channel takes."""
    return tuple(name for name, a in FAULT_ACTIONS.items() if a.on_demand is not None)


# ---------------------------------------------------------------------- the IB injector
class FaultInjector:
    """Faults on an IB fabric, through its agent host (``make_agent``: a switch back up fresh)."""

    fabric_kind = "ib"

    def __init__(self, host: AgentHost, make_agent: AgentMaker,
                 sm_power: Callable[[bool], int] | None = None) -> None:
        """``sm_power(up)``: stop (kill) or start the master SM, returning the act's stamp
        (``FabricRuntime.sm_power``); None: the faults on the SM are refused."""
        self.host = host
        self.make_agent = make_agent
        self.sm_power = sm_power
        self.topo = host.fabric.plan.topology
        self.injected: list[dict[str, object]] = []

    def _stamp(self, action: str, target: str, *, t: int = 0, **fields: object) -> int:
        """Record a fault at ``t`` (default: now)."""
        t = t or clock.now_ns()
        record = {"kind": Kind.FAULT, "t_ns": t, "action": action, "target": target, **fields}
        self.injected.append(record)
        self.host.events.write("fault-injector", record)
        log.info("fault %s %s", action, target)
        return t

    def _end(self, link: Link, end: int) -> Endpoint:
        return link.a if end == 0 else link.b

    # ------------------------------------------------------------------ blocking actions

    def link(self, link: Link, up: bool, *, end: int = 0) -> int:
        """Take one end of ``link`` down (or up); returns t_fault."""
        ep = self._end(link, end)
        t = self.host.set_ports(ep.node, [ep.port], up)
        return self._stamp("link_up" if up else "link_down", f"{link}", t=t, end=str(ep))

    def switch(self, name: str, up: bool) -> int:
        if name not in self.host.nodes or not self.topo.node(name).is_switch:
            raise ValueError(f"no switch {name!r}")
        t = self._stamp("switch_up" if up else "switch_down", name)
        self.host.power(name, up, fresh_agent=self.make_agent(name) if up else None)
        return t

    def smp_loss(self, percent: float, switch: str | None = None) -> int:
        """Lose ``percent`` % of the VL15 frames reaching the agents (of one switch, or all)."""
        if not 0.0 <= percent <= 100.0:
            raise ValueError(f"percent must be within 0..100, not {percent}")
        names = [switch] if switch else list(self.host.nodes)
        for name in names:
            self.host.set_vl15_loss(name, percent / 100.0)
        return self._stamp("smp_loss", switch or "all", percent=percent)

    def corrupt(self, link: Link, percent: float) -> int:
        """Flip a bit in ``percent`` % of the frames the link's switch ends send on it."""
        t = self._stamp("corrupt", f"{link}", percent=percent)
        for ep in (link.a, link.b):
            if self.topo.node(ep.node).is_switch:
                self.host.impair(ep.node, ep.port, corrupt_pct=percent)
        return t

    def sm(self, up: bool) -> int:
        """Kill the master SM's process (``up=False``) or start it again; returns t_fault."""
        if self.sm_power is None:
            raise ValueError("this fabric's SM cannot be stopped or started here")
        t = self.sm_power(up)
        return self._stamp("sm_up" if up else "sm_down", "sm", t=t)

    # ------------------------------------------------------------------ async, scheduled

    async def port_flap(self, link: Link, period_s: float, count: int) -> None:
        await flap(self, link, period_s, count)

    async def apply(self, fault: FaultSpec) -> None:
        action = FAULT_ACTIONS.get(fault.action)
        if action is None:
            raise ValueError(f"unknown fault action {fault.action!r}")
        await action.run(self, fault)

    async def serve(self, faults: Sequence[FaultSpec], *, t0: float | None = None,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Apply ``faults`` at their ``at_s`` (seconds after ``t0``, trio's clock; default now)."""
        await run_schedule(self.apply, faults, t0=t0, task_status=task_status)


async def run_schedule(apply: Callable[[FaultSpec], Awaitable[None]], faults: Sequence[FaultSpec], *,
                       t0: float | None = None,
                       task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """``apply`` each fault at its ``at_s`` (seconds after ``t0``, trio's clock; default now),
    each in a task of its own (a flap or a timed corruption runs on while the next starts)."""
    start = trio.current_time() if t0 is None else t0
    task_status.started()
    async with trio.open_nursery() as nursery:
        for fault in sorted(faults, key=lambda f: f.at_s):
            await trio.sleep_until(start + fault.at_s)
            nursery.start_soon(apply, fault)
