"""The scenario JSON Schema: generated from the one declaration, committed unchanged, and in
agreement with the loader (``ibemu validate``) on the keys it knows, the shipped scenarios and
a table of bad ones. What only the loader can check (references into the topology, bounds
taken from other keys) is left out: see ``ibemu.scenario.jsonschema``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from ibemu.cli.main import main
from ibemu.fabric.faults import FAULT_ACTIONS
from ibemu.scenario import ScenarioError, builtin_names, builtin_text, load_scenario, loads_scenario
from ibemu.scenario.jsonschema import SCHEMA_PATH, scenario_schema, scenario_schema_text
from ibemu.scenario.schema import (
    DEFAULTS_KEYS,
    FABRIC_KEYS,
    FAULT_COMMON,
    LINK_KEYS,
    NODE_KEYS,
    QOS_KEYS,
    RECORD_KEYS,
    SM_KEYS,
    SWITCH_KEYS,
    TIME_KEYS,
    TOP_KEYS,
    TOPOLOGY_EXPLICIT_KEYS,
    TOPOLOGY_FILE_KEYS,
    TRAFFIC_COMMON,
)
from ibemu.topo.generators import GENERATORS
from ibemu.traffic.flows import TRAFFIC_KINDS

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))
SCHEMA = scenario_schema()
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
FT = "topology:\n  generator: fat-tree\n  k: 4\n"


def instance(text: str) -> Any:
    """The scenario as an editor's schema check sees it: JSON data (mapping keys are text)."""
    return json.loads(json.dumps(yaml.safe_load(text)))


def schema_errors(text: str) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in VALIDATOR.iter_errors(instance(text))]


def loader_errors(text: str) -> list[str]:
    try:
        loads_scenario(text, "x.yaml", ROOT / "scenarios")
    except ScenarioError as exc:
        return exc.problems
    return []


# --- generated, committed -----------------------------------------------------------------------


def test_committed_schema_is_the_generated_one() -> None:
    committed = (ROOT / SCHEMA_PATH).read_text()
    assert committed == scenario_schema_text(), (
        f"{SCHEMA_PATH} is stale: regenerate it with `ibemu schema --out {SCHEMA_PATH}` and commit it"
    )


def test_schema_is_valid_draft_2020_12() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_cli_prints_and_writes_the_schema(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["schema"]) == 0
    assert json.loads(capsys.readouterr().out) == SCHEMA
    out = tmp_path / "s.json"
    assert main(["schema", "--out", str(out)]) == 0
    assert out.read_text() == scenario_schema_text()


# --- the same keys -------------------------------------------------------------------------------


def _props(node: dict[str, Any], *path: str) -> set[str]:
    for key in path:
        node = node["properties"][key]
    return set(node["properties"])


def _branches(entry: dict[str, Any], tag: str) -> dict[str, set[str]]:
    return {b["if"]["properties"][tag]["const"]: set(b["then"]["properties"]) for b in entry["allOf"]}


def test_every_section_has_the_loaders_keys() -> None:
    assert _props(SCHEMA) == set(TOP_KEYS)
    for section, keys in (("defaults", DEFAULTS_KEYS), ("fabric", FABRIC_KEYS), ("sm", SM_KEYS),
                          ("record", RECORD_KEYS), ("time", TIME_KEYS)):
        assert _props(SCHEMA, section) == set(keys), section
        assert SCHEMA["properties"][section]["additionalProperties"] is False
    assert _props(SCHEMA, "fabric", "switch") == set(SWITCH_KEYS)
    assert _props(SCHEMA, "fabric", "qos") == set(QOS_KEYS)
    assert SCHEMA["additionalProperties"] is False


def test_every_traffic_kind_and_fault_action_has_its_keys() -> None:
    traffic = _branches(SCHEMA["properties"]["traffic"]["items"], "kind")
    assert traffic == {k: {*TRAFFIC_COMMON, *e.keys} for k, e in TRAFFIC_KINDS.items()}
    faults = _branches(SCHEMA["properties"]["faults"]["items"], "action")
    assert faults == {a: {*FAULT_COMMON, *e.keys} for a, e in FAULT_ACTIONS.items()}


def test_every_topology_form_has_its_keys() -> None:
    variants = SCHEMA["properties"]["topology"]["oneOf"]
    by_generator = {v["properties"]["generator"]["enum"][0]: set(v["properties"])
                    for v in variants if "generator" in v["properties"]}
    assert by_generator == {n: {"generator", "name", *(p.name for p in g.params)} for n, g in GENERATORS.items()}
    assert set(variants[-2]["properties"]) == set(TOPOLOGY_FILE_KEYS)
    explicit = variants[-1]
    assert set(explicit["properties"]) == set(TOPOLOGY_EXPLICIT_KEYS)
    node = explicit["properties"]["nodes"]["additionalProperties"]["anyOf"][1]
    assert set(node["properties"]) == set(NODE_KEYS)
    link = explicit["properties"]["links"]["items"]["anyOf"][1]
    assert set(link["properties"]) == set(LINK_KEYS)


def _probe(section: str, key: str) -> str:
    """A scenario that gives ``key`` of ``section`` a value of no type it takes (a nested list)."""
    bad = "[[[]]]"
    if section == "":
        return f"{FT}{key}: {bad}\n" if key != "topology" else f"topology: {bad}\n"
    if "." in section:
        outer, inner = section.split(".")
        return f"{FT}{outer}:\n  {inner}:\n    {key}: {bad}\n"
    return f"{FT}{section}:\n  {key}: {bad}\n"


SECTIONS = [("", TOP_KEYS), ("defaults", DEFAULTS_KEYS), ("fabric", FABRIC_KEYS), ("sm", SM_KEYS),
            ("record", RECORD_KEYS), ("time", TIME_KEYS), ("fabric.switch", SWITCH_KEYS), ("fabric.qos", QOS_KEYS)]


@pytest.mark.parametrize(("section", "keys"), SECTIONS, ids=lambda s: s if isinstance(s, str) else "")
def test_the_loader_knows_every_key_of_the_schema(section: str, keys: tuple[str, ...]) -> None:
    """Not only the key lists: the loader itself takes each key the schema names (it says
    what is wrong with the value, not that the key is unknown), and refuses one it does not."""
    node = SCHEMA
    for part in filter(None, section.split(".")):
        node = node["properties"][part]
    for key in node["properties"]:
        problems = loader_errors(_probe(section, key))
        assert not any("unknown key" in p for p in problems), (section, key, problems)
        assert schema_errors(_probe(section, key)), (section, key)
    problems = loader_errors(_probe(section, "bogus_key"))
    assert any("unknown key" in p for p in problems), problems
    assert schema_errors(_probe(section, "bogus_key"))
    assert loader_accepts(_probe(section, "bogus_key")) == set(node["properties"])


def loader_accepts(text: str) -> set[str]:
    """The keys the loader says it accepts where ``text`` has an unknown one ("expected one of")."""
    for problem in loader_errors(text):
        if "expected one of: " in problem:
            return set(problem.split("expected one of: ", 1)[1].split(", "))
    raise AssertionError(f"no unknown-key problem: {loader_errors(text)}")


def test_the_schema_knows_every_key_the_loader_takes() -> None:
    """The other way round, from what the loader itself says it takes, for the mappings whose
    keys a registry chooses (per kind, action and generator) and the topology's."""
    traffic = _branches(SCHEMA["properties"]["traffic"]["items"], "kind")
    for kind in TRAFFIC_KINDS:
        assert loader_accepts(f"{FT}traffic:\n  - {{kind: {kind}, bogus_key: 1}}\n") == traffic[kind], kind
    faults = _branches(SCHEMA["properties"]["faults"]["items"], "action")
    for action in FAULT_ACTIONS:
        assert loader_accepts(f"{FT}faults:\n  - {{at_s: 1, action: {action}, bogus_key: 1}}\n") == faults[action]
    variants = SCHEMA["properties"]["topology"]["oneOf"]
    for v in variants[:-2]:
        gen = v["properties"]["generator"]["enum"][0]
        assert loader_accepts(f"topology: {{generator: {gen}, bogus_key: 1}}\n") == set(v["properties"]), gen
    assert loader_accepts("topology: {file: small-cluster.ibnd, bogus_key: 1}\n") == set(variants[-2]["properties"])
    explicit = variants[-1]["properties"]
    assert loader_accepts("topology: {nodes: {a: ca}, bogus_key: 1}\n") == set(explicit)
    node = explicit["nodes"]["additionalProperties"]["anyOf"][1]["properties"]
    assert loader_accepts("topology: {nodes: {a: {kind: ca, bogus_key: 1}}}\n") == set(node)
    link = explicit["links"]["items"]["anyOf"][1]["properties"]
    text = "topology:\n  nodes: {s: switch, a: ca}\n  links:\n    - {endpoints: [a:1, s:1], bogus_key: 1}\n"
    assert loader_accepts(text) == set(link)


def test_the_loader_knows_every_traffic_and_fault_key_of_the_schema() -> None:
    for kind, keys in _branches(SCHEMA["properties"]["traffic"]["items"], "kind").items():
        for key in keys - {"kind"}:
            problems = loader_errors(f"{FT}traffic:\n  - kind: {kind}\n    {key}: [[[]]]\n")
            assert not any("not a key of" in p or "unknown key" in p for p in problems), (kind, key, problems)
    for action, keys in _branches(SCHEMA["properties"]["faults"]["items"], "action").items():
        for key in keys - {"action"}:
            problems = loader_errors(f"{FT}faults:\n  - action: {action}\n    {key}: [[[]]]\n")
            assert not any("not a key of" in p or "unknown key" in p for p in problems), (action, key, problems)


# --- both accept ---------------------------------------------------------------------------------


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_shipped_scenarios_pass_both(path: Path) -> None:
    load_scenario(path)
    assert schema_errors(path.read_text()) == []


@pytest.mark.parametrize("name", builtin_names())
def test_builtin_scenarios_pass_both(name: str) -> None:
    loads_scenario(builtin_text(name), f"<builtin>/{name}.yaml")
    assert schema_errors(builtin_text(name)) == []


GOOD = {
    "explicit-roce-user": """
topology:
  name: two
  nodes:
    sw0: {kind: switch}
    sw1: {kind: switch, ports: 8, desc: "spine one", guid: 0x1234}
    h0: ca
    h1: {kind: ca, ports: 2}
  links:
    - [h0:1, sw0:1]
    - endpoints: [h1:1, sw0:2]
      rate: 4x HDR
      mtu: 2048
      delay_us: 3
      loss_pct: 0.5
    - {endpoints: [sw0:5, sw1:1], cable_m: 20}
    - [h1:2, sw1:2]
defaults: {rate: 200G, mtu: 4096}
fabric: {kind: roce, datapath: user, line_gbps: 0.5, buffer_kb: 256, pfc: [3, 5], pfc_xoff_kb: 48,
         pfc_xon_kb: 16, dscp_priority: {26: 5, 48: 6}, ecn_mark_kb: 40,
         switch: {model: eth-spectrum, latency_ns: 300, buffer_kb: 512}}
sm: {impl: opensm, engine: updn, host: h1, sweep_interval_s: 0, lmc: 2}
traffic:
  - {kind: incast, to: h0, size: 1MiB, qps: 4, start_s: 1, stop_s: 9, sl: 3}
  - {kind: stream, from: h0, to: h1, rate_pps: 500, transport: ud}
  - {kind: alltoall, hosts: all}
faults:
  - {at_s: 2, action: port_flap, link: "sw0:5-sw1:1", period_s: 0.5, count: 3}
  - {at_s: 4, action: switch_down, switch: sw1}
  - {at_s: 6, action: switch_up, switch: sw1}
duration_s: 10
record: {capture: [sw0-sw1], json: out/x.json, plots: false}
time: {dilation: auto, lag_threshold_us: 200}
""",
    "ib-user-qos": FT + """
fabric:
  datapath: user
  switch: {model: ib-hdr}
  qos: {vls: 2, sl2vl: {1: 1}, vlarb_high: [[1, 64]], vlarb_low: [[0, 32], [1, 32]], vl_high_limit: 4}
defaults: {rate: "4x EDR", delay_us: 1}
traffic:
  - {kind: write_bw, from: h0, to: h15, sl: 1, size: 4096, bidirectional: true}
  - {kind: permutation, seed: 7}
faults:
  - {at_s: 1, action: corrupt, percent: 1, link: edge0_0:1}
time: {dilation: 4}
""",
    "generators": "topology: {generator: torus, dims: 3x3, hosts_per_switch: 1}\nsm: {engine: dor}\n",
    "alias": "topology: {generator: clos, leaves: 2, spines: 2, uplink_rate: 100}\n",
    "file": "topology: {file: small-cluster.ibnd, format: ibnetdiscover, name: small}\n",
}


@pytest.mark.parametrize("text", GOOD.values(), ids=GOOD.keys())
def test_good_scenarios_pass_both(text: str) -> None:
    assert loader_errors(text) == []
    assert schema_errors(text) == []


# --- both reject ---------------------------------------------------------------------------------

BAD = {
    # unknown keys
    "unknown-top-key": FT + "durration_s: 5\n",
    "unknown-sm-key": FT + "sm: {engin: minhop}\n",
    "unknown-qos-key": FT + "fabric: {datapath: user, qos: {vl: 2}}\n",
    "key-of-another-kind": FT + "traffic:\n  - {kind: allreduce, from: h0}\n",
    "key-of-another-action": FT + "faults:\n  - {at_s: 1, action: link_down, link: edge0_0:1, percent: 5}\n",
    "unknown-generator-param": "topology: {generator: fat-tree, k: 4, radix: 8}\n",
    "unknown-link-key": "topology:\n  nodes: {s: switch, a: ca}\n  links:\n    - {endpoints: [a:1, s:1], speed: EDR}\n",
    # wrong types
    "duration-text": FT + "duration_s: ten\n",
    "plots-text": FT + "record: {plots: maybe}\n",
    "fabric-kind-number": FT + "fabric: {kind: 3}\n",
    "traffic-not-a-list": FT + "traffic: {kind: write_bw}\n",
    "sm-not-a-mapping": FT + "sm: ftree\n",
    "qps-float": FT + "traffic:\n  - {kind: write_bw, from: h0, to: h1, qps: 1.5}\n",
    "vlarb-entry-triple": FT + "fabric: {datapath: user, qos: {vls: 2, vlarb_low: [[0, 1, 2]]}}\n",
    "endpoint-without-port": "topology:\n  nodes: {s: switch, a: ca}\n  links:\n    - [a, s:1]\n",
    # out of range
    "duration-zero": FT + "duration_s: 0\n",
    "lmc-8": FT + "sm: {lmc: 8}\n",
    "dilation-half": FT + "time: {dilation: 0.5}\n",
    "line-rate-too-fast": FT + "fabric: {kind: roce, datapath: user, line_gbps: 2000}\n",
    "qps-2000": FT + "traffic:\n  - {kind: write_bw, from: h0, to: h1, qps: 2000}\n",
    "sl-16": FT + "traffic:\n  - {kind: write_bw, from: h0, to: h1, sl: 16}\n",
    "percent-zero": FT + "faults:\n  - {at_s: 1, action: smp_loss, percent: 0}\n",
    "k-too-big": "topology: {generator: fat-tree, k: 66}\n",
    "pfc-priority-8": FT + "fabric: {kind: roce, datapath: user, pfc: [8]}\n",
    "dscp-64": FT + "fabric: {kind: roce, datapath: user, dscp_priority: {64: 1}}\n",
    "sl2vl-15-entries": FT + "fabric: {datapath: user, qos: {vls: 2, sl2vl: [0,1,0,1,0,1,0,1,0,1,0,1,0,1,0]}}\n",
    "vlarb-too-long": FT + "fabric: {datapath: user, qos: {vls: 1, vlarb_low: "
                           + repr([[0, 1]] * 9) + "}}\n",
    "node-name-dash": "topology:\n  nodes: {s-1: switch, a: ca}\n  links: [[a:1, s-1:1]]\n",
    # unknown enum values
    "engine": FT + "sm: {engine: fastest}\n",
    "sm-impl": FT + "sm: {impl: subnetd}\n",
    "traffic-kind": FT + "traffic:\n  - {kind: write_bandwidth, from: h0, to: h1}\n",
    "fault-action": FT + "faults:\n  - {at_s: 1, action: explode}\n",
    "generator": "topology: {generator: hypercube, dims: 4}\n",
    "datapath": FT + "fabric: {datapath: dpdk}\n",
    "mtu-1500": FT + "defaults: {mtu: 1500}\n",
    "rate-zdr": FT + "defaults: {rate: 4x ZDR}\n",
    "switch-model": FT + "fabric: {datapath: user, switch: {model: ib-xdr}}\n",
    "vls-3": FT + "fabric: {datapath: user, qos: {vls: 3}}\n",
    "transport": FT + "traffic:\n  - {kind: stream, from: h0, to: h1, transport: tcp}\n",
    "node-kind": "topology:\n  nodes: {s: hub, a: ca}\n  links: [[a:1, s:1]]\n",
    "topology-format": "topology: {file: small-cluster.ibnd, format: lldp}\n",
    "link-port-text": FT + "faults:\n  - {at_s: 1, action: link_down, link: \"edge0_0:x\"}\n",
    "capture-link-text": FT + "record: {capture: [edge0_0]}\n",
    "size-unit": FT + "traffic:\n  - {kind: write_bw, from: h0, to: h1, size: 64 parsecs}\n",
    # missing required keys
    "no-topology": "name: x\n",
    "fault-without-at": FT + "faults:\n  - {action: link_down, link: edge0_0:1}\n",
    "fault-without-link": FT + "faults:\n  - {at_s: 1, action: link_down}\n",
    "fault-without-action": FT + "faults:\n  - {at_s: 1, link: edge0_0:1}\n",
    "traffic-without-kind": FT + "traffic:\n  - {from: h0, to: h1}\n",
    "write-bw-without-to": FT + "traffic:\n  - {kind: write_bw, from: h0}\n",
    "incast-without-to": FT + "traffic:\n  - {kind: incast, from: [h0, h1]}\n",
    "fat-tree-without-k": "topology: {generator: fat-tree}\n",
    "torus-without-dims": "topology: {generator: torus}\n",
    "node-without-kind": "topology:\n  nodes: {s: {ports: 4}, a: ca}\n  links: [[a:1, s:1]]\n",
    "link-without-endpoints": "topology:\n  nodes: {s: switch, a: ca}\n  links:\n    - {rate: EDR}\n",
    "topology-empty": "topology: {}\n",
    "two-topology-sources": "topology: {generator: fat-tree, k: 4, file: small-cluster.ibnd}\n",
}


@pytest.mark.parametrize("text", BAD.values(), ids=BAD.keys())
def test_bad_scenarios_fail_both(text: str) -> None:
    assert loader_errors(text), "the loader accepts it"
    assert schema_errors(text), "the JSON Schema accepts it"


def test_what_only_the_loader_checks() -> None:
    """References into the topology and bounds from other keys: the schema cannot see them."""
    for text in (FT + "sm: {host: nobody}\n",
                 FT + "faults:\n  - {at_s: 40, action: link_down, link: edge0_0:1}\n",
                 FT + "traffic:\n  - {kind: write_bw, from: h0, to: h99}\n"):
        assert loader_errors(text)
        assert schema_errors(text) == []
