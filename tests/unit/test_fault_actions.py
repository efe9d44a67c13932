"""The registry of fault actions: every entry complete, and the scenario loader, the runner's
check and the control channel take exactly its names, where each applies."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from ibemu.errors import ConfigError
from ibemu.fabric import control
from ibemu.fabric.faults import FAULT_ACTIONS, FaultSpec, actions_on
from ibemu.scenario import ScenarioError, loads_scenario
from ibemu.scenario.runner import check_runnable
from ibemu.topo import generate
from ibemu.topo.model import Link

FT = "topology:\n  generator: fat-tree\n  k: 4\n"  # lines 1-3
VALUES = {"link": "edge0_0:3", "switch": "agg0_0", "period_s": 1, "count": 2, "percent": 5, "duration_s": 1}
FABRIC_KINDS = ("ib", "roce")


def _entry(name: str, at_s: float) -> str:
    keys = "".join(f"    {k}: {VALUES[k]}\n" for k in FAULT_ACTIONS[name].required)
    return f"  - at_s: {at_s}\n    action: {name}\n" + keys


@pytest.mark.parametrize("name", list(FAULT_ACTIONS))
def test_each_action_is_complete_and_loads_with_its_required_keys(name: str) -> None:
    action = FAULT_ACTIONS[name]
    assert set(action.required) <= set(action.keys) <= set(VALUES)
    assert callable(action.run) and (action.on_demand is None or callable(action.on_demand))
    assert action.fabrics and set(action.fabrics) <= set(FABRIC_KINDS) and set(action.datapaths) <= {"kernel", "user"}
    assert action.refusal or set(action.fabrics) == set(FABRIC_KINDS)  # the control channel says why not
    entries = _entry(name, 2)
    if action.sets is not None:  # a target it takes down or up, and its counterpart
        key, up = action.sets
        # a target the entry names (link, switch), or one it implies (the master SM: sm_down/sm_up)
        assert key in action.required or (not action.keys and isinstance(getattr(FaultSpec, key), property))
        (other,) = [n for n, a in FAULT_ACTIONS.items() if a.sets == (key, not up)]
        entries = _entry(other, 1) + entries if up else entries + _entry(other, 3)
    datapath = "user" if "kernel" not in action.datapaths else "kernel"
    for kind in action.fabrics:
        scen = loads_scenario(FT + f"fabric: {{kind: {kind}, datapath: {datapath}}}\nfaults:\n" + entries, "x.yaml")
        assert name in [f.action for f in scen.faults]
        check_runnable(scen)


def test_the_loader_takes_exactly_the_registered_actions() -> None:
    with pytest.raises(ScenarioError) as exc:
        loads_scenario(FT + "faults:\n  - at_s: 1\n    action: unplug\n", "x.yaml")
    assert str(exc.value).splitlines()[0] == (
        f"x.yaml:6 faults[0].action: expected one of {', '.join(FAULT_ACTIONS)}, got 'unplug'")


def test_the_runner_refuses_actions_where_they_do_not_apply() -> None:
    scen = loads_scenario(FT + "fabric: {kind: roce}\n", "x.yaml")
    for name, action in FAULT_ACTIONS.items():
        fault = FaultSpec(at_s=1.0, action=name, where="x.yaml:9 faults[0]")
        bad = dataclasses.replace(scen, faults=(fault,))
        if "roce" in action.fabrics:
            continue
        with pytest.raises(ConfigError, match=f"fault '{name}' does not apply to a RoCE fabric "
                                              rf"\(it has: {', '.join(actions_on('roce'))}\)"):
            check_runnable(bad)


class _Refusing:
    """A RoCE fabric's injector for the channel: any call is a failure of the refusal."""

    fabric_kind = "roce"

    def __init__(self) -> None:
        self.topo = generate("fat-tree", {"k": 4})

    def link(self, link: Link, up: bool, *, end: int = 0) -> int:
        return 1

    def switch(self, name: str, up: bool) -> int:
        return 2

    def smp_loss(self, percent: float, switch: str | None = None) -> int:
        raise AssertionError("smp_loss reached a RoCE injector")

    def corrupt(self, link: Link, percent: float) -> int:
        raise AssertionError("corrupt reached a RoCE injector")


def test_the_control_channel_takes_the_on_demand_actions_where_they_apply() -> None:
    assert tuple(n for n, a in FAULT_ACTIONS.items() if a.on_demand) == control.FAULTS
    inj = _Refusing()
    for name, action in FAULT_ACTIONS.items():
        req: dict[str, Any] = {"fault": name, **{k: VALUES[k] for k in action.required}}
        if action.on_demand is None:
            with pytest.raises(control.ControlError, match="unknown fault"):
                control.handle(inj, req)
        elif "roce" not in action.fabrics:
            with pytest.raises(control.ControlError, match=f"^{name}: {action.refusal}$"):
                control.handle(inj, req)
        else:
            assert control.handle(inj, req)["ok"]
