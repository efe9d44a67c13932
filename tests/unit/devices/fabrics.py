"""Small in-memory fabrics for the device tests."""

from __future__ import annotations

from ibemu.agents.ca import CaAgent
from ibemu.agents.switch import SwitchAgent
from ibemu.agents.traps import TrapPolicy
from ibemu.testing.wiring import InMemoryFabric


def switch(fab: InMemoryFabric, name: str, guid: int, ports: int = 8, **kw: object) -> SwitchAgent:
    agent = SwitchAgent(node_guid=guid, num_ports=ports, description=name, clock=fab.clock, **kw)  # type: ignore[arg-type]
    fab.add(name, agent)
    return agent


def ca(fab: InMemoryFabric, name: str, guid: int, ports: int = 1, **kw: object) -> CaAgent:
    agent = CaAgent(node_guid=guid, num_ports=ports, description=name, clock=fab.clock, **kw)  # type: ignore[arg-type]
    fab.add(name, agent)
    return agent


def chain(n_switches: int = 3, trap_policy: TrapPolicy | None = None) -> InMemoryFabric:
    """sm:1 - s1:6 ; s1:3 - s2:1 ; s2:3 - s3:1 ; ... ; sN:5 - h:1 (h = the far host)."""
    fab = InMemoryFabric()
    sm = ca(fab, "sm", 0x0002C90000000100)
    sm.set_is_sm(1, True)
    for i in range(1, n_switches + 1):
        switch(fab, f"s{i}", 0x0002C90000001000 + i, trap_policy=trap_policy)
    ca(fab, "h", 0x0002C90000000200)
    fab.connect("sm", 1, "s1", 6)
    for i in range(1, n_switches):
        fab.connect(f"s{i}", 3, f"s{i + 1}", 1)
    fab.connect(f"s{n_switches}", 5, "h", 1)
    return fab


def tree() -> InMemoryFabric:
    """Two spines, three leaves (each leaf cabled to both spines), two hosts per leaf,
    the SM on leaf 1 port 8; one host with two ports on leaves 2 and 3."""
    fab = InMemoryFabric()
    sm = ca(fab, "sm", 0x100)
    sm.set_is_sm(1, True)
    for s in (1, 2):
        switch(fab, f"spine{s}", 0x1000 + s, ports=6)
    for leaf in (1, 2, 3):
        switch(fab, f"leaf{leaf}", 0x2000 + leaf, ports=8)
        for s in (1, 2):
            fab.connect(f"leaf{leaf}", s, f"spine{s}", leaf)
        for h in (1, 2):
            ca(fab, f"h{leaf}{h}", 0x3000 + 16 * leaf + h)
            fab.connect(f"leaf{leaf}", 4 + h, f"h{leaf}{h}", 1)
    ca(fab, "dual", 0x4000, ports=2)
    fab.connect("leaf2", 7, "dual", 1)
    fab.connect("leaf3", 7, "dual", 2)
    fab.connect("leaf1", 8, "sm", 1)
    return fab
