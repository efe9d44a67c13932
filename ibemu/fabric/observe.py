"""What a running IB fabric looks like from outside: port states, PMA counters, cable loads.

Read from the agent host (``ibemu.fabric.agenthost``) on its own trio thread: each node's
carrier (netlink, as the host saw it last), each port's logical and physical state (the
device agent's PortInfo) and its PMA counters (the agent's ``PortCounters``; the ports whose
frames the kernel carries are brought up to date from the interfaces' statistics first, as a
PMA read would: ``DeviceAgent.link_counters``). Nothing here changes the fabric.

``ibemu run`` records ``cable_loads`` in its result (``link_load``, drawn by the HTML report)
and the live page of ``ibemu up --web`` (``ibemu.fabric.web``) serves ``port_states`` and
``port_counters``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from ibemu.fabric.agenthost import AgentHost
from ibemu.topo import Topology

log = logging.getLogger(__name__)

STATE_NAMES = {0: "NoChange", 1: "Down", 2: "Init", 3: "Armed", 4: "Active"}
PHYS_NAMES = {0: "NoChange", 1: "Sleep", 2: "Polling", 3: "Disabled", 4: "PortConfigurationTraining",
              5: "LinkUp", 6: "LinkErrorRecovery", 7: "PhyTest"}
"""PortInfo's PortState and PortPhysicalState, as ``ibstat``/``smpquery`` name them."""
SHOWN_COUNTERS = ("xmit_octets", "rcv_octets", "xmit_pkts", "rcv_pkts", "symbol_error_counter",
                  "link_downed_counter", "port_rcv_errors", "port_xmit_discards", "port_xmit_wait")
"""The PMA counters the live page shows (of ``PortCounters.NAMES``)."""


def port_states(host: AgentHost) -> dict[str, dict[int, tuple[bool, str, str]]]:
    """node -> port -> (carrier up, PortState name, PortPhysicalState name); a powered-off
    node's ports are all down."""
    out: dict[str, dict[int, tuple[bool, str, str]]] = {}
    for name, rt in host.nodes.items():
        ports = getattr(rt.agent, "ports", {})
        row: dict[int, tuple[bool, str, str]] = {}
        for num in rt.plan.ports:
            p = ports.get(num)
            state = STATE_NAMES.get(int(p.state), str(p.state)) if p is not None else "?"
            phys = PHYS_NAMES.get(int(p.phys), str(p.phys)) if p is not None else "?"
            row[num] = (rt.powered and rt.carrier.get(num, False), state, phys)
        out[name] = row
    return out


def refresh_counters(host: AgentHost, nodes: Iterable[str] | None = None) -> None:
    """Bring the kernel-carried ports' counters of ``nodes`` (default: all) up to date: one
    netlink dump per node, 0.4-0.8 ms each here (a k=8 fat-tree's 208 nodes: 80-160 ms)."""
    for name in host.nodes if nodes is None else nodes:
        rt = host.nodes[name]
        refresh = getattr(rt.agent, "link_counters", None)
        if refresh is not None and rt.powered:
            refresh(list(rt.plan.ports))


def port_counters(host: AgentHost, names: tuple[str, ...] = SHOWN_COUNTERS, refresh: bool = True,
                  nodes: Iterable[str] | None = None) -> dict[str, dict[int, dict[str, int]]]:
    """node -> port -> counter -> value (64-bit accumulators, octets not words), of ``nodes``
    (default: all); ``refresh``: from the kernel first (``refresh_counters``)."""
    chosen = list(host.nodes) if nodes is None else list(nodes)
    if refresh:
        refresh_counters(host, chosen)
    out: dict[str, dict[int, dict[str, int]]] = {}
    for name in chosen:
        rt = host.nodes[name]
        ports = getattr(rt.agent, "ports", {})
        out[name] = {num: {c: int(getattr(ports[num].counters, c)) for c in names}
                     for num in rt.plan.ports if num in ports}
    return out


def cable_loads(host: AgentHost, topo: Topology) -> dict[str, Any]:
    """The result's ``link_load``: every node's kind and every cable with the octets it carried
    in both directions (what each end transmitted), ``None`` where an end has no counters."""
    counters = port_counters(host, ("xmit_octets",))
    links = []
    for lk in topo.links:
        a = counters.get(lk.a.node, {}).get(lk.a.port)
        b = counters.get(lk.b.node, {}).get(lk.b.port)
        total = None if a is None or b is None else a["xmit_octets"] + b["xmit_octets"]
        links.append({"a": str(lk.a), "b": str(lk.b), "bytes": total})
    return {"nodes": {n.name: n.kind.value for n in topo.nodes.values()}, "links": links}
