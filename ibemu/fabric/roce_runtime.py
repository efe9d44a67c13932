"""A RoCE fabric for a scenario run: build it, run its fabric manager, break its cables.

``RoceRuntime`` has the surface the scenario runner uses of ``FabricRuntime`` (``plan``,
``running()``, ``timings_s``, ``sm_up_s``, ``sm_host``), with the fabric manager in the SM's
place: ``sm_up_s`` is the manager's start to its ``fabric_up``. Its event log
(``fm.jsonl`` in the run directory) holds both what the fabric saw (``carrier``) and what
the manager did (``reroute``), so it serves the phase measurement as both logs.

``RoceFaultInjector`` breaks cables and routers as ``ibemu.fabric.faults.FaultInjector``
breaks an IB fabric (which needs an agent host): each fault stamped ``t_fault`` just before
its netlink call, in the same ``fault`` record shape. What it can suffer is what
``ibemu.fabric.faults.FAULT_ACTIONS`` says applies to ``roce``.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from ibemu import clock, events
from ibemu.errors import ConfigError
from ibemu.fabric.faults import FAULT_ACTIONS, FaultSpec, actions_on, run_schedule
from ibemu.fabric.plan import plan_fabric
from ibemu.fabric.roce_fabric import RoceRun
from ibemu.kernel import cpus, ownership, rtnl
from ibemu.kernel.ecn import EcnMarking
from ibemu.kernel.impair import Impairment
from ibemu.roce.queues import QueueConfig
from ibemu.topo import Topology
from ibemu.topo.model import Link

log = logging.getLogger(__name__)

FAULTS = actions_on("roce")
"""What a RoCE fabric can suffer (SMP loss and corruption are IB agents' business)."""


class RoceRuntime:
    def __init__(self, topo: Topology, *, state: ownership.RunState, run_dir: Path,
                 impair: Impairment | None = None, ecn: EcnMarking | None = None,
                 queues: QueueConfig | None = None) -> None:
        """``queues``: forward in the user datapath (``ibemu.roce.userpath``) with these queues."""
        self.topo = topo
        self.queues = queues
        self.counters: dict[str, Any] = {}
        """The user datapath's counters when it stopped."""
        self.impair = impair
        self.ecn = ecn
        self.state = state
        self.run_dir = run_dir
        self.plan = plan_fabric(topo, state.run_id)
        self.events_path = run_dir / "fm.jsonl"
        self.timings_s: dict[str, float] = {}
        self.sm_up_s: float | None = None
        self.sm_host = ""
        self.run: RoceRun | None = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[RoceRun]:
        """Build and bring up (routes programmed); always torn down on the way out. The CPUs
        are kept out of halt meanwhile (``kernel.cpus.awake``)."""
        with cpus.awake():
            async with self._running() as run:
                yield run

    @asynccontextmanager
    async def _running(self) -> AsyncIterator[RoceRun]:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            t0 = time.perf_counter()
            self.run = await trio.to_thread.run_sync(
                functools.partial(RoceRun.up, self.topo, self.state, events=self.events_path, impair=self.impair,
                                  ecn=self.ecn, queues=self.queues))
            self.timings_s = {**self.run.fab.phases_s, "up": time.perf_counter() - t0}
            self.sm_up_s = float(self.run.up_event.get("seconds", 0.0))
            self.state.status = "up"
            self.state.save()
            yield self.run
        finally:
            with trio.CancelScope(shield=True):
                if self.run is not None:
                    problems = await trio.to_thread.run_sync(self.run.down)
                    self.counters = self.run.counters
                    if problems:
                        log.error("teardown left: %s", "; ".join(problems))
                else:
                    await trio.to_thread.run_sync(ownership.teardown, self.state)


class RoceFaultInjector:
    fabric_kind = "roce"

    def __init__(self, fabric: RoceRun, events_path: Path) -> None:
        self.fabric = fabric
        self.topo = fabric.fab.plan.topology
        self.events_path = events_path
        self.injected: list[dict[str, Any]] = []

    def _stamp(self, action: str, target: str, *, t: int = 0, **fields: object) -> int:
        """Record a fault at ``t`` (default: now)."""
        t = t or clock.now_ns()
        record = {"kind": events.Kind.FAULT, "t_ns": t, "action": action, "target": target, **fields}
        self.injected.append(record)
        events.append(self.events_path, {**record, "source": "fault-injector"})
        log.info("fault %s %s", action, target)
        return t

    def link(self, link: Link, up: bool, *, end: int = 0) -> int:
        """Take one end of ``link`` down (or up): both ends lose carrier, as when it is pulled."""
        ep = link.a if end == 0 else link.b
        t = rtnl.set_up(self.fabric.fab.plan.nodes[ep.node].ns, [self.topo.ifname(ep.node, ep.port)], up)
        return self._stamp("link_up" if up else "link_down", f"{link}", t=t, end=str(ep))

    def switch(self, name: str, up: bool) -> int:
        """Every port of router ``name`` down (or up)."""
        node = self.fabric.fab.plan.nodes.get(name)
        if node is None or not node.is_switch:
            raise ConfigError(f"no switch {name!r}")
        t = rtnl.set_up(node.ns, [p.ifname for p in node.ports.values()], up)
        return self._stamp("switch_up" if up else "switch_down", name, t=t)

    def smp_loss(self, percent: float, switch: str | None = None) -> int:
        raise ConfigError(f"smp_loss: {FAULT_ACTIONS['smp_loss'].refusal}")

    def corrupt(self, link: Link, percent: float) -> int:
        raise ConfigError(f"corrupt: {FAULT_ACTIONS['corrupt'].refusal}")

    def sm(self, up: bool) -> int:
        action = "sm_up" if up else "sm_down"
        raise ConfigError(f"{action}: {FAULT_ACTIONS[action].refusal}")

    async def apply(self, fault: FaultSpec) -> None:
        action = FAULT_ACTIONS.get(fault.action)
        if action is None or self.fabric_kind not in action.fabrics:
            raise ConfigError(f"fault {fault.action!r} does not apply to a RoCE fabric (it has: {', '.join(FAULTS)})",
                              fault.where)
        await action.run(self, fault)

    async def serve(self, faults: Sequence[FaultSpec], *, t0: float | None = None,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Apply ``faults`` at their ``at_s`` (seconds after ``t0``, trio's clock; default now)."""
        await run_schedule(self.apply, faults, t0=t0, task_status=task_status)
