"""Device agents for every node of a planned fabric, configured from the topology."""

from __future__ import annotations

from ibemu.agents.ca import CaAgent
from ibemu.agents.switch import SwitchAgent
from ibemu.fabric.agenthost import Agent
from ibemu.fabric.plan import FabricPlan
from ibemu.topo.model import Node


def make_agent(plan: FabricPlan, node: Node) -> Agent:
    topo = plan.topology
    cabled = plan.nodes[node.name].ports
    first_link = next((topo.link_at(node.name, p) for p in sorted(cabled)), None)
    rate = topo.rate_of(first_link) if first_link is not None else topo.defaults.rate
    common = dict(
        node_guid=node.guid,
        num_ports=node.num_ports,
        description=node.desc,
        vendor_id=node.vendor_id,
        device_id=node.device_id,
        system_image_guid=node.system_guid,
        link_up=None,  # all down: the agent host reports each cable's carrier as it sees it
        width=rate.width,
        speed=rate.speed,
        mtu=topo.defaults.mtu,
    )
    if node.is_switch:
        return SwitchAgent(**common)  # type: ignore[arg-type]
    return CaAgent(**common)  # type: ignore[arg-type]


def make_agents(plan: FabricPlan) -> dict[str, Agent]:
    return {name: make_agent(plan, plan.topology.node(name)) for name in plan.nodes}
