"""ibemu.mininet: Mininet custom topologies and their conversion to ibemu topologies (no root)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ibemu import mininet as adapter
from ibemu.topo import generate


def test_imports_without_mininet() -> None:
    code = ("import sys; sys.modules['mininet'] = None; sys.modules['mininet.topo'] = None\n"
            "from ibemu.mininet import topos, HAVE_MININET; assert not HAVE_MININET; print(sorted(topos))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['ibfattree', 'ibleafspine']"


def test_fattree_as_mininet_topology_keeps_names_and_ports() -> None:
    t = adapter.topos["ibfattree"](4)  # as `mn --topo ibfattree,4` calls it
    assert len(t.switches()) == 20 and len(t.hosts()) == 16 and len(t.links()) == 48
    infos = {(i["node1"], i["port1"]): (i["node2"], i["port2"]) for _, _, i in t.iterLinks(withInfo=True)}
    assert infos[("agg0_0", 4)] == ("core1", 1) or infos[("core1", 1)] == ("agg0_0", 4)
    ib = adapter.to_ibemu(t)
    assert ib.graph_key() == generate("fat-tree", {"k": 4}).graph_key()


def test_leafspine_parameters() -> None:
    t = adapter.topos["ibleafspine"](4, 2, 3)
    ib = adapter.to_ibemu(t)
    counts = ib.counts()
    assert (counts.switches, counts.cas, counts.links) == (6, 12, 20)


def test_a_users_mininet_topology_converts() -> None:
    class Square(adapter._Base):  # what a Mininet user writes: ports implicit, hosts from 0
        def build(self) -> None:
            s1, s2 = self.addSwitch("s1"), self.addSwitch("s2")
            self.addLink(self.addHost("h1"), s1, port1=0)
            self.addLink(self.addHost("h2"), s2)
            self.addLink(s1, s2, port1=5)

    ib = adapter.to_ibemu(Square())
    assert [n.name for n in ib.switches()] == ["s1", "s2"] and [n.name for n in ib.cas()] == ["h1", "h2"]
    assert str(ib.link_at("h1", 1)) == "h1:1-s1:1"        # Mininet's host port 0 is IB port 1
    assert str(ib.link_at("s1", 5)) == "s1:5-s2:2"
    assert ib.node("s1").num_ports == 5 and ib.link_at("h2", 1) is not None
    assert not ib.errors()


def test_bad_mininet_topology_is_refused() -> None:
    class Twice(adapter._Base):
        def build(self) -> None:
            s1 = self.addSwitch("s1")
            self.addLink(self.addHost("h1"), s1, port1=1, port2=1)
            self.addLink(self.addHost("h2"), s1, port1=1, port2=1)

    with pytest.raises(Exception, match="s1:1"):
        adapter.to_ibemu(Twice())


def test_custom_path_and_layout_for_mn() -> None:
    """What the `mn --custom` file asks of ibemu's venv: its own path, and a topology as JSON."""
    import json
    from pathlib import Path

    path = subprocess.run([sys.executable, "-m", "ibemu.mininet", "--custom-path"], capture_output=True,
                          text=True, check=True).stdout.strip()
    assert Path(path).is_file() and path.endswith("mininet/custom.py")
    out = subprocess.run([sys.executable, "-m", "ibemu.mininet", "layout", "leaf-spine,leaves=2,spines=1,hosts_per_leaf=1"],
                         capture_output=True, text=True, check=True).stdout
    lay = json.loads(out)
    assert sorted(s["name"] for s in lay["switches"]) == ["leaf0", "leaf1", "spine0"]
    assert [h["name"] for h in lay["hosts"]] == ["h0", "h1"]
    assert {"node1": "h0", "port1": 1, "intf1": "h0-1", "node2": "leaf0", "port2": 1, "intf2": "leaf0-1"} in lay["links"]
    assert all(len(s["guid"]) == 16 for s in lay["switches"])


def test_custom_file_needs_only_stdlib_and_mininet() -> None:
    """`mn` runs the file in its own interpreter: it must not import ibemu or its dependencies."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(adapter.custom_path()).read_text())
    roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    roots |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert roots <= set(sys.stdlib_module_names) | {"mininet", "__future__"}, roots
