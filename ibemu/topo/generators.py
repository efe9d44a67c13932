"""Topology generators: the fabrics a designer asks for by shape and size.

Each generator is registered in :data:`GENERATORS` with typed parameters, so the CLI
(``ibemu topo generate fat-tree --k 8``) and scenario files (``topology: {generator:
fat-tree, k: 8}``) share one definition, one validation and one error wording.

Port numbering is part of the contract (fault and capture references use it):

- fat-tree (3 levels): edge ports ``1..k/2`` go down to hosts, ``k/2+1..k`` up to the pod's
  aggregation switches (``edge p_i`` port ``k/2+1+j`` -> ``agg p_j`` port ``i+1``); agg port
  ``k/2+1+c`` goes to core ``j*k/2+c``, whose port ``p+1`` goes to pod ``p``.
- leaf-spine: leaf ports ``1..hosts`` go to hosts, then one port per uplink.
- torus/mesh: ports ``1..hosts`` to hosts, then per dimension ``d`` a ``+`` port
  (``hosts+2d+1``) and a ``-`` port (``hosts+2d+2``).
- ring: ports ``1..hosts``, then ``hosts+1`` to the next switch, ``hosts+2`` to the previous.
- dragonfly: ports ``1..hosts``, then one local port per other switch of the group, then the
  global ports.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ibemu.errors import ConfigError
from ibemu.topo.model import LinkDefaults, NodeKind, Topology
from ibemu.topo.names import MAX_PORT
from ibemu.topo.rates import LinkRate, parse_rate

log = logging.getLogger(__name__)


class ParamError(ConfigError):
    """A generator parameter is invalid; ``param`` names it so callers can locate it.

    ``str()`` is ``"<generator>: <detail>"``; ``detail`` alone reads well after a location.
    """

    def __init__(self, generator: str, param: str, detail: str) -> None:
        self.generator = generator
        self.param = param
        self.detail = detail
        super().__init__(f"{generator}: {detail}")


# --- parameters -----------------------------------------------------------------------------


def _as_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    raise ValueError


def _as_dims(value: Any) -> tuple[int, ...]:
    if isinstance(value, str):
        parts = value.replace("x", ",").replace("X", ",").split(",")
        return tuple(_as_int(p.strip()) for p in parts)
    if isinstance(value, list | tuple):
        return tuple(_as_int(v) for v in value)
    raise ValueError


@dataclass(frozen=True)
class Param:
    """One generator parameter: its type, default and bounds."""

    name: str
    type: str  # "int" | "dims" | "rate"
    default: Any
    help: str
    min: int | None = None
    max: int | None = None
    required: bool = False

    @property
    def expected(self) -> str:
        if self.type == "int":
            bounds = (
                f" in {self.min}..{self.max}"
                if self.min is not None and self.max is not None
                else f" >= {self.min}"
                if self.min is not None
                else ""
            )
            return f"an integer{bounds}"
        if self.type == "dims":
            return "dimensions like [4, 4] or '4x4x2' (2 or 3 sizes)"
        return "a rate like '4x EDR' or '100G'"

    def convert(self, generator: str, value: Any) -> Any:
        """Convert a CLI string or YAML value; raise ParamError when it is not acceptable."""
        if value is None:
            return None
        try:
            if self.type == "int":
                out: Any = _as_int(value)
                if (self.min is not None and out < self.min) or (
                    self.max is not None and out > self.max
                ):
                    raise ValueError
                return out
            if self.type == "dims":
                return _as_dims(value)
            return parse_rate(value)
        except (ValueError, ConfigError):
            raise ParamError(
                generator, self.name, f"{self.name}: expected {self.expected}, got {value!r}"
            ) from None


@dataclass(frozen=True)
class Generator:
    name: str
    func: Callable[..., Topology]
    params: tuple[Param, ...]
    help: str

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)


GENERATORS: dict[str, Generator] = {}
ALIASES = {"fattree": "fat-tree", "clos": "leaf-spine", "single": "single-switch"}


def _register(
    name: str, help: str, *params: Param
) -> Callable[[Callable[..., Topology]], Callable[..., Topology]]:
    def deco(func: Callable[..., Topology]) -> Callable[..., Topology]:
        GENERATORS[name] = Generator(name, func, params, help)
        return func

    return deco


def lookup(name: str) -> Generator:
    """The generator called ``name`` (or an alias); ConfigError with the list otherwise."""
    gen = GENERATORS.get(ALIASES.get(name, name))
    if gen is None:
        import difflib

        close = difflib.get_close_matches(name, [*GENERATORS, *ALIASES], n=1)
        hint = f" (did you mean {ALIASES.get(close[0], close[0])!r}?)" if close else ""
        raise ConfigError(f"unknown generator {name!r}{hint}; known: {', '.join(GENERATORS)}")
    return gen


def generate(name: str, params: Mapping[str, Any] | None = None, **kw: Any) -> Topology:
    """Build topology ``name`` from ``params`` (converted and checked against its Params)."""
    gen = lookup(name)
    given = {**(params or {}), **kw}
    args: dict[str, Any] = {}
    for key, value in given.items():
        p = gen.param(key.replace("-", "_"))
        if p is None:
            import difflib

            close = difflib.get_close_matches(key, [q.name for q in gen.params], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            allowed = ", ".join(q.name for q in gen.params)
            raise ParamError(
                gen.name, key, f"no parameter {key!r}{hint}; {gen.name} takes: {allowed}"
            )
        args[p.name] = p.convert(gen.name, value)
    for p in gen.params:
        if p.name not in args or args[p.name] is None:
            if p.required:
                raise ParamError(gen.name, p.name, f"missing {p.name} ({p.help})")
            args[p.name] = p.default
    topo = gen.func(**args)
    topo.generator = gen.name
    topo.params = {k: v for k, v in args.items() if v is not None}
    log.debug("generated %r", topo)
    return topo


def _fail(gen: str, param: str, message: str) -> ParamError:
    return ParamError(gen, param, message)


def _check_ports(gen: str, param: str, what: str, ports: int) -> None:
    if ports > MAX_PORT:
        raise _fail(
            gen,
            param,
            f"{what} would need {ports} ports, more than the {MAX_PORT} an IB switch has",
        )


# --- generators -----------------------------------------------------------------------------


@_register(
    "fat-tree",
    "k-ary fat-tree of k-port switches: 3 levels (k pods, 5k^2/4 switches, k^3/4 hosts) or 2 (k leaves, k/2 spines)",
    Param("k", "int", None, "switch radix (even)", min=2, max=64, required=True),
    Param("levels", "int", 3, "2 (edge, core) or 3 (edge, agg, core)", min=2, max=3),
    Param("hosts_per_edge", "int", None, "hosts on each edge switch (default k/2, full)", min=0),
)
def fat_tree(k: int, levels: int = 3, hosts_per_edge: int | None = None) -> Topology:
    g = "fat-tree"
    if k % 2:
        raise _fail(g, "k", f"k must be even, got {k}")
    half = k // 2
    hpe = half if hosts_per_edge is None else hosts_per_edge
    if hpe > half:
        raise _fail(
            g, "hosts_per_edge", f"an edge switch has k/2 = {half} host ports, asked for {hpe}"
        )
    t = Topology(f"fat-tree-k{k}" + ("" if levels == 3 else "-2l"))
    host = itertools.count()
    if levels == 2:
        for j in range(half):
            t.add_switch(f"core{j}", k, level=2)
        for i in range(k):
            t.add_switch(f"edge{i}", k, level=1, group=i)
            for j in range(half):
                t.connect(f"edge{i}", half + 1 + j, f"core{j}", i + 1)
        for i in range(k):
            for p in range(hpe):
                h = f"h{next(host)}"
                t.add_ca(h, level=0, group=i)
                t.connect(h, 1, f"edge{i}", p + 1)
        return t
    for c in range(half * half):
        t.add_switch(f"core{c}", k, level=3)
    for pod in range(k):
        for j in range(half):
            agg = f"agg{pod}_{j}"
            t.add_switch(agg, k, level=2, group=pod)
            for c in range(half):
                t.connect(agg, half + 1 + c, f"core{j * half + c}", pod + 1)
        for i in range(half):
            edge = f"edge{pod}_{i}"
            t.add_switch(edge, k, level=1, group=pod)
            for j in range(half):
                t.connect(edge, half + 1 + j, f"agg{pod}_{j}", i + 1)
    for pod in range(k):
        for i in range(half):
            for p in range(hpe):
                h = f"h{next(host)}"
                t.add_ca(h, level=0, group=pod)
                t.connect(h, 1, f"edge{pod}_{i}", p + 1)
    return t


@_register(
    "leaf-spine",
    "two-tier Clos: leaves with hosts and uplinks spread evenly over the spines (oversubscription = hosts/uplinks)",
    Param("leaves", "int", 4, "leaf switches", min=1, max=1024),
    Param("spines", "int", 2, "spine switches", min=1, max=255),
    Param("hosts_per_leaf", "int", 4, "hosts on each leaf", min=0, max=254),
    Param(
        "uplinks_per_leaf",
        "int",
        None,
        "uplinks per leaf, a multiple of spines (default: spines)",
        min=1,
    ),
    Param("uplink_rate", "rate", None, "rate of leaf-spine links (default: the link default)"),
    Param("leaf_ports", "int", None, "leaf radix (default: hosts + uplinks)", min=1, max=MAX_PORT),
    Param(
        "spine_ports",
        "int",
        None,
        "spine radix (default: what the leaves use)",
        min=1,
        max=MAX_PORT,
    ),
)
def leaf_spine(
    leaves: int,
    spines: int,
    hosts_per_leaf: int,
    uplinks_per_leaf: int | None = None,
    uplink_rate: LinkRate | None = None,
    leaf_ports: int | None = None,
    spine_ports: int | None = None,
) -> Topology:
    g = "leaf-spine"
    up = spines if uplinks_per_leaf is None else uplinks_per_leaf
    if up % spines:
        raise _fail(
            g,
            "uplinks_per_leaf",
            f"uplinks_per_leaf ({up}) must be a multiple of spines ({spines})",
        )
    per_spine = up // spines
    need_leaf, need_spine = hosts_per_leaf + up, leaves * per_spine
    _check_ports(g, "hosts_per_leaf", "a leaf", need_leaf)
    _check_ports(g, "leaves", "a spine", need_spine)
    lp = need_leaf if leaf_ports is None else leaf_ports
    sp = need_spine if spine_ports is None else spine_ports
    if lp < need_leaf:
        raise _fail(
            g,
            "leaf_ports",
            f"a leaf needs {need_leaf} ports ({hosts_per_leaf} hosts + {up} uplinks), leaf_ports is {lp}",
        )
    if sp < need_spine:
        raise _fail(
            g,
            "spine_ports",
            f"a spine needs {need_spine} ports ({leaves} leaves x {per_spine}), spine_ports is {sp}",
        )
    t = Topology(f"leaf-spine-{leaves}x{spines}")
    for j in range(spines):
        t.add_switch(f"spine{j}", sp, level=2)
    for i in range(leaves):
        t.add_switch(f"leaf{i}", lp, level=1, group=i)
        for u in range(up):
            s, n = u % spines, u // spines
            t.connect(
                f"leaf{i}",
                hosts_per_leaf + 1 + u,
                f"spine{s}",
                i * per_spine + n + 1,
                rate=uplink_rate,
            )
    host = itertools.count()
    for i in range(leaves):
        for p in range(hosts_per_leaf):
            h = f"h{next(host)}"
            t.add_ca(h, level=0, group=i)
            t.connect(h, 1, f"leaf{i}", p + 1)
    return t


def _grid(g: str, dims: tuple[int, ...], hosts: int, wrap: bool) -> Topology:
    if len(dims) not in (2, 3):
        raise _fail(g, "dims", f"dims must have 2 or 3 sizes, got {list(dims)}")
    low = 3 if wrap else 2
    if any(d < low for d in dims):
        why = " (2 would double the wrap-around link; use mesh)" if wrap else ""
        raise _fail(g, "dims", f"every dimension needs >= {low} switches{why}, got {list(dims)}")
    if any(d > 64 for d in dims) or math.prod(dims) > 4096:
        raise _fail(g, "dims", f"at most 64 per dimension and 4096 switches, got {list(dims)}")
    ports = hosts + 2 * len(dims)
    _check_ports(g, "hosts_per_switch", "a switch", ports)
    t = Topology(f"{g}-{'x'.join(map(str, dims))}")

    def name(c: tuple[int, ...]) -> str:
        return "sw" + "_".join(map(str, c))

    coords = list(itertools.product(*(range(d) for d in dims)))
    for c in coords:
        t.add_switch(name(c), ports, level=1, coords=c)
    for c in coords:
        for d, size in enumerate(dims):
            if c[d] + 1 < size or wrap:
                nxt = list(c)
                nxt[d] = (c[d] + 1) % size
                t.connect(name(c), hosts + 2 * d + 1, name(tuple(nxt)), hosts + 2 * d + 2)
    host = itertools.count()
    for c in coords:
        for p in range(hosts):
            h = f"h{next(host)}"
            t.add_ca(h, level=0, coords=c)
            t.connect(h, 1, name(c), p + 1)
    return t


@_register(
    "torus",
    "2D or 3D torus: switches on a grid, each linked to its +/- neighbour in every dimension, wrapping around",
    Param("dims", "dims", None, "sizes per dimension, e.g. 4x4 or 4x4x2", required=True),
    Param("hosts_per_switch", "int", 1, "hosts on each switch", min=0, max=240),
)
def torus(dims: tuple[int, ...], hosts_per_switch: int = 1) -> Topology:
    return _grid("torus", dims, hosts_per_switch, wrap=True)


@_register(
    "mesh",
    "2D or 3D mesh: a torus without the wrap-around links",
    Param("dims", "dims", None, "sizes per dimension, e.g. 4x4 or 3x3x3", required=True),
    Param("hosts_per_switch", "int", 1, "hosts on each switch", min=0, max=240),
)
def mesh(dims: tuple[int, ...], hosts_per_switch: int = 1) -> Topology:
    return _grid("mesh", dims, hosts_per_switch, wrap=False)


@_register(
    "dragonfly",
    "dragonfly: fully connected groups of switches, groups joined by global links "
    "(balanced when groups = routers_per_group * global_links + 1)",
    Param(
        "groups",
        "int",
        None,
        "groups (default: routers_per_group * global_links + 1)",
        min=2,
        max=256,
    ),
    Param("routers_per_group", "int", 4, "switches per group", min=1, max=64),
    Param("hosts_per_router", "int", 2, "hosts per switch", min=0, max=128),
    Param("global_links", "int", 2, "global links per switch", min=1, max=64),
)
def dragonfly(
    groups: int | None = None,
    routers_per_group: int = 4,
    hosts_per_router: int = 2,
    global_links: int = 2,
) -> Topology:
    gname = "dragonfly"
    a, p, h = routers_per_group, hosts_per_router, global_links
    g = a * h + 1 if groups is None else groups
    if (a * h) % (g - 1):
        raise _fail(
            gname,
            "groups",
            f"each group has routers_per_group x global_links = {a * h} global ports, which must split evenly "
            f"over the {g - 1} other groups",
        )
    ports = p + (a - 1) + h
    _check_ports(gname, "routers_per_group", "a switch", ports)
    t = Topology(f"dragonfly-{g}g{a}r")
    for gi in range(g):
        for r in range(a):
            t.add_switch(f"g{gi}sw{r}", ports, level=1, group=gi)
    # Local: all-to-all inside a group; switch r's local port for peer q is p+1+(q if q<r else q-1).
    for gi in range(g):
        for r, q in itertools.combinations(range(a), 2):
            t.connect(f"g{gi}sw{r}", p + 1 + (q - 1), f"g{gi}sw{q}", p + 1 + r)
    # Global: group port t (switch t//h, slot t%h) goes to group offset 1 + t mod (g-1); the
    # k-th port towards an offset pairs with the k-th port of the far group back.
    gbase = p + a  # first global port number
    for gi in range(g):
        for tp in range(a * h):
            off = 1 + tp % (g - 1)
            gj = (gi + off) % g
            tq = (g - off - 1) + (tp // (g - 1)) * (g - 1)
            if (gi, tp) < (gj, tq):
                t.connect(f"g{gi}sw{tp // h}", gbase + tp % h, f"g{gj}sw{tq // h}", gbase + tq % h)
    host = itertools.count()
    for gi in range(g):
        for r in range(a):
            for hp in range(p):
                hn = f"h{next(host)}"
                t.add_ca(hn, level=0, group=gi)
                t.connect(hn, 1, f"g{gi}sw{r}", hp + 1)
    return t


@_register(
    "ring",
    "switches in a ring, each with its hosts",
    Param("switches", "int", 4, "switches in the ring", min=3, max=1024),
    Param("hosts_per_switch", "int", 1, "hosts on each switch", min=0, max=250),
)
def ring(switches: int = 4, hosts_per_switch: int = 1) -> Topology:
    hp = hosts_per_switch
    t = Topology(f"ring-{switches}")
    for i in range(switches):
        t.add_switch(f"sw{i}", hp + 2, level=1, coords=(i,))
    for i in range(switches):
        t.connect(f"sw{i}", hp + 1, f"sw{(i + 1) % switches}", hp + 2)
    host = itertools.count()
    for i in range(switches):
        for p in range(hp):
            h = f"h{next(host)}"
            t.add_ca(h, level=0)
            t.connect(h, 1, f"sw{i}", p + 1)
    return t


@_register(
    "single-switch",
    "one switch with hosts on its first ports",
    Param("hosts", "int", 2, "hosts", min=1, max=MAX_PORT),
    Param("ports", "int", None, "switch radix (default: hosts)", min=1, max=MAX_PORT),
)
def single_switch(hosts: int = 2, ports: int | None = None) -> Topology:
    n = hosts if ports is None else ports
    if n < hosts:
        raise _fail("single-switch", "ports", f"{hosts} hosts need {hosts} ports, ports is {n}")
    t = Topology(f"single-switch-{hosts}")
    t.add_switch("sw0", n, level=1)
    for i in range(hosts):
        t.add_ca(f"h{i}", level=0)
        t.connect(f"h{i}", 1, "sw0", i + 1)
    return t


@_register(
    "gpu-rails",
    "rail-optimized GPU cluster: servers of `rails` single-port HCAs (CAs sN_rR), rail R of every server on "
    "leaf R of its group, every leaf up to every spine",
    Param("servers", "int", 4, "GPU servers", min=1, max=4096),
    Param("rails", "int", 2, "HCA ports (CAs) per server, one per rail", min=1, max=64),
    Param("servers_per_leaf", "int", None, "servers per group: one leaf per rail per group (default: all)",
          min=1, max=MAX_PORT - 1),
    Param("spines", "int", 1, "spine switches (joining the rails and the groups)", min=1, max=255),
)
def gpu_rails(servers: int, rails: int, servers_per_leaf: int | None = None, spines: int = 1) -> Topology:
    """CAs are added server by server, rails in order (``s0_r0, s0_r1, s1_r0, ...``), so a
    scenario's ``gpus: {rails: R}`` takes each server's R CAs together."""
    g = "gpu-rails"
    per = servers if servers_per_leaf is None else min(servers_per_leaf, servers)
    groups = -(-servers // per)
    _check_ports(g, "servers_per_leaf", "a leaf", per + spines)
    _check_ports(g, "servers", "a spine", groups * rails)
    t = Topology(f"gpu-rails-{servers}x{rails}")
    for j in range(spines):
        t.add_switch(f"spine{j}", groups * rails, level=2)
    for grp in range(groups):
        for r in range(rails):
            leaf = f"leaf{grp}_{r}"
            t.add_switch(leaf, per + spines, level=1, group=grp * rails + r)
            for j in range(spines):
                t.connect(leaf, per + 1 + j, f"spine{j}", grp * rails + r + 1)
    for sv in range(servers):
        grp, slot = divmod(sv, per)
        for r in range(rails):
            ca = f"s{sv}_r{r}"
            t.add_ca(ca, level=0, group=grp * rails + r)
            t.connect(ca, 1, f"leaf{grp}_{r}", slot + 1)
    return t


def with_defaults(topo: Topology, defaults: LinkDefaults) -> Topology:
    """Set a topology's link defaults (rates/MTU of links without their own)."""
    topo.defaults = defaults
    return topo


__all__ = [
    "ALIASES",
    "GENERATORS",
    "Generator",
    "NodeKind",
    "Param",
    "ParamError",
    "generate",
    "lookup",
]


def parse_topo_spec(text: str) -> Topology:
    """``fat-tree,k=4`` / ``leaf-spine,leaves=4,spines=2`` (``--topo``) -> a generated topology."""
    name, *pairs = [p.strip() for p in text.split(",") if p.strip()] or [""]
    params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--topo {text}: expected NAME,key=value,..., got {pair!r}")
        params[key.strip().replace("-", "_")] = value.strip()
    return generate(name, params)
