"""ibemu.topo: the pure fabric model (no kernel, no trio).

``Topology`` with ``Node``/``Link``/``Port``, the generators (``generate("fat-tree", k=4)``),
ibnetdiscover import/export, graph analysis and drawing.
"""

from ibemu.topo.generators import GENERATORS, generate, parse_topo_spec
from ibemu.topo.ibnetdiscover import dump as dump_ibnetdiscover
from ibemu.topo.ibnetdiscover import dumps as dumps_ibnetdiscover
from ibemu.topo.ibnetdiscover import load as load_ibnetdiscover
from ibemu.topo.ibnetdiscover import loads as loads_ibnetdiscover
from ibemu.topo.model import Endpoint, Link, LinkDefaults, Node, NodeKind, Port, Problem, Topology
from ibemu.topo.names import ifname
from ibemu.topo.rates import LinkRate, parse_rate

__all__ = [
    "GENERATORS",
    "Endpoint",
    "Link",
    "LinkDefaults",
    "LinkRate",
    "Node",
    "NodeKind",
    "Port",
    "Problem",
    "Topology",
    "dump_ibnetdiscover",
    "dumps_ibnetdiscover",
    "generate",
    "ifname",
    "load_ibnetdiscover",
    "loads_ibnetdiscover",
    "parse_rate",
    "parse_topo_spec",
]
