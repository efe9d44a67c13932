"""``Session``: finding a running fabric, its nodes, and commands in their namespaces (no root:
the runs are state files only; building one is tested in tests/integration/test_cli_fabric.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ibemu.errors import ConfigError
from ibemu.fabric.session import FabricRequest, Session, read_spec, write_spec
from ibemu.kernel import ownership
from ibemu.topo import generate


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setattr(ownership, "STATE_DIR", d)
    return d


def _run(status: str, nodes: tuple[str, ...] = ("h0", "edge0_0")) -> ownership.RunState:
    st = ownership.RunState(ownership.new_run_id(), scenario="unit")
    st.status = status
    st.namespaces = [ownership.ns_name(st.run_id, n) for n in nodes]
    st.save()
    return st


def test_attach_finds_the_one_running_fabric_and_says_why_not(state_dir: Path) -> None:
    with pytest.raises(ConfigError, match="no fabric is running"):
        Session.attach()
    _run("torn_down")
    with pytest.raises(ConfigError, match="no fabric is running"):
        Session.attach()
    a = _run("up")
    assert Session.attach().run_id == a.run_id
    b = _run("up")
    with pytest.raises(ConfigError, match="2 fabrics are running"):
        Session.attach()
    assert Session.attach(b.run_id).run_id == b.run_id
    with pytest.raises(ConfigError, match="no running fabric nosuch"):
        Session.attach("nosuch")
    assert {r["run"] for r in Session.status()} >= {a.run_id, b.run_id}


def test_namespace_and_commands_of_a_node(state_dir: Path) -> None:
    s = Session.attach(_run("up").run_id)
    assert s.namespace("h0") == ownership.ns_name(s.run_id, "h0")
    with pytest.raises(ConfigError, match="no node 'h9'"):
        s.namespace("h9")
    argv, env = s.command("h0", ["ip", "-br", "link"])
    assert argv == ["ip", "netns", "exec", s.namespace("h0"), "ip", "-br", "link"]
    assert env["IBEMU_RUN"] == s.run_id and env["IBEMU_NODE"] == "h0"


def test_the_request_round_trips_through_the_daemon_spec(tmp_path: Path, state_dir: Path) -> None:
    topo = generate("fat-tree", k=4)
    req = FabricRequest(topo, "unit", datapath="user", sm="ibemu", sm_host="h3", sm_engine="ftree")
    st = _run("up")
    write_spec(st.run_dir, st.run_id, req)
    spec = read_spec(st.run_dir)
    assert (spec["run_id"], spec["fabric"], spec["datapath"], spec["sm"], spec["sm_host"], spec["sm_engine"]) == (
        st.run_id, "ib", "user", "ibemu", "h3", "ftree")
    topo2 = Session(st).topology
    assert sorted(topo2.nodes) == sorted(topo.nodes) and len(topo2.links) == len(topo.links)


def test_adaptive_routing_round_trips_from_the_scenario_to_the_runtime(tmp_path: Path, state_dir: Path) -> None:
    from ibemu.agents.forwarder import AdaptiveRouting
    from ibemu.fabric.session import request_from_spec
    from ibemu.scenario import loads_scenario
    from ibemu.scenario.runner import fabric_request

    scen = loads_scenario("topology: {generator: fat-tree, k: 4}\nsm: {engine: ftree_ar}\nfabric:\n  datapath: user\n"
                          "  adaptive_routing: {mode: flowlet, flowlet_gap_us: 3.5}\n", "x.yaml")
    req = fabric_request(scen)
    assert req.adaptive_routing == {"mode": "flowlet", "flowlet_gap_ns": 3500}
    st = _run("up")
    write_spec(st.run_dir, st.run_id, req)
    back = request_from_spec(read_spec(st.run_dir))
    assert AdaptiveRouting.from_json(back.adaptive_routing) == AdaptiveRouting("flowlet", 3500)
    off = fabric_request(loads_scenario("topology: {generator: fat-tree, k: 4}\n", "y.yaml"))
    assert off.adaptive_routing == {}


def test_under_adaptive_routing_rc_flows_get_a_reorder_window() -> None:
    from ibemu.scenario import loads_scenario
    from ibemu.scenario.runner import RC_REORDER_WINDOW, flow_dict
    from ibemu.traffic.flows import _perf_opts

    text = ("topology: {generator: fat-tree, k: 4}\nsm: {engine: ftree_ar}\nfabric:\n  datapath: user\n{ar}"
            "traffic:\n  - {name: a, kind: write_bw, from: h0, to: h15}\n")
    on = loads_scenario(text.replace("{ar}", "  adaptive_routing: true\n"), "x.yaml")
    off = loads_scenario(text.replace("{ar}", ""), "y.yaml")
    spec_on, spec_off = flow_dict(on.traffic[0], on), flow_dict(off.traffic[0], off)
    assert spec_on["reorder_window"] == RC_REORDER_WINDOW and "reorder_window" not in spec_off
    assert _perf_opts(spec_on, "write_bw", 1.0).reorder_window == RC_REORDER_WINDOW
    assert _perf_opts(spec_off, "write_bw", 1.0).reorder_window == 0
