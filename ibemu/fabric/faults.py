"""Fault injection on a live fabric: cables, switches, flapping ports, SMP loss, corruption.

Every fault is stamped ``t_fault`` (``time.monotonic_ns()``, the clock every ibemu process
shares) in the fabric's event log as a ``fault`` event, so the reroute phases after it can be
measured: the agents log ``carrier`` (t_detect) and ``trap_sent``, the SM its trap, routing
and LFT acknowledgements.

- ``link_down``/``link_up``: one end of a cable goes administratively down (both ends lose
  carrier, as when a cable is pulled).
- ``switch_down``/``switch_up``: every port down and the agent silent; back up it is a fresh
  device (no LID, empty LFT) that the SM must bring up again.
- ``port_flap``: ``count`` down/up cycles of ``period_s``.
- ``smp_loss``: a share of the management frames reaching the agents is lost.
- ``corrupt``: a share of the frames a switch sends on a link gets a flipped bit (user datapath).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence

import trio

from ibemu.events import Kind
from ibemu.fabric.agenthost import Agent, AgentHost
from ibemu.kernel import rtnl
from ibemu.scenario.schema import FaultSpec
from ibemu.topo.model import Endpoint, Link

log = logging.getLogger(__name__)

AgentMaker = Callable[[str], Agent]


class FaultInjector:
    def __init__(self, host: AgentHost, make_agent: AgentMaker) -> None:
        self.host = host
        self.make_agent = make_agent
        self.topo = host.fabric.plan.topology
        self.injected: list[dict[str, object]] = []

    def _stamp(self, action: str, target: str, **fields: object) -> int:
        t = time.monotonic_ns()
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
        t = self._stamp("link_up" if up else "link_down", f"{link}", end=str(ep))
        rtnl.set_up(self.host.nodes[ep.node].plan.ns, [self.topo.ifname(ep.node, ep.port)], up)
        return t

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

    # ------------------------------------------------------------------ async, scheduled

    async def port_flap(self, link: Link, period_s: float, count: int) -> None:
        for _ in range(count):
            await trio.to_thread.run_sync(self.link, link, False)
            await trio.sleep(period_s / 2)
            await trio.to_thread.run_sync(self.link, link, True)
            await trio.sleep(period_s / 2)

    async def apply(self, fault: FaultSpec) -> None:
        action = fault.action
        if action in ("link_down", "link_up"):
            assert fault.link is not None
            await trio.to_thread.run_sync(lambda: self.link(fault.link, action == "link_up"))  # type: ignore[arg-type]
        elif action in ("switch_down", "switch_up"):
            assert fault.switch is not None
            await trio.to_thread.run_sync(self.switch, fault.switch, action == "switch_up")
        elif action == "port_flap":
            assert fault.link is not None and fault.period_s is not None
            await self.port_flap(fault.link, fault.period_s, fault.count)
        elif action == "smp_loss":
            self.smp_loss(fault.percent or 0.0, fault.switch)
            if fault.duration_s:
                await trio.sleep(fault.duration_s)
                self.smp_loss(0.0, fault.switch)
        elif action == "corrupt":
            assert fault.link is not None
            self.corrupt(fault.link, fault.percent or 0.0)
            if fault.duration_s:
                await trio.sleep(fault.duration_s)
                self.corrupt(fault.link, 0.0)
        else:
            raise ValueError(f"unknown fault action {action!r}")

    async def run(self, faults: Sequence[FaultSpec], *, t0: float | None = None,
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
