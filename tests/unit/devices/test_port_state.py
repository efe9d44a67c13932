"""The PortState machine driven by SubnSet(PortInfo), and physical link events."""

from __future__ import annotations

import pytest

from ibemu.agents.actions import LinkRequest, LinkRequestKind, PortStateChange
from ibemu.agents.port import PhysState, Port, PortState
from ibemu.wire import madcodec as mb

from .fabrics import chain
from .minism import MiniSm

PI = 0x15


def sm_of(fab):  # type: ignore[no-untyped-def]
    sm = MiniSm(fab, "sm")
    sm.discover()
    return sm


def set_state(sm: MiniSm, path: list[int], port: int, state: int = 0, phys: int = 0) -> tuple[int, mb.PortInfoView]:
    pi = sm.ok(path, PI, mod=port)
    d = sm.query(path, PI, mod=port, method=mb.SET, data=mb.port_info_set(pi, port_state=state, phys_state=phys))
    return mb.status(d.mad), mb.parse_port_info(mb.smp_data(d.mad))


def test_init_armed_active_one_step_at_a_time() -> None:
    fab = chain(1)
    sm = sm_of(fab)
    assert set_state(sm, [1], 6, 4)[0] == 0x1C  # Init -> Active: illegal jump
    status, pi = set_state(sm, [1], 6, 3)
    assert status == 0 and pi.port_state == 3
    assert set_state(sm, [1], 6, 3)[0] == 0  # a retried Set is accepted
    assert set_state(sm, [1], 6, 2)[0] == 0x1C  # Armed -> Init is not a Set
    status, pi = set_state(sm, [1], 6, 4)
    assert status == 0 and pi.port_state == 4
    assert set_state(sm, [1], 6, 3)[0] == 0x1C  # Active -> Armed
    assert [c.state for c in fab.state_changes["s1"] if c.port == 6][-2:] == [PortState.ARMED, PortState.ACTIVE]


@pytest.mark.parametrize("state", [5, 9, 15])
def test_invalid_port_state_values(state: int) -> None:
    sm = sm_of(chain(1))
    assert set_state(sm, [1], 3, state)[0] == 0x1C


def test_armed_needs_the_physical_link() -> None:
    fab = chain(1)
    sm = sm_of(fab)
    status, pi = set_state(sm, [1], 2, 3)  # s1 port 2 has no cable
    assert status == 0x1C and pi.port_state == 1 and pi.phys_state == 2


def test_invalid_set_changes_nothing() -> None:
    fab = chain(1)
    sm = sm_of(fab)
    pi = sm.ok([1], PI, mod=6)
    data = bytearray(mb.port_info_set(pi, port_state=3))
    data[36] = (7 << 4)  # NeighborMTU 7: invalid
    d = sm.query([1], PI, mod=6, method=mb.SET, data=bytes(data))
    assert mb.status(d.mad) == 0x1C and mb.parse_port_info(mb.smp_data(d.mad)).port_state == 2


def test_link_down_and_up_events() -> None:
    fab = chain(1)
    MiniSm(fab, "sm").bring_up()
    s1 = fab.agents["s1"]
    fab.state_changes["s1"].clear()
    fab.link_down("s1", 5)
    assert fab.state_changes["s1"] == [PortStateChange(5, PortState.DOWN, PhysState.POLLING)]
    assert s1.counters(5).link_downed_counter == 1
    fab.link_up("s1", 5)
    assert fab.state_changes["s1"][-1] == PortStateChange(5, PortState.INIT, PhysState.LINK_UP)
    assert fab.agents["h"].ports[1].state == PortState.INIT


def test_set_down_retrains_both_ends_to_init() -> None:
    fab = chain(1)
    sm = MiniSm(fab, "sm")
    sm.bring_up()
    s1 = sm.nodes[fab.agents["s1"].node_guid]
    status, pi = set_state(sm, s1.path, 5, 1)
    assert status == 0 and pi.port_state == 2 and pi.phys_state == 5
    assert fab.link_requests["s1"] == [LinkRequest(5, LinkRequestKind.RETRAIN)]
    assert fab.agents["h"].ports[1].state == PortState.INIT  # the peer fell back too
    assert fab.agents["s1"].counters(5).link_downed_counter == 0  # asked for: not a link failure


def test_disable_and_enable_a_port() -> None:
    fab = chain(1)
    sm = MiniSm(fab, "sm")
    sm.bring_up()
    status, pi = set_state(sm, [1], 5, 0, phys=3)
    assert status == 0 and (pi.port_state, pi.phys_state) == (1, 3)
    assert fab.link_requests["s1"][-1] == LinkRequest(5, LinkRequestKind.DISABLE)
    assert fab.agents["h"].ports[1].state == PortState.DOWN  # the peer lost the link
    fab.link_up("s1", 5)  # a disabled port does not come up by itself
    assert fab.agents["s1"].ports[5].phys == PhysState.DISABLED
    status, pi = set_state(sm, [1], 5, 0, phys=2)
    assert status == 0 and (pi.port_state, pi.phys_state) == (1, 2)  # Polling; then it trains
    assert fab.link_requests["s1"][-1] == LinkRequest(5, LinkRequestKind.ENABLE)
    p5 = fab.agents["s1"].ports[5]
    assert (p5.state, p5.phys) == (PortState.INIT, PhysState.LINK_UP)
    assert fab.agents["h"].ports[1].state == PortState.INIT
    assert set_state(sm, [1], 5, 0, phys=6)[0] == 0x1C


def test_port_model_transitions() -> None:
    p = Port(1)
    assert (p.state, p.phys) == (PortState.DOWN, PhysState.POLLING)
    assert p.physical_up() and (p.state, p.phys) == (PortState.INIT, PhysState.LINK_UP)
    assert not p.physical_up()
    p.state = PortState.ACTIVE
    assert p.retrained() and p.state == PortState.INIT
    assert p.physical_down() and p.state == PortState.DOWN and p.counters.link_downed_counter == 1
    assert not p.physical_down()


def test_switch_port0_accepts_any_state() -> None:
    fab = chain(1)
    sm = sm_of(fab)
    for state in (3, 4, 2, 4):
        assert set_state(sm, [1], 0, state)[0] == 0
