"""`ibemu cli`: console command parsing and dispatch on a fake fabric (no root)."""

from __future__ import annotations

import io
from typing import Any

import pytest

from ibemu.cli import console_cmd
from ibemu.cli.console_cmd import Console, perf_call
from ibemu.errors import ConfigError
from ibemu.fabric.session import link_request, switch_request
from ibemu.topo import generate


@pytest.fixture(scope="module")
def topo() -> Any:
    return generate("fat-tree", {"k": 4})


class FakeFabric:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def fault(self, request: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("fault", request))
        if request.get("switch") == "core0":
            return {"ok": False, "error": "netlink said no"}
        return {"ok": True, "t_fault_ns": 5, **{k: v for k, v in request.items() if k in ("link", "switch")}}

    def sm(self, argv: list[str]) -> int:
        self.calls.append(("sm", argv))
        return 0

    def shell(self, node: str, command: str) -> int:
        self.calls.append(("shell", node, command))
        return 0

    def perf(self, client: str, test: str, server: str, options: list[str]) -> int:
        self.calls.append(("perf", client, test, server, options))
        return 0

    def carrier_down(self) -> set[str]:
        return {"agg0_0-4", "core1-1"}

    def lids(self) -> dict[str, int]:
        return {"h1": 6, "edge0_0": 3}

    def namespace(self, node: str) -> str:
        return f"ibemu-r1-{node}"


def _console(topo: Any) -> tuple[Console, FakeFabric, io.StringIO]:
    fake, out = FakeFabric(), io.StringIO()
    return Console(topo, fake, run_id="r1", stdin=io.StringIO(), stdout=out), fake, out


@pytest.mark.parametrize("args, expected", [
    (["edge0_0", "agg0_0", "down"], {"fault": "link_down", "link": "edge0_0:3-agg0_0:1", "end": "edge0_0:3"}),
    (["agg0_0", "edge0_0", "down"], {"fault": "link_down", "link": "edge0_0:3-agg0_0:1", "end": "agg0_0:1"}),
    (["agg0_0:4", "down"], {"fault": "link_down", "link": "agg0_0:4-core1:1", "end": "agg0_0:4"}),
    (["core1:1", "up"], {"fault": "link_up", "link": "agg0_0:4-core1:1", "end": "core1:1"}),
    (["edge0_0:3-agg0_0:1", "up"], {"fault": "link_up", "link": "edge0_0:3-agg0_0:1", "end": "edge0_0:3"}),
])
def test_link_request(topo: Any, args: list[str], expected: dict[str, Any]) -> None:
    assert link_request(topo, args) == expected


@pytest.mark.parametrize("args, message", [
    (["edge0_0", "core0", "down"], "no link between edge0_0 and core0"),
    (["edge0_0:9", "down"], "edge0_0 has ports 1-4"),
    (["edge0_0", "agg0_0", "sideways"], "up or down"),
    (["edge0_0"], "usage: link"),
    (["nosuch:1", "down"], "no node 'nosuch'"),
])
def test_link_request_errors(topo: Any, args: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        link_request(topo, args)


def test_switch_and_perf_parsing(topo: Any) -> None:
    assert switch_request(topo, ["agg1_0", "down"]) == {"fault": "switch_down", "switch": "agg1_0"}
    with pytest.raises(ConfigError, match="expected a switch"):
        switch_request(topo, ["h1", "down"])
    assert perf_call(topo, "h1", ["write_bw", "h3", "-s", "4096"]) == ("write_bw", "h3", ["-s", "4096"])
    with pytest.raises(ConfigError, match="one of write_bw"):
        perf_call(topo, "h1", ["iperf", "h3"])
    with pytest.raises(ConfigError, match="edge0_0 is not a host"):
        perf_call(topo, "h1", ["write_bw", "edge0_0"])
    with pytest.raises(ConfigError, match="another host"):
        perf_call(topo, "h1", ["write_bw", "h1"])


def test_console_dispatch(topo: Any) -> None:
    con, fake, out = _console(topo)
    for line in ("link edge0_0 agg0_0 down", "switch agg1_0 up", "sm routes edge0_0", "sm path h1 h15",
                 "h1 perf write_bw h3 -n 100", "h1 ip -br link | grep h1", "", "switch core0 down"):
        assert con.onecmd(line) is False
    assert fake.calls == [
        ("fault", {"fault": "link_down", "link": "edge0_0:3-agg0_0:1", "end": "edge0_0:3"}),
        ("fault", {"fault": "switch_up", "switch": "agg1_0"}),
        ("sm", ["routes", "edge0_0"]), ("sm", ["path", "h1", "h15"]),
        ("perf", "h1", "write_bw", "h3", ["-n", "100"]),
        ("shell", "h1", "ip -br link | grep h1"),
        ("fault", {"fault": "switch_down", "switch": "core0"}),
    ]
    text = out.getvalue()
    assert "link_down edge0_0:3-agg0_0:1: injected" in text
    assert "*** netlink said no" in text


def test_console_listings_and_errors(topo: Any) -> None:
    con, fake, out = _console(topo)
    con.onecmd("nodes")
    con.onecmd("links")
    con.onecmd("dump")
    con.onecmd("link edge0_0 core0 down")   # an error is printed, the console goes on
    con.onecmd("frobnicate")
    con.onecmd("h1")
    text = out.getvalue()
    assert "available nodes are: \ncore0 " in text and " h15" in text
    assert "agg0_0-4<->core1-1 (MISSING MISSING)" in text and "h0-1<->edge0_0-1 (OK OK)" in text
    assert "<Host h1: ns=ibemu-r1-h1 ports=1/1" in text and "lid=6>" in text
    assert "<Switch edge0_0: ns=ibemu-r1-edge0_0 ports=4/4" in text
    assert "*** no link between edge0_0 and core0" in text
    assert "*** Unknown command: frobnicate" in text
    assert "*** usage: h1 CMD" in text
    assert fake.calls == []
    assert con.onecmd("exit") is True and con.onecmd("EOF") is True


def test_cmdloop_reads_piped_commands(topo: Any) -> None:
    fake, out = FakeFabric(), io.StringIO()
    con = Console(topo, fake, stdin=io.StringIO("nodes\nswitch agg1_0 down\n"), stdout=out)
    con.cmdloop()  # ends at end of input (EOF)
    assert fake.calls == [("fault", {"fault": "switch_down", "switch": "agg1_0"})]
    assert out.getvalue().count(console_cmd.PROMPT) == 3


def test_registered() -> None:
    from ibemu.cli.main import build_parser

    args = build_parser().parse_args(["cli", "--topo", "fat-tree,k=4", "--sm", "ibemu"])
    assert args.func is console_cmd.run and args.topo == "fat-tree,k=4"
