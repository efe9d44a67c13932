"""Resolve what a scenario names (hosts, switches, links) in the resolved topology.

Links can be named three ways: by one end (``"edge0_0:3"``), by both ends
(``"edge0_0:3-agg0_0:1"``, checked to be one cable) or by the two nodes when only one cable
joins them (``"edge0_0-agg0_0"``). Node names never contain ``-``, so the forms are unambiguous.
Every failure raises :class:`RefError` with a hint of what does exist.
"""

from __future__ import annotations

import re

from ibemu.errors import did_you_mean
from ibemu.topo.model import Endpoint, Link, Node, NodeKind, Topology
from ibemu.topo.names import NAME_PATTERN


class RefError(ValueError):
    """A name in a scenario does not match the topology."""


LINK_FORMS = "'edge0_0:3', 'edge0_0:3-agg0_0:1' or 'edge0_0-agg0_0'"
_NAME = NAME_PATTERN.removeprefix("^").removesuffix("$")
_EP = rf"({_NAME}):([0-9]+)"
_ONE = re.compile(rf"{_EP}\Z")
_TWO = re.compile(rf"{_EP}\s*-\s*{_EP}\Z")
_PAIR = re.compile(rf"({_NAME})\s*-\s*({_NAME})\Z")
LINK_PATTERN = rf"^\s*({_NAME}:[0-9]+(\s*-\s*{_NAME}:[0-9]+)?|{_NAME}\s*-\s*{_NAME})\s*$"
"""The three forms as one portable regex (the scenario JSON Schema says it too)."""


_A_KIND = {NodeKind.SWITCH: "a switch", NodeKind.CA: "a CA (host)", NodeKind.ROUTER: "a router"}


def _some(names: list[str]) -> str:
    """``h0, h1, h2, ..., h15`` for long lists."""
    return ", ".join(names) if len(names) <= 5 else f"{', '.join(names[:3])}, ..., {names[-1]}"


def node(topo: Topology, name: str) -> Node:
    n = topo.nodes.get(name)
    if n is None:
        raise RefError(f"no node {name!r}{did_you_mean(name, topo.nodes)}")
    return n


def _of_kind(topo: Topology, name: str, kind: NodeKind, what: str) -> str:
    n = topo.nodes.get(name)
    members = [m.name for m in topo.of_kind(kind)]
    if n is None:
        raise RefError(
            f"no {what} {name!r}{did_you_mean(name, members)}; {topo.name} has {len(members)}: {_some(members)}"
        )
    if n.kind is not kind:
        raise RefError(f"{name} is {_A_KIND[n.kind]}, expected {_A_KIND[kind]}")
    return name


def host(topo: Topology, name: str) -> str:
    return _of_kind(topo, name, NodeKind.CA, "host")


def switch(topo: Topology, name: str) -> str:
    return _of_kind(topo, name, NodeKind.SWITCH, "switch")


def _at(topo: Topology, text: str, name: str, port: int) -> Link:
    n = topo.nodes.get(name)
    if n is None:
        raise RefError(f"no link {text} — no node {name!r}{did_you_mean(name, topo.nodes)}")
    if port not in n.port_range:
        raise RefError(f"no link {text} — {name} has {n.ports_text()}")
    link = topo.link_at(name, port)
    if link is None:
        raise RefError(f"no link {text} — port {port} of {name} is not cabled")
    return link


def link(topo: Topology, text: object) -> Link:
    """The link ``text`` names (see the module docstring for the forms)."""
    if not isinstance(text, str):
        raise RefError(f"expected a link like {LINK_FORMS}, got {text!r}")
    s = text.strip()
    m = _ONE.match(s)
    if m:
        return _at(topo, s, m.group(1), int(m.group(2)))
    m = _TWO.match(s)
    if m:
        a = Endpoint(m.group(1), int(m.group(2)))
        b = Endpoint(m.group(3), int(m.group(4)))
        lk = _at(topo, s, a.node, a.port)
        far = lk.other(a)
        if far != b:
            _at(topo, s, b.node, b.port)  # a better message when b itself is wrong
            raise RefError(f"no link {s} — {a} goes to {far}")
        return lk
    m = _PAIR.match(s)
    if m:
        a_name, b_name = m.group(1), m.group(2)
        for nm in (a_name, b_name):
            if nm not in topo.nodes:
                raise RefError(f"no link {s} — no node {nm!r}{did_you_mean(nm, topo.nodes)}")
        found = topo.links_between(a_name, b_name)
        if not found:
            near = ", ".join(topo.neighbor_names(a_name)[:6])
            raise RefError(f"no link between {a_name} and {b_name} — {a_name} is linked to {near}")
        if len(found) > 1:
            ends = ", ".join(str(lk.a if lk.a.node == a_name else lk.b) for lk in found)
            raise RefError(
                f"{len(found)} links join {a_name} and {b_name} ({ends}); name one by port"
            )
        return found[0]
    raise RefError(f"expected a link like {LINK_FORMS}, got {text!r}")
