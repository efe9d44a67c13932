"""The registry of traffic kinds: every entry complete, and the schema takes exactly its names."""

from __future__ import annotations

import pytest

from ibemu.scenario import ScenarioError, loads_scenario
from ibemu.scenario.runner import check_runnable
from ibemu.traffic.flows import TRAFFIC_KINDS

FT = "topology:\n  generator: fat-tree\n  k: 4\n"  # lines 1-3
HOSTS = {"pair": "    from: h0\n    to: h5\n", "fan_in": "    from: [h0, h1]\n    to: h5\n",
         "group": "    hosts: [h0, h1, h5]\n"}


@pytest.mark.parametrize("name", list(TRAFFIC_KINDS))
def test_each_kind_is_complete_and_loads_with_its_hosts(name: str) -> None:
    kind = TRAFFIC_KINDS[name]
    assert kind.hosts in HOSTS and callable(kind.run)
    assert len(set(kind.keys)) == len(kind.keys)
    # a training job's sizes come from its model (its gradients), not a size key
    assert ("size" in kind.keys) != (name == "training") and (kind.size is None or kind.size > 0)
    takes = {"pair": {"from", "to"}, "fan_in": {"from", "to"}, "group": {"hosts"}}[kind.hosts]
    assert takes <= set(kind.keys)
    gpus = "gpus: {}\n" if name == "training" else ""  # the GPU servers a job runs on
    scen = loads_scenario(FT + gpus + f"traffic:\n  - kind: {name}\n" + HOSTS[kind.hosts], "x.yaml")
    (t,) = scen.traffic
    assert t.kind == name and t.size == (kind.size or 65536)
    check_runnable(scen)


def test_the_schema_takes_exactly_the_registered_kinds() -> None:
    with pytest.raises(ScenarioError) as exc:
        loads_scenario(FT + "traffic:\n  - kind: iperf\n    from: h0\n", "x.yaml")
    assert str(exc.value).splitlines()[0] == (
        f"x.yaml:5 traffic[0].kind: expected one of {', '.join(TRAFFIC_KINDS)}, got 'iperf'")
    assert list(TRAFFIC_KINDS) == ["write_bw", "read_bw", "send_bw", "write_lat", "send_lat", "allreduce",
                                   "alltoall", "incast", "permutation", "stream", "training"]
