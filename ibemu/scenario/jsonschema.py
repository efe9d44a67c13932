"""The JSON Schema (draft 2020-12) of scenario files, generated from the one declaration.

Every key, type, bound and choice comes from :mod:`ibemu.scenario.schema` (its ``*_FIELDS``
tables) and the registries it names: routing engines (``ibemu.sm.routing.ENGINES``), traffic
kinds and the keys each takes (``ibemu.traffic.flows.TRAFFIC_KINDS``), fault actions and
theirs (``ibemu.fabric.faults.FAULT_ACTIONS``), topology generators and their parameters
(``ibemu.topo.generators.GENERATORS``), switch models, rates, MTUs and node names. Nothing
here lists a key: a key the loader accepts is in the schema, and the other way round
(``tests/unit/test_scenario_jsonschema.py`` checks it). ``ibemu schema`` prints it;
``docs/scenario.schema.json`` is its committed copy, for editors (yaml-language-server).

What the schema says and what ``ibemu validate`` checks differ on purpose. The schema is a
file-local, per-value check an editor can run as one types; the loader also checks what a
JSON Schema cannot express, or cannot express readably:

- cross-references: hosts, switches and links named by ``sm.host``, ``traffic``, ``faults``
  and ``record.capture`` must exist in the resolved topology (a generated one included); a
  topology file must exist and import; an explicit topology must be consistent (ports,
  duplicate cables);
- bounds taken from other keys: ``at_s``/``start_s``/``stop_s`` within ``duration_s``,
  ``stop_s`` after ``start_s``, ``pfc_xon_kb`` at most ``pfc_xoff_kb``, VLs below
  ``fabric.qos.vls``, a CA's ``ports`` at most 2, a switch model matching the fabric's kind;
- keys that apply to some fabrics only (RoCE's impairments, ECN and PFC; IB's ``qos``; the
  user datapath's ``fabric.switch``, per-link delay and loss, ``corrupt``), ECN's two keys
  together, generator-specific constraints (a fat-tree's even ``k``), sizes given as text
  within their bounds, link rates given in Gb/s that no IB link runs at, duplicate names;
- warnings (rates on the kernel datapath, starved VLs).

The schema is stricter in a few spellings the loader forgives: a generator's integer given as
quoted text (``k: "8"``), a null generator parameter, leading zeros in a rate's width.

So a file the schema rejects is invalid, and a file it accepts may still get located errors
from ``ibemu validate``. YAML mapping keys that are numbers (``dscp_priority``, ``sl2vl``) are
checked as their text, as an editor sees them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from ibemu.fabric.faults import FAULT_ACTIONS
from ibemu.scenario.schema import (
    AR_FIELDS,
    FAULT_COMMON,
    FAULT_FIELDS,
    FAULT_REQUIRED,
    LINK_FIELDS,
    MAX_DATA_VL,
    MAX_DSCP,
    MAX_PRIORITY,
    MAX_SL,
    MAX_VLARB_WEIGHT,
    NODE_FIELDS,
    PARTITION_FIELDS,
    PARTITION_MEMBER_FIELDS,
    TOP_FIELDS,
    TOPOLOGY_EXPLICIT_FIELDS,
    TOPOLOGY_FILE_FIELDS,
    TOPOLOGY_GENERATOR_FIELDS,
    TRAFFIC_COMMON,
    TRAFFIC_FIELDS,
    TRAFFIC_HOSTS,
    TRAFFIC_REQUIRED,
    VLARB_CAP,
    Field,
    required,
)
from ibemu.scenario.yamlnodes import SIZE_PATTERN
from ibemu.topo.generators import ALIASES, GENERATORS, Generator, Param
from ibemu.topo.names import MAX_NODE_NAME, NAME_PATTERN
from ibemu.topo.rates import IB_MTUS, LANE_GBPS, WIDTHS
from ibemu.topo.refs import LINK_FORMS, LINK_PATTERN
from ibemu.traffic.flows import TRAFFIC_KINDS

DRAFT = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_PATH = "docs/scenario.schema.json"
"""Where the repository keeps the generated schema (relative to its root)."""


# --- value types -------------------------------------------------------------------------------


def _ci(word: str) -> str:
    """A case-insensitive regex for ``word`` (ECMA 262 regexes have no inline flags)."""
    return "".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else re.escape(c) for c in word)


def _decimal(x: float) -> str:
    """A regex for the decimal spellings of ``x`` (``100``, ``100.0``; ``2.5``, ``2.50``)."""
    whole, _, frac = f"{x:g}".partition(".")
    return rf"{whole}\.{frac}0*" if frac else rf"{whole}(\.0+)?"


def _int_key(hi: int) -> dict[str, Any]:
    """A mapping key that is an integer 0..hi (written as text)."""
    return {"type": "string", "pattern": "^(" + "|".join(str(n) for n in range(hi + 1)) + ")$"}


def _rate() -> dict[str, Any]:
    """A link rate as ``parse_rate`` takes it: width x speed, a speed (4x), or Gb/s."""
    gbps = sorted({w * g for w in WIDTHS for s, g in LANE_GBPS.items() if s != "FDR10"})
    speeds = "|".join(_ci(s) for s in LANE_GBPS)
    widths = "|".join(map(str, WIDTHS))
    figures = "|".join(_decimal(g) for g in gbps)
    unit = "(" + "|".join(_ci(u) for u in ("Gb/s", "Gbps", "Gb", "G")) + ")"
    pattern = rf"^\s*(({widths})\s*[xX]\s*({speeds})|({speeds})|({figures})\s*{unit}?)\s*$"
    return {"description": "a link rate like '4x EDR', 'HDR' or '100G' (widths "
                           f"{', '.join(f'{w}x' for w in WIDTHS)}; speeds {', '.join(LANE_GBPS)})",
            "anyOf": [{"type": "string", "pattern": pattern}, {"enum": gbps}]}


def _defs() -> dict[str, Any]:
    host = {"type": "string", "pattern": NAME_PATTERN, "maxLength": MAX_NODE_NAME,
            "description": "a host (CA) name"}
    return {
        "rate": _rate(),
        "host": host,
        "hosts": {"anyOf": [{"const": "all"},
                            {"type": "array", "items": {"$ref": "#/$defs/host"}, "minItems": 1,
                             "uniqueItems": True}],
                  "description": "a list of hosts, or all"},
        "link": {"type": "string", "pattern": LINK_PATTERN, "description": f"a link: {LINK_FORMS}"},
        "endpoints": {"type": "array", "minItems": 2, "maxItems": 2,
                      "items": {"type": "string", "pattern": r"^\s*[^\s:][^:]*:\s*[0-9]+\s*$"},
                      "description": "two endpoints ['node:port', 'node:port']"},
    }


def _bounded(kind: str, f: Field) -> dict[str, Any]:
    out: dict[str, Any] = {"type": kind}
    if f.lo is not None:
        out["exclusiveMinimum" if f.lo_open else "minimum"] = _num(f.lo)
    if f.hi is not None:
        out["maximum"] = _num(f.hi)
    return out


def _num(x: float) -> int | float:
    return int(x) if float(x).is_integer() else x


def _vl(hi: int = MAX_DATA_VL) -> dict[str, Any]:
    return {"type": "integer", "minimum": 0, "maximum": hi}


def _value(f: Field) -> dict[str, Any]:
    """The JSON Schema of one declared value (``Field.type``)."""
    t = f.type
    out: dict[str, Any]
    if t in ("number", "integer"):
        out = _bounded(t, f)
    elif t == "choice":
        out = {"enum": list(f.choices)}
    elif t == "object":
        out = _object(f.fields or {})
    elif t == "string":
        out = {"type": "string", "minLength": 1}
    elif t == "bool":
        out = {"type": "boolean"}
    elif t == "mtu":
        out = {"enum": list(IB_MTUS)}
    elif t == "size":
        out = {"anyOf": [_bounded("integer", f), {"type": "string", "pattern": SIZE_PATTERN}]}
    elif t in ("rate", "host", "hosts", "link", "endpoints"):
        out = {"$ref": f"#/$defs/{t}"}
    elif t == "capture":
        out = {"anyOf": [{"const": "all"}, {"type": "array", "items": {"$ref": "#/$defs/link"}}]}
    elif t == "dilation":
        out = {"anyOf": [_bounded("number", f), {"const": "auto"}]}
    elif t == "adaptive_routing":
        out = {"anyOf": [{"type": "boolean"}, _object(AR_FIELDS)]}
    elif t == "pfc":
        out = {"anyOf": [{"type": "boolean"},
                         {"type": "array", "items": _vl(MAX_PRIORITY), "minItems": 1}]}
    elif t == "dscp_priority":
        out = {"type": "object", "propertyNames": _int_key(MAX_DSCP),
               "additionalProperties": _vl(MAX_PRIORITY)}
    elif t == "sl2vl":
        out = {"anyOf": [{"type": "array", "items": _vl(), "minItems": MAX_SL + 1, "maxItems": MAX_SL + 1},
                         {"type": "object", "propertyNames": _int_key(MAX_SL), "additionalProperties": _vl()}]}
    elif t == "vlarb":
        out = {"type": "array", "maxItems": VLARB_CAP,
               "items": {"type": "array", "prefixItems": [_vl(), _vl(MAX_VLARB_WEIGHT)],
                         "minItems": 2, "maxItems": 2, "items": False}}
    elif t == "nodes":
        node = _object(NODE_FIELDS)
        out = {"type": "object", "minProperties": 1,
               "propertyNames": {"pattern": NAME_PATTERN, "maxLength": MAX_NODE_NAME},
               "additionalProperties": {"anyOf": [_value(NODE_FIELDS["kind"]), node]}}
    elif t == "links":
        out = {"type": "array",
               "items": {"anyOf": [{"$ref": "#/$defs/endpoints"}, _object(LINK_FIELDS)]}}
    elif t == "topology":
        out = _topology()
    elif t == "traffic":
        out = {"type": "array", "items": _traffic_entry()}
    elif t == "faults":
        out = {"type": "array", "items": _fault_entry()}
    elif t == "partitions":
        out = {"type": "array", "items": _object(PARTITION_FIELDS)}
    elif t == "members":
        out = {"anyOf": [{"enum": ["ALL", "all"]},
                         {"type": "array", "minItems": 1,
                          "items": {"anyOf": [{"$ref": "#/$defs/host"}, _object(PARTITION_MEMBER_FIELDS)]}}]}
    else:
        raise ValueError(f"no JSON Schema for a value of type {t!r}")
    if f.help:
        out = {"description": f.help, **out}
    return out


def _object(fields: Mapping[str, Field], also: Iterable[str] = ()) -> dict[str, Any]:
    """A mapping of ``fields`` and no other key; its required ones, and ``also`` (a registry's)."""
    out: dict[str, Any] = {"type": "object", "properties": {k: _value(f) for k, f in fields.items()},
                           "additionalProperties": False}
    if req := list(dict.fromkeys((*required(fields), *also))):
        out["required"] = req
    return out


# --- the parts chosen by a registry ------------------------------------------------------------


def _param(gen: Generator, p: Param) -> dict[str, Any]:
    out: dict[str, Any]
    if p.type == "int":
        out = {"type": "integer"}
        if p.min is not None:
            out["minimum"] = p.min
        if p.max is not None:
            out["maximum"] = p.max
    elif p.type == "dims":
        out = {"anyOf": [{"type": "array", "items": {"type": "integer", "minimum": 1}, "minItems": 1},
                         {"type": "string", "pattern": r"^\s*[0-9]+(\s*[xX,]\s*[0-9]+)*\s*$"}]}
    else:
        out = {"$ref": "#/$defs/rate"}
    return {"description": p.help, **out}


def _topology() -> dict[str, Any]:
    """One of: a generator and its parameters, a file, or explicit nodes and links."""
    variants = []
    for name, gen in GENERATORS.items():
        names = [name, *(a for a, target in ALIASES.items() if target == name)]
        v = _object(TOPOLOGY_GENERATOR_FIELDS, also=(p.name for p in gen.params if p.required))
        for key in required(TOPOLOGY_GENERATOR_FIELDS):  # the key naming it: this one
            v["properties"][key] = {"enum": names, "description": gen.help}
        v["properties"].update({p.name: _param(gen, p) for p in gen.params})
        variants.append(v)
    variants.append(_object(TOPOLOGY_FILE_FIELDS))
    variants.append(_object(TOPOLOGY_EXPLICIT_FIELDS))
    return {"type": "object", "oneOf": variants}


def _entries(tag: str, fields: Mapping[str, Field],
             choices: Iterable[tuple[str, dict[str, Field], tuple[str, ...]]]) -> dict[str, Any]:
    """A list entry whose ``tag`` (kind, action) chooses the keys it takes: one if/then each."""
    branches = []
    for name, keys, also in choices:
        branches.append({"if": {"properties": {tag: {"const": name}}, "required": [tag]},
                         "then": _object(keys, also)})
    return {"type": "object", "required": list(required(fields)),
            "properties": {tag: _value(fields[tag])}, "allOf": branches}


def _traffic_entry() -> dict[str, Any]:
    def keys(kind: str) -> dict[str, Field]:
        hosts = TRAFFIC_HOSTS[TRAFFIC_KINDS[kind].hosts]
        return {k: hosts[k] if k in hosts else TRAFFIC_FIELDS[k] for k in (*TRAFFIC_COMMON, *TRAFFIC_KINDS[kind].keys)}

    (tag,) = TRAFFIC_REQUIRED
    return _entries(tag, TRAFFIC_FIELDS, ((k, keys(k), ()) for k in TRAFFIC_KINDS))


def _fault_entry() -> dict[str, Any]:
    choices = ((name, {k: FAULT_FIELDS[k] for k in (*FAULT_COMMON, *a.keys)}, a.required)
               for name, a in FAULT_ACTIONS.items())
    (tag,) = (k for k in FAULT_REQUIRED if FAULT_FIELDS[k].type == "choice")
    return _entries(tag, FAULT_FIELDS, choices)


# --- entry points ------------------------------------------------------------------------------


def scenario_schema() -> dict[str, Any]:
    """The JSON Schema of a scenario file."""
    root = _object(TOP_FIELDS)
    return {"$schema": DRAFT, "title": "ibemu scenario",
            "description": "A scenario file of ibemu (generated by `ibemu schema` from "
                           "ibemu/scenario/schema.py; `ibemu validate` checks more: see "
                           "ibemu/scenario/jsonschema.py)",
            **root, "$defs": _defs()}


def scenario_schema_text() -> str:
    """The schema as the committed file holds it (stable key order, a final newline)."""
    return json.dumps(scenario_schema(), indent=2) + "\n"
