"""The sysfs tree's files and the metrics endpoint's pieces, without a live fabric.

Agents are the real sans-IO device agents of a planned fabric; the event logs are written by
``ibemu.events``' own writer; the exposition is prometheus_client's.
"""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from ibemu.agents.port import PhysState, PortState
from ibemu.cli.metrics_opt import metrics_listen
from ibemu.errors import ConfigError
from ibemu.events import Kind, append
from ibemu.fabric import sysfs
from ibemu.fabric.agents import make_agent
from ibemu.fabric.metrics import (
    FabricCollector,
    PortRow,
    RunEvents,
    Snapshot,
    check_free,
    parse_listen,
)
from ibemu.fabric.plan import plan_fabric
from ibemu.topo import parse_topo_spec

BASE = "class/infiniband/ibemu0"


@pytest.fixture(name="agents")
def agents_fixture() -> dict[str, object]:
    topo = parse_topo_spec("single-switch,hosts=2")
    plan = plan_fabric(topo, "t0sysf")
    return {name: make_agent(plan, topo.node(name)) for name in plan.nodes}


def test_rate_as_ib_core_prints_it() -> None:
    assert sysfs.rate_text(4, "EDR") == "100 Gb/sec (4X EDR)"
    assert sysfs.rate_text(1, "SDR") == "2.5 Gb/sec (1X)"
    assert sysfs.rate_text(4, "FDR") == "56 Gb/sec (4X FDR)"
    assert sysfs.rate_text(4, "HDR") == "200 Gb/sec (4X HDR)"
    assert sysfs.guid_text(0x0002C90300000001) == "0002:c903:0000:0001"


def test_a_ca_tree_has_the_kernels_files_and_formats(agents: dict[str, object]) -> None:
    h0: object = agents["h0"]
    p = h0.ports[1]  # type: ignore[attr-defined]
    p.physical_up()
    p.state, p.lid, p.master_sm_lid = PortState.ACTIVE, 0x11, 0x1
    p.counters.add(xmit_octets=4000, xmit_pkts=10, rcv_octets=4004, rcv_pkts=11, port_rcv_errors=70000)
    tree = sysfs.node_tree(h0)
    port = f"{BASE}/ports/1"
    assert tree[f"{BASE}/node_type"] == "1: CA\n"
    assert tree[f"{BASE}/node_guid"] == sysfs.guid_text(h0.node_guid) + "\n"  # type: ignore[attr-defined]
    assert tree[f"{port}/state"] == "4: ACTIVE\n"
    assert tree[f"{port}/phys_state"] == "5: LinkUp\n"
    assert tree[f"{port}/rate"] == "100 Gb/sec (4X EDR)\n"
    assert tree[f"{port}/lid"] == "0x11\n" and tree[f"{port}/sm_lid"] == "0x1\n"
    assert tree[f"{port}/link_layer"] == "InfiniBand\n"
    assert tree[f"{port}/counters/port_xmit_data"] == "1000\n"  # 4-octet words
    assert tree[f"{port}/counters/port_rcv_data"] == "1001\n"
    assert tree[f"{port}/counters/port_rcv_packets"] == "11\n"
    assert tree[f"{port}/counters/port_rcv_errors"] == "65535\n"  # the 16-bit field saturates
    for name in ("symbol_error", "link_downed", "port_xmit_discards", "VL15_dropped", "port_xmit_wait",
                 "unicast_xmit_packets", "multicast_rcv_packets"):
        assert f"{port}/counters/{name}" in tree
    assert f"{port}/hw_counters/lifespan" in tree
    for name in ("sys_image_guid", "node_desc", "fw_ver", "hca_type", "board_id"):
        assert tree[f"{BASE}/{name}"].endswith("\n")
    p.physical_down()
    assert sysfs.node_tree(h0)[f"{port}/state"] == "1: DOWN\n"
    assert sysfs.node_tree(h0)[f"{port}/phys_state"] == "2: Polling\n"


def test_a_switch_has_port_0_only_with_its_lid(agents: dict[str, object]) -> None:
    sw = agents["sw0"]
    sw.ports[0].lid = 7  # type: ignore[attr-defined]
    tree = sysfs.node_tree(sw)
    assert tree[f"{BASE}/node_type"] == "2: switch\n"
    assert {k.split("/")[4] for k in tree if "/ports/" in k} == {"0"}
    assert tree[f"{BASE}/ports/0/lid"] == "0x7\n"


def test_the_writer_renames_into_place_and_rewrites_only_what_changed(tmp_path: Path) -> None:
    w = sysfs.TreeWriter(tmp_path / "sysfs")
    assert w.write({"h0": {"a/b": "1\n", "c": "x\n"}}) == 2
    assert (tmp_path / "sysfs/h0/a/b").read_text() == "1\n"
    assert w.write({"h0": {"a/b": "1\n", "c": "y\n"}}) == 1
    assert (tmp_path / "sysfs/h0/c").read_text() == "y\n"
    assert not [p for p in (tmp_path / "sysfs").rglob("*.tmp")]
    w.remove()
    assert not (tmp_path / "sysfs").exists()


@pytest.mark.parametrize(("text", "want"), [
    ("9400", ("127.0.0.1", 9400)), ("127.0.0.1:9401", ("127.0.0.1", 9401)),
    ("localhost:9402", ("127.0.0.1", 9402)), ("[::1]:9403", ("::1", 9403)),
])
def test_good_metrics_values(text: str, want: tuple[str, int]) -> None:
    assert parse_listen(text) == want


@pytest.mark.parametrize(("text", "message"), [
    ("abc", "expected [ADDR:]PORT"), ("70000", "1 to 65535"), ("0.0.0.0:9400", "not a local address"),
    ("10.1.2.3:9400", "--metrics-public"), ("myhost:9400", "is not an IP address"), ("::1:9400", "brackets"),
])
def test_bad_metrics_values_are_refused_with_where(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=r"^--metrics: ") as err:
        parse_listen(text)
    assert message in str(err.value)


def test_a_public_address_needs_the_flag_and_a_port_in_use_is_said() -> None:
    assert parse_listen("0.0.0.0:9400", public=True) == ("0.0.0.0", 9400)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(ConfigError, match="cannot listen there"):
            check_free("127.0.0.1", s.getsockname()[1])


def test_the_cli_options_together() -> None:
    ns = argparse.Namespace
    assert metrics_listen(ns(metrics=None, metrics_public=False), "ib") is None
    with pytest.raises(ConfigError, match=r"^--metrics-public: .*needs --metrics"):
        metrics_listen(ns(metrics=None, metrics_public=True), "ib")
    with pytest.raises(ConfigError, match=r"^--metrics: .*RoCE"):
        metrics_listen(ns(metrics="9400", metrics_public=False), "roce")


def test_reroute_phases_from_the_last_fault_and_sm_counts(tmp_path: Path) -> None:
    (tmp_path / "ibemu").mkdir()
    fab, sm = tmp_path / "events.jsonl", tmp_path / "ibemu" / "events.jsonl"
    append(sm, {"kind": Kind.SWEEP_END, "t_ns": 10, "reason": "cold", "seconds": 0.5})
    append(sm, {"kind": Kind.SUBNET_UP, "t_ns": 11, "seconds": 0.5})
    append(fab, {"node": "fault-injector", "kind": Kind.FAULT, "t_ns": 1_000_000_000, "action": "link_down"})
    append(fab, {"node": "sw0", "kind": Kind.CARRIER, "t_ns": 1_000_200_000, "port": 1, "up": False})
    events = RunEvents(tmp_path)
    events.update()
    append(sm, {"kind": Kind.TRAP, "t_ns": 1_001_000_000})
    append(sm, {"kind": Kind.REROUTE, "t_ns": 1_004_000_000, "t_trap": 1_001_000_000,
                "t_routed": 1_002_000_000, "t_programmed": 1_004_000_000})
    append(sm, {"kind": Kind.SWEEP_END, "t_ns": 1_005_000_000, "reason": "trap", "seconds": 0.004})
    events.update()  # read on from where it stopped
    [(index, origin, phases)] = events.reroute_phases()
    assert (index, origin) == ("0", "fault")
    assert phases == pytest.approx({"detect": 0.0002, "trap": 0.001, "routed": 0.002, "programmed": 0.004})
    assert events.sweeps == {"cold": 1, "trap": 1} and events.traps == 1 and events.faults == {"link_down": 1}
    assert events.last_sweep_s == 0.004 and events.subnet_up_s == 0.5


def test_the_collector_exposes_treydock_names_labels_and_bytes(tmp_path: Path) -> None:
    counters = {"xmit_data": 4000, "rcv_data": 8, "xmit_pkts": 10, "rcv_pkts": 1, "unicast_xmit": 10,
                "unicast_rcv": 1, "multicast_xmit_pkts": 0, "multicast_rcv_pkts": 0}
    counters.update({attr: 0 for attr in sysfs.ERROR_FILES.values()})
    counters.update(symbol_error_counter=3, port_xmit_wait=5, qp1_dropped=0)
    rows = [PortRow("hca", "h0", 0xA, "h0 HCA-1", 1, 1, int(PortState.ACTIVE), int(PhysState.LINK_UP), counters,
                    remote_guid=0xB, remote_port=3, remote_desc="sw0", remote_type="SW", remote_lid=2),
            PortRow("switch", "sw0", 0xB, "sw0", 2, 3, int(PortState.ACTIVE), int(PhysState.LINK_UP), counters,
                    remote_guid=0xA, remote_port=1, remote_desc="h0 HCA-1", remote_type="CA", remote_lid=1)]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FabricCollector(lambda: Snapshot(rows, {0xA: 100.0, 0xB: 100.0}), tmp_path))
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(generate_latest(registry).decode()) for s in fam.samples}
    port_a = (("guid", "0x000000000000000a"), ("port", "1"))
    assert samples[("infiniband_hca_port_transmit_data_bytes_total", port_a)] == 4000
    assert samples[("infiniband_hca_port_symbol_error_total", port_a)] == 3
    assert samples[("infiniband_switch_port_transmit_wait_total", (("guid", "0x000000000000000b"), ("port", "3")))] == 5
    assert samples[("infiniband_hca_rate_bytes_per_second", (("guid", "0x000000000000000a"),))] == 12.5e9
    uplink = dict(next(k[1] for k in samples if k[0] == "infiniband_switch_uplink_info"))
    assert uplink == {"guid": "0x000000000000000b", "port": "3", "switch": "sw0", "uplink": "h0 HCA-1",
                      "uplink_guid": "0x000000000000000a", "uplink_type": "CA", "uplink_port": "1", "uplink_lid": "1"}
    assert samples[("ibemu_port_state", (("guid", "0x000000000000000a"), ("node", "h0"), ("port", "1")))] == 4


def test_a_refresh_pass_holds_the_agents_loop_about_a_slice_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """``sysfs.trees`` checkpoints once it has worked ``SLICE_S`` (1 ms): 40 nodes of 0.4 ms each
    leave no task step much over 1 ms (in checkpoints of 16 nodes, as before, a step was 6.4 ms
    and the pass, twice a second, put the agent host's p99 lag over 2 ms of real time)."""
    import time
    from types import SimpleNamespace

    import trio

    def slow_tree(agent: object) -> dict[str, str]:
        t = time.perf_counter() + 0.0004
        while time.perf_counter() < t:
            pass
        return {"x": "1"}

    monkeypatch.setattr(sysfs, "node_tree", slow_tree)
    host = SimpleNamespace(nodes={f"n{i}": SimpleNamespace(agent=SimpleNamespace(ports={}), powered=True)
                                  for i in range(40)})
    steps: list[float] = []

    class Steps(trio.abc.Instrument):
        def before_task_step(self, task: trio.lowlevel.Task) -> None:
            self.t0 = time.perf_counter()

        def after_task_step(self, task: trio.lowlevel.Task) -> None:
            steps.append(time.perf_counter() - self.t0)

    out, busy = trio.run(sysfs.trees, host, instruments=[Steps()])  # type: ignore[arg-type]
    assert sorted(out) == sorted(host.nodes) and busy >= 40 * 0.0004
    assert len(steps) >= 10 and max(steps) < sysfs.SLICE_S + 0.0004 + 0.002  # a slice, a node, scheduling
