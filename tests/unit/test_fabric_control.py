"""The fabric daemon's control channel, over a real UNIX socket, with a recording injector."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
import trio

from ibemu.fabric import control
from ibemu.topo import generate
from ibemu.topo.model import Link


class RecordingInjector:
    fabric_kind = "ib"

    def __init__(self) -> None:
        self.topo = generate("fat-tree", {"k": 4})
        self.calls: list[tuple[Any, ...]] = []

    def link(self, link: Link, up: bool, *, end: int = 0) -> int:
        self.calls.append(("link", str(link), up, end))
        return 11

    def switch(self, name: str, up: bool) -> int:
        if name == "core3":
            raise OSError("netlink said no")
        self.calls.append(("switch", name, up))
        return 12

    def smp_loss(self, percent: float, switch: str | None = None) -> int:
        self.calls.append(("smp_loss", percent, switch))
        return 13

    def corrupt(self, link: Link, percent: float) -> int:
        self.calls.append(("corrupt", str(link), percent))
        return 14


def test_handle_resolves_links_like_scenarios() -> None:
    inj = RecordingInjector()
    r = control.handle(inj, {"fault": "link_down", "link": "agg0_0:4"})
    assert r == {"ok": True, "link": "agg0_0:4-core1:1", "t_fault_ns": 11}
    control.handle(inj, {"fault": "link_up", "link": "edge0_0-agg0_0", "end": 1})
    control.handle(inj, {"fault": "link_down", "link": "core1:1", "end": "agg0_0:4"})
    control.handle(inj, {"fault": "link_down", "link": "core1:1", "end": "core1"})
    control.handle(inj, {"fault": "switch_down", "switch": "agg1_0"})
    control.handle(inj, {"fault": "smp_loss", "percent": 20})
    control.handle(inj, {"fault": "corrupt", "link": "edge0_0:3", "percent": 1.5})
    assert inj.calls == [("link", "agg0_0:4-core1:1", False, 0), ("link", "edge0_0:3-agg0_0:1", True, 1),
                         ("link", "agg0_0:4-core1:1", False, 0), ("link", "agg0_0:4-core1:1", False, 1),
                         ("switch", "agg1_0", False), ("smp_loss", 20.0, None),
                         ("corrupt", "edge0_0:3-agg0_0:1", 1.5)]


@pytest.mark.parametrize("req, message", [
    ({"fault": "explode"}, "unknown fault"),
    ({"fault": "link_down", "link": "edge0_0:9"}, "edge0_0 has ports 1-4"),
    ({"fault": "link_down", "link": "agg0_0:4", "end": 2}, "end must be 0, 1 or an end"),
    ({"fault": "link_down", "link": "agg0_0:4", "end": "h1"}, "end must be 0, 1 or an end"),
    ({"fault": "switch_down", "switch": "h1"}, "expected a switch"),
    ({"fault": "smp_loss", "percent": 150}, "within 0..100"),
    ([1, 2], "expected a JSON object"),
])
def test_handle_refuses(req: object, message: str) -> None:
    inj = RecordingInjector()
    with pytest.raises(control.ControlError, match=message):
        control.handle(inj, req)
    assert inj.calls == []


def test_socket_round_trip_and_errors_keep_serving() -> None:
    inj = RecordingInjector()
    replies: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        path = control.socket_path(Path(tmp))

        async def main() -> None:
            async with trio.open_nursery() as nursery:
                await nursery.start(control.serve_control, path, inj)
                assert path.exists() and (path.stat().st_mode & 0o777) == 0o600
                for req in ({"ping": True}, {"fault": "link_down", "link": "agg0_0:4"},
                            {"fault": "switch_down", "switch": "core3"}, {"fault": "nope"},
                            {"fault": "switch_up", "switch": "agg1_0"}):
                    replies.append(await trio.to_thread.run_sync(control.request, path, req))
                nursery.cancel_scope.cancel()

        trio.run(main)
        assert not path.exists()  # removed on the way out
    assert replies[0] == {"ok": True}
    assert replies[1]["ok"] and replies[1]["t_fault_ns"] == 11
    assert replies[2] == {"ok": False, "error": "OSError: netlink said no"}
    assert not replies[3]["ok"] and "unknown fault" in replies[3]["error"]
    assert replies[4]["ok"] and replies[4]["switch"] == "agg1_0"
    assert inj.calls == [("link", "agg0_0:4-core1:1", False, 0), ("switch", "agg1_0", True)]
