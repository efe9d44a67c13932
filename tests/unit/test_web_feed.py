"""The live page's pieces that need no fabric: addresses, the listening socket, the feed, the page."""

from __future__ import annotations

import re
import threading
import time

import pytest

from ibemu.errors import ConfigError
from ibemu.fabric.web import LiveFeed, listen, page, parse_address, url_of
from ibemu.topo import parse_topo_spec


@pytest.mark.parametrize(("text", "allow", "want"), [
    ("8080", False, ("127.0.0.1", 8080)),
    ("127.0.0.1:0", False, ("127.0.0.1", 0)),
    ("localhost:9000", False, ("127.0.0.1", 9000)),
    ("[::1]:8080", False, ("::1", 8080)),
    ("0.0.0.0:8080", True, ("0.0.0.0", 8080)),
])
def test_addresses(text: str, allow: bool, want: tuple[str, int]) -> None:
    assert parse_address(text, allow) == want


@pytest.mark.parametrize(("text", "message"), [
    ("0.0.0.0:8080", "0.0.0.0 is not a loopback address"),
    ("10.1.2.3:80", "pass --web-remote"),
    ("http:80", "'http' is not an IP address"),
    ("127.0.0.1:x", "expected [ADDR:]PORT"),
    ("70000", "port 70000 is not in 0..65535"),
])
def test_bad_addresses(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_address(text)


def test_listen_errors_are_clear() -> None:
    sock = listen("127.0.0.1", 0)
    try:
        port = sock.getsockname()[1]
        assert url_of(sock) == f"http://127.0.0.1:{port}/" and sock.get_inheritable()
        with pytest.raises(ConfigError, match=re.escape(f"127.0.0.1:{port}: the port is in use")):
            listen("127.0.0.1", port)
    finally:
        sock.close()
    with pytest.raises(ConfigError, match=re.escape("192.0.2.7 is not an address of this machine")):
        listen("192.0.2.7", 8080)


def test_feed_sends_changes_in_order_and_merges_the_snapshot() -> None:
    feed = LiveFeed()
    feed.publish("ports", {"sw": {"1": [1, "Active", "LinkUp"], "2": [1, "Active", "LinkUp"]}}, "ports")
    seq, _ = feed.snapshot()
    got: list[list[tuple[int, str, str]] | None] = []
    waiter = threading.Thread(target=lambda: got.append(feed.wait(seq, 5.0)))
    waiter.start()
    time.sleep(0.05)
    feed.publish("ports", {"sw": {"2": [0, "Down", "Polling"]}}, "ports", merge=True)
    waiter.join(5)
    assert got and got[0] is not None and [(e, d) for _, e, d in got[0]] == [
        ("ports", '{"sw":{"2":[0,"Down","Polling"]}}')]
    _, snap = feed.snapshot()
    assert '"sw":{"1":[1,"Active","LinkUp"],"2":[0,"Down","Polling"]}' in snap
    for i in range(1100):  # a client this far behind is told to start again from a snapshot
        feed.publish("events", [{"kind": "trap", "i": i}], "events")
    assert feed.wait(seq, 0.0) is None
    assert snap.count('"kind"') == 0 and feed.snapshot()[1].count('"kind":"trap"') == 200
    t0 = time.monotonic()
    feed.close()
    assert feed.wait(feed.snapshot()[0], 5.0) == [] and time.monotonic() - t0 < 1.0


def test_page_has_every_node_and_cable_and_fetches_nothing() -> None:
    topo = parse_topo_spec("fat-tree,k=4")
    html = page(topo, "k4")
    for n in topo.nodes:
        assert f'id="node-{n}"' in html and f'id="ports-{n}"' in html
    assert html.count('<line id="link-') == len(topo.links) == 48
    assert "src=" not in html and "href=" not in html and "http" not in html.replace("http://www.w3.org/2000/svg", "")
