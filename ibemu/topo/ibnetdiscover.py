"""Read and write the ibnetdiscover topology format (what ``ibnetdiscover`` prints, ibsim reads).

Reading accepts real ``ibnetdiscover`` output (``vendid=``/``devid=``/``sysimgguid=``,
``switchguid=``/``caguid=``/``rtguid=`` lines, ``Switch``/``Ca``/``Rt`` records with
``[port](guid) "remote"[port](guid) # ...`` lines, ``[ext N]`` grouping, ``Chassis`` and
``Hostname:`` lines) and ibsim's extensions (``Hca``, GUID bases such as ``caguid=0x100``
or ``switchguid+5``, ``include "file"``, ``module="name"`` prefixes, ``@[port] "alias"``
port aliases, ``w=`` options, ``do``/``width=``/``speed=`` lines, which are accepted and
ignored). Nodes without explicit GUIDs get the GUIDs ibsim gives them.

Node names: ibemu names must fit an interface name (see :mod:`ibemu.topo.names`), so they
are derived: an ibsim-style id (``"Switch1"``) is used as is; for GUID ids (``"S-0002c9..."``)
the NodeDescription gives the name (``"ibemu edge0_0"`` -> ``edge0_0``, ``"node12 HCA-1"``
-> ``node12``, ``"MF0;leaf3:MSB7800/U1"`` -> ``leaf3``); what cannot be named so gets
``sw<i>``/``ca<i>``/``rt<i>``. The writer adds a ``# ibemu-name: NAME`` comment before a
record only where that rule would not give the node its name back, so
import -> export -> import preserves names, GUIDs and links.

Every error names ``file:line``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ibemu.errors import ConfigError
from ibemu.topo.model import Endpoint, NodeKind, Topology
from ibemu.topo.names import MAX_NODE_NAME, name_problem, sanitize
from ibemu.topo.rates import LANE_GBPS, WIDTHS, LinkRate

log = logging.getLogger(__name__)

#: ibsim's GUID counters when a file sets none (CAs from 0x100000, switches from 0x200000).
IBSIM_GUID_BASES = {NodeKind.CA: 0x100000, NodeKind.SWITCH: 0x200000, NodeKind.ROUTER: 0x300000}
MAX_INCLUDE_DEPTH = 8

_HEADER_RE = re.compile(r'(Switch|Ca|Hca|Rt)\s+(\d+)\s*"([^"]*)"(.*)\Z')
_PORT_RE = re.compile(
    r"\[(?P<port>\d+)\](?:\[ext\s+\d+\])?"
    r"(?:\s*\((?P<lguid>[0-9a-fA-Fx]+)\))?"
    r'\s*"(?P<rid>[^"]*)"'
    r"(?:\[(?P<rport>\d+)\])?(?:\[ext\s+\d+\])?"
    r"(?:\s*\((?P<rguid>[0-9a-fA-Fx]+)\))?"
    r"(?P<rest>.*)\Z"
)
_ALIAS_RE = re.compile(r'@\[(?P<port>\d+)\]\s*"(?P<alias>[^"]*)"(?P<rest>.*)\Z')
_RATE_RE = re.compile(r"\blid\s+\d+\s+(\d+)x([A-Za-z0-9]+)")
_GUIDLINE_RE = re.compile(r"(switchguid|caguid|hcaguids|rtguid)\s*([=+])\s*(0x[0-9a-fA-F]+|\d+)")
_ASSIGN_RE = re.compile(r"(vendid|devid|sysimgguid)\s*=\s*(0x[0-9a-fA-F]+|\d+)")
_GUID_ID_RE = re.compile(r"[SHR]-[0-9a-fA-F]{16}\Z")
_HINT_RE = re.compile(r"#\s*ibemu-name:\s*(\S+)")
_IGNORED = ("Chassis", "Hostname:", "width", "speed", "extspeed", "pdebug")
_KIND_OF = {"Switch": NodeKind.SWITCH, "Ca": NodeKind.CA, "Hca": NodeKind.CA, "Rt": NodeKind.ROUTER}
_GUIDKEY_KIND = {
    "switchguid": NodeKind.SWITCH,
    "caguid": NodeKind.CA,
    "hcaguids": NodeKind.CA,
    "rtguid": NodeKind.ROUTER,
}


class IbndError(ConfigError):
    """An ibnetdiscover file could not be imported; ``problems`` lists every ``file:line: what``."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        shown = problems[:25]
        more = f"\n... and {len(problems) - 25} more" if len(problems) > 25 else ""
        super().__init__("\n".join(shown) + more)


@dataclass(slots=True)
class _Half:
    """One port line: ``node[port] -> remote[rport]`` as written."""

    port: int
    remote: str  # node id, or "" for an alias definition
    rport: int
    where: str
    rate: LinkRate | None
    seq: int = 0  # order of appearance across all files
    alias_ref: str | None = None


@dataclass(slots=True)
class _Record:
    kind: NodeKind
    nodeid: str
    nports: int
    desc: str
    guid: int
    where: str
    vendor_id: int = 0
    device_id: int = 0
    sys_guid: int = 0
    enhanced: bool = True
    hint: str | None = None
    port_guids: dict[int, int] = field(default_factory=dict)
    halves: list[_Half] = field(default_factory=list)
    listed: set[int] = field(default_factory=set)


def _int(text: str) -> int:
    return int(text, 0) if text.lower().startswith("0x") else int(text)


def _hex(text: str) -> int:
    return int(text, 16)


def _parse_rate(rest: str) -> LinkRate | None:
    found = _RATE_RE.findall(rest)
    if not found:
        m = re.search(r"\bw=(\d+)", rest)  # ibsim's documented 'w=(1|4|12)'
        if m and int(m.group(1)) in WIDTHS:
            return LinkRate(int(m.group(1)), "SDR")
        return None
    width, speed = int(found[-1][0]), found[-1][1].upper()
    if width in WIDTHS and speed in LANE_GBPS:
        return LinkRate(width, speed)
    return None


def _parse_desc(rest: str) -> tuple[str | None, str]:
    """NodeDescription from the ``# "desc" ...`` tail of a header line, and what follows."""
    hash_at = rest.find("#")
    if hash_at < 0:
        return None, rest
    s = rest[hash_at + 1 :].lstrip()
    if s.startswith('"'):
        end = s.find('"', 1)
        if end < 0:
            return s[1:], ""
        return s[1:end], s[end + 1 :]
    for stop in (" enhanced port ", " base port ", " lid ", " lmc "):
        at = s.find(stop)
        if at >= 0:
            return s[:at], s[at:]
    return s.strip(), ""


class _Parser:
    def __init__(self) -> None:
        self.records: list[_Record] = []
        self.by_id: dict[str, _Record] = {}
        self.aliases: dict[str, tuple[_Record, int, str]] = {}
        self.problems: list[str] = []
        self.abs = dict(IBSIM_GUID_BASES)
        self.next = dict(IBSIM_GUID_BASES)
        self.vendid = self.devid = self.sysimgguid = 0
        self.prefix = ""
        self.hint: str | None = None
        self.seq = 0

    def error(self, where: str, message: str) -> None:
        self.problems.append(f"{where}: {message}")

    # ibsim's name rules: a module prefix "m" makes ids "m#id" and aliases "m@alias".
    def node_id(self, base: str) -> str:
        if self.prefix and "#" not in base:
            return f"{self.prefix}#{base}"
        return base

    def alias_id(self, base: str) -> str:
        if "@" in base:
            return (self.prefix if base.startswith("@") else "") + base
        return f"{self.prefix}@{base}"

    def parse_text(self, text: str, source: str, base_dir: Path | None, depth: int = 0) -> None:
        lines = text.splitlines()
        rec: _Record | None = None
        for lineno, raw in enumerate(lines, 1):
            where = f"{source}:{lineno}"
            line = raw.rstrip()
            if rec is not None:
                if line.startswith(("[", "@[")):
                    self.port_line(rec, line, where)
                    continue
                if line.startswith("#"):
                    continue
                rec = None  # a blank or any other line ends the record
            stripped = line.strip()
            if not stripped:
                continue
            if stripped.startswith("#"):
                m = _HINT_RE.match(stripped)
                if m:
                    self.hint = m.group(1)
                continue
            m = _HEADER_RE.match(line)
            if m:
                rec = self.header(m, where)
                continue
            if self.directive(stripped, where, base_dir, depth):
                continue
            if stripped.startswith(("[", "@[")):
                self.error(
                    where, "port line outside a node record (a Switch/Ca/Rt line must come first)"
                )
                continue
            self.error(
                where,
                f"unrecognised line {stripped[:60]!r} (expected a Switch, Ca, Hca or Rt record)",
            )

    def directive(self, line: str, where: str, base_dir: Path | None, depth: int) -> bool:
        m = _GUIDLINE_RE.match(line)
        if m:
            kind, value = _GUIDKEY_KIND[m.group(1)], _int(m.group(3))
            if m.group(2) == "=":
                self.abs[kind] = value
                self.next[kind] = value
            else:
                self.next[kind] = self.abs[kind] + value
            return True
        m = _ASSIGN_RE.match(line)
        if m:
            setattr(self, m.group(1), _int(m.group(2)))
            return True
        if line.startswith("module"):
            m = re.match(r'module\s*=\s*"([^"#@]{0,20})"', line)
            if not m:
                self.error(where, 'expected module="prefix" (at most 20 characters, no # or @)')
            else:
                self.prefix = m.group(1)
            return True
        if line.startswith("include"):
            m = re.match(r'include\s+"([^"]+)"', line)
            if not m:
                self.error(where, 'expected include "file"')
            else:
                self.include(m.group(1), where, base_dir, depth)
            return True
        if line.startswith("do ") or line == "do":
            log.warning("%s: ignoring ibsim console command %r", where, line)
            return True
        return line.startswith(_IGNORED) and not line.startswith(("Switch", "Ca", "Hca", "Rt"))

    def include(self, name: str, where: str, base_dir: Path | None, depth: int) -> None:
        path = Path(name)
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        if depth >= MAX_INCLUDE_DEPTH:
            self.error(where, f"include nested deeper than {MAX_INCLUDE_DEPTH} levels")
            return
        try:
            text = path.read_text()
        except OSError as exc:
            self.error(where, f"cannot include {name!r}: {exc.strerror or exc}")
            return
        self.parse_text(text, str(path), path.parent, depth + 1)

    def header(self, m: re.Match[str], where: str) -> _Record | None:
        kind = _KIND_OF[m.group(1)]
        nports = int(m.group(2))
        nodeid = self.node_id(m.group(3))
        desc, tail = _parse_desc(m.group(4))
        lo, hi = (1, 255) if kind is not NodeKind.CA else (1, 2)
        hint, self.hint = self.hint, None
        vendid, devid, sysimg = self.vendid, self.devid, self.sysimgguid
        self.vendid = self.sysimgguid = 0  # ibsim resets these after each node (not devid)
        if not lo <= nports <= hi:
            self.error(where, f'{m.group(1)} "{nodeid}" has {nports} ports, expected {lo}..{hi}')
            return None
        if not nodeid or "#" in m.group(3) or "@" in m.group(3):
            self.error(
                where, f"bad node id {m.group(3)!r}: it must be non-empty, without '#' or '@'"
            )
            return None
        if nodeid in self.by_id:
            self.error(where, f'duplicate node id "{nodeid}" (first at {self.by_id[nodeid].where})')
            return None
        guid = self.next[kind]
        self.next[kind] = guid + (1 if kind is NodeKind.SWITCH else nports + 1)
        rec = _Record(
            kind=kind,
            nodeid=nodeid,
            nports=nports,
            desc=nodeid if desc is None or desc == "" else desc,
            guid=guid,
            where=where,
            vendor_id=vendid,
            device_id=devid,
            sys_guid=sysimg if sysimg != guid else 0,
            enhanced="base port 0" not in tail,
            hint=hint,
        )
        self.records.append(rec)
        self.by_id[nodeid] = rec
        return rec

    def port_line(self, rec: _Record, line: str, where: str) -> None:
        if line.startswith("@"):
            m = _ALIAS_RE.match(line)
            if not m:
                self.error(where, 'expected an alias line @[port] "alias"')
                return
            port = int(m.group("port"))
            if not self.port_ok(rec, port, where):
                return
            alias = self.alias_id(m.group("alias"))
            if alias in self.aliases:
                self.error(where, f"alias {alias!r} already defined at {self.aliases[alias][2]}")
                return
            self.aliases[alias] = (rec, port, where)
            return
        m = _PORT_RE.match(line)
        if not m:
            self.error(where, 'expected a port line like [1] "remote-id"[2]')
            return
        port = int(m.group("port"))
        if not self.port_ok(rec, port, where):
            return
        if port in rec.listed:
            self.error(where, f'port {port} of "{rec.nodeid}" is listed twice')
            return
        rid = m.group("rid")
        rest = m.group("rest")
        half = _Half(port, "", int(m.group("rport") or 1), where, _parse_rate(rest), self.seq)
        self.seq += 1
        if "@" in rid:
            half.alias_ref = self.alias_id(rid)
        else:
            half.remote = self.node_id(rid)
        if m.group("rport") is not None and half.rport == 0:
            self.error(where, "remote port 0 cannot be cabled")
            return
        if rec.kind is not NodeKind.SWITCH and m.group("lguid"):
            try:
                pg = _hex(m.group("lguid").removeprefix("0x"))
            except ValueError:  # the pattern admits an 'x' anywhere
                self.error(where, f"bad port GUID ({m.group('lguid')})")
                return
            if pg != rec.guid + port:
                rec.port_guids[port] = pg
        rec.halves.append(half)
        rec.listed.add(port)

    def port_ok(self, rec: _Record, port: int, where: str) -> bool:
        if port == 0:
            self.error(
                where, f'port 0 of "{rec.nodeid}" is its management port and cannot be cabled'
            )
            return False
        if port > rec.nports:
            self.error(where, f'port {port} is beyond "{rec.nodeid}"\'s {rec.nports} ports')
            return False
        return True

    def pair(self) -> list[tuple[_Record, _Half, _Record, int]]:
        """Match every port line with its far end; report dangling and contradicting ones."""
        links: list[tuple[_Record, _Half, _Record, int]] = []
        index = {(r.nodeid, h.port): h for r in self.records for h in r.halves}
        for rec in self.records:
            for h in rec.halves:
                if h.alias_ref is not None:
                    target = self.aliases.get(h.alias_ref)
                    if target is None:
                        self.error(h.where, f"dangling port: no alias {h.alias_ref!r}")
                        continue
                    links.append((rec, h, target[0], target[1]))
                    continue
                far = self.by_id.get(h.remote)
                if far is None:
                    self.error(
                        h.where,
                        f'dangling port: "{rec.nodeid}"[{h.port}] refers to no node "{h.remote}"',
                    )
                    continue
                if h.rport > far.nports:
                    self.error(
                        h.where,
                        f'remote port {h.rport} is beyond "{far.nodeid}"\'s {far.nports} ports',
                    )
                    continue
                back = index.get((far.nodeid, h.rport))
                if back is None or back.alias_ref is not None:
                    self.error(
                        h.where,
                        f'dangling port: "{rec.nodeid}"[{h.port}] -> "{far.nodeid}"[{h.rport}], '
                        f'but "{far.nodeid}" lists no port {h.rport} (at {far.where})',
                    )
                    continue
                if back.remote != rec.nodeid or back.rport != h.port:
                    self.error(
                        h.where,
                        f'"{rec.nodeid}"[{h.port}] -> "{far.nodeid}"[{h.rport}], but {back.where} says '
                        f'"{far.nodeid}"[{h.rport}] -> "{back.remote}"[{back.rport}]',
                    )
                    continue
                if h.seq <= back.seq:  # each cable once, located at its first line
                    links.append((rec, h, far, h.rport))
                    if back.rate and h.rate and back.rate != h.rate:
                        log.warning(
                            "%s: the two ends of a link report %s and %s",
                            h.where,
                            h.rate,
                            back.rate,
                        )
        return links


# --- names ------------------------------------------------------------------------------------


def _shorten(cand: str, limit: int = MAX_NODE_NAME) -> str:
    """Fit a name candidate in ``limit`` characters, keeping its trailing number."""
    if len(cand) <= limit:
        return cand
    squeezed = cand.replace("_", "")
    if len(squeezed) <= limit:
        return squeezed
    m = re.search(r"\d+\Z", squeezed)
    digits = m.group(0) if m else ""
    if len(digits) >= limit - 1:
        return squeezed[:limit]
    return squeezed[: limit - len(digits)] + digits


def _with_number(base: str, num: str) -> str:
    return f"{_shorten(base, MAX_NODE_NAME - 1 - len(num))}_{num}"


def _candidate(kind: NodeKind, nodeid: str, desc: str) -> tuple[str, str | None]:
    """Name candidate for a record and a disambiguating number (``HCA-2`` -> ``"2"``)."""
    if not _GUID_ID_RE.match(nodeid):
        return _shorten(sanitize(nodeid)), None
    d = desc.strip()
    if d.startswith("ibemu "):
        return _shorten(sanitize(d[6:].split()[0] if d[6:].split() else "")), None
    m = re.match(r"MF0;([^:]+):", d)
    if m:
        return _shorten(sanitize(m.group(1))), None
    words = d.split()
    if not words:
        return "", None
    num = None
    if len(words) > 1:
        mm = re.search(r"(\d+)\Z", words[1])
        num = mm.group(1) if mm else None
    return _shorten(sanitize(words[0])), num


_FALLBACK = {NodeKind.SWITCH: "sw", NodeKind.CA: "ca", NodeKind.ROUTER: "rt"}


def derive_names(records: Iterable[tuple[NodeKind, str, str, str | None]]) -> list[str]:
    """ibemu names for ``(kind, node id, NodeDescription, hint)`` records, in order.

    Deterministic, unique and valid; see the module docstring for the rules.
    """
    recs = list(records)
    names: list[str | None] = [None] * len(recs)
    taken: set[str] = set()
    for i, (_, _, _, hint) in enumerate(recs):
        if hint and name_problem(hint) is None and hint not in taken:
            names[i] = hint
            taken.add(hint)
    cands: list[tuple[str, str | None]] = []
    counts: dict[str, int] = {}
    for i, (kind, nodeid, desc, _) in enumerate(recs):
        cand = ("", None) if names[i] else _candidate(kind, nodeid, desc)
        cands.append(cand)
        if cand[0]:
            counts[cand[0]] = counts.get(cand[0], 0) + 1
    groups: dict[str, list[int]] = {}
    for i, (base, _) in enumerate(cands):
        if base and counts[base] > 1:
            groups.setdefault(base, []).append(i)
    for base, members in groups.items():  # e.g. "node1 HCA-1" and "node1 HCA-2"
        nums = [cands[i][1] for i in members]
        if all(nums) and len(set(nums)) == len(nums):
            for i in members:
                cands[i] = (_with_number(base, str(cands[i][1])), None)
        else:
            for i in members:
                cands[i] = ("", None)
    index = dict.fromkeys(NodeKind, 0)
    fallback: list[str] = []
    for kind, _, _, _ in recs:
        fallback.append(f"{_FALLBACK[kind]}{index[kind]}")
        index[kind] += 1
    for i, (base, _) in enumerate(cands):
        if names[i] is None and base and name_problem(base) is None and base not in taken:
            names[i] = base
            taken.add(base)
    for i in range(len(recs)):
        if names[i] is None:
            name = fallback[i]
            n = 0
            while name in taken:
                n += 1
                name = f"{fallback[i]}_{n}"
            names[i] = name
            taken.add(name)
    return [n for n in names if n is not None]


# --- reading ----------------------------------------------------------------------------------


def loads(
    text: str, source: str = "<string>", base_dir: Path | None = None, name: str | None = None
) -> Topology:
    """Parse ibnetdiscover text into a Topology; IbndError lists every located problem."""
    p = _Parser()
    p.parse_text(text, source, base_dir)
    halves = p.pair()
    if not p.records and not p.problems:
        p.error(f"{source}:1", "no Switch, Ca or Rt record found")
    if p.problems:
        raise IbndError(p.problems)
    names = derive_names((r.kind, r.nodeid, r.desc, r.hint) for r in p.records)
    topo = Topology(name or Path(source).stem)
    id2name: dict[str, str] = {}
    for rec, nm in zip(p.records, names, strict=True):
        id2name[rec.nodeid] = nm
        topo.add_node(
            nm,
            rec.kind,
            rec.nports,
            guid=rec.guid,
            desc=rec.desc,
            vendor_id=rec.vendor_id,
            device_id=rec.device_id,
            sys_guid=rec.sys_guid,
            port_guids=rec.port_guids or None,
            enhanced_port0=rec.enhanced,
            origin=rec.where,
        )
    for rec, half, far, fport in halves:
        topo.add_link(
            Endpoint(id2name[rec.nodeid], half.port),
            Endpoint(id2name[far.nodeid], fport),
            rate=half.rate,
            origin=half.where,
        )
    errors = [str(pr) for pr in topo.validate() if pr.severity == "error"]
    if errors:
        raise IbndError(errors)
    log.info("imported %s: %r", source, topo)
    return topo


def load(path: str | Path, name: str | None = None) -> Topology:
    """Read an ibnetdiscover file (ConfigError when it is missing or wrong)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read topology file: {exc.strerror or exc}", str(path)) from None
    return loads(text, str(path), path.parent, name=name)


# --- writing ----------------------------------------------------------------------------------


def _node_id(kind: NodeKind, guid: int) -> str:
    return (
        f"{'S' if kind is NodeKind.SWITCH else 'R' if kind is NodeKind.ROUTER else 'H'}-{guid:016x}"
    )


def dumps(topo: Topology, header: bool = True) -> str:
    """The topology as ibnetdiscover text that ``ibsim`` loads and ibemu reads back.

    Switches first, then CAs, then routers (as ibnetdiscover prints them); both ends of
    every link are listed; LIDs are 0 (the subnet manager assigns them).
    """
    nodes = sorted(
        topo.nodes.values(),
        key=lambda n: (n.kind is not NodeKind.SWITCH, n.kind is NodeKind.ROUTER),
    )
    ids = {n.name: _node_id(n.kind, n.guid) for n in nodes}
    hints: set[str] = set()
    for _ in range(len(nodes) + 1):  # converge: hint exactly the nodes the rule would misname
        derived = derive_names(
            (n.kind, ids[n.name], n.desc, n.name if n.name in hints else None) for n in nodes
        )
        wrong = {n.name for n, d in zip(nodes, derived, strict=True) if d != n.name} - hints
        if not wrong:
            break
        hints |= wrong
    out: list[str] = []
    if header:
        out += ["#", f"# Topology file: generated by ibemu from {topo.name}", "#"]
    for n in nodes:
        out.append("")
        out.append(f"vendid=0x{n.vendor_id:x}")
        out.append(f"devid=0x{n.device_id:x}")
        out.append(f"sysimgguid=0x{n.system_guid:x}")
        if n.name in hints:
            out.append(f"# ibemu-name: {n.name}")
        desc = n.desc.replace('"', "'")
        if n.kind is NodeKind.SWITCH:
            out.append(f"switchguid=0x{n.guid:x}({n.guid:x})")
            port0 = "enhanced" if n.enhanced_port0 else "base"
            out.append(
                f'Switch\t{n.num_ports} "{ids[n.name]}"\t\t# "{desc}" {port0} port 0 lid 0 lmc 0'
            )
        else:
            out.append(f"{'ca' if n.kind is NodeKind.CA else 'rt'}guid=0x{n.guid:x}")
            out.append(
                f'{"Ca" if n.kind is NodeKind.CA else "Rt"}\t{n.num_ports} "{ids[n.name]}"\t\t# "{desc}"'
            )
        for port, far in topo.neighbors(n.name):
            link = topo.link_at(n.name, port)
            assert link is not None
            fn = topo.nodes[far.node]
            rate = topo.rate_of(link)
            fdesc = fn.desc.replace('"', "'")
            fguid = "" if fn.is_switch else f"({fn.port_guid(far.port):x}) "
            if n.is_switch:
                out.append(
                    f'[{port}]\t"{ids[fn.name]}"[{far.port}]{fguid}\t\t# "{fdesc}" lid 0 {rate}'
                )
            else:
                out.append(
                    f'[{port}]({n.port_guid(port):x}) \t"{ids[fn.name]}"[{far.port}]'
                    + (f" {fguid}" if fguid else "")
                    + f'\t\t# lid 0 lmc 0 "{fdesc}" lid 0 {rate}'
                )
    return "\n".join(out) + "\n"


def dump(topo: Topology, path: str | Path) -> None:
    Path(path).write_text(dumps(topo))


__all__ = ["IBSIM_GUID_BASES", "IbndError", "derive_names", "dump", "dumps", "load", "loads"]
