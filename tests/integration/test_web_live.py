"""The live page of ``ibemu up --web`` and the HTML report, in a real headless Chromium.

One fabric (k=4 fat-tree, ibemu's SM) with its live page on an ephemeral loopback port serves
every browser test here; one Chromium (``tests.integration.browser``: the DevTools protocol on a
pipe) opens the pages. A cut cable must turn red on the page within a second of the request.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from ibemu.fabric.session import FabricRequest, Session
from ibemu.kernel import netns
from ibemu.report.html import render
from ibemu.topo import parse_topo_spec
from tests.integration.browser import CHROMIUM, Browser

pytestmark = pytest.mark.root
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (scripts/setup.sh)")

REPORT = Path(__file__).parents[1] / "unit" / "report" / "data" / "live-k4-link-down.json"
RED = "rgb(228, 26, 28)"  # ibemu.topo.svg's failed/down stroke, #e41a1c
CUT = ("edge1_0", "agg1_1")
"""The cable the tests cut: off the SM's own path (h0 hangs off edge0_0)."""


@pytest.fixture(scope="module")
def fabric() -> Iterator[Session]:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    req = FabricRequest(parse_topo_spec("fat-tree,k=4"), "web-live-test", sm="ibemu", sm_host="h0", sm_engine="ftree")
    session = Session.up(req, web=("127.0.0.1", 0))
    try:
        yield session
    finally:
        problems = session.down()
        assert not problems, problems
        assert not [n for n in session.state.namespaces if netns.exists(n)]


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed (scripts/setup.sh)")
    b = Browser(tmp_path_factory.mktemp("chromium-profile"))
    try:
        yield b
    finally:
        b.close()


def _cable(session: Session, a: str, b: str) -> str:
    """A script expression for the cable's element, found by its ends (either order)."""
    (lk,) = session.topology.links_between(a, b)
    x, y = str(lk.a), str(lk.b)
    return (f"document.querySelector('line[data-a=\"{x}\"][data-b=\"{y}\"], "
            f"line[data-a=\"{y}\"][data-b=\"{x}\"]')")


@needs_chromium
def test_live_page_shows_the_fabric_and_a_cut_cable_turns_red(fabric: Session, browser: Browser) -> None:
    assert fabric.web_url is not None and fabric.web_url.startswith("http://127.0.0.1:")
    browser.open(fabric.web_url)
    browser.wait_for("document.body.dataset.seq !== undefined")  # the snapshot arrived and was drawn
    switches = [n.name for n in fabric.topology.switches()]
    shown = browser.evaluate("Array.from(document.querySelectorAll('svg.topo g.node.switch')).map(g => g.dataset.name)")
    assert sorted(shown) == sorted(switches)
    for name in switches:
        assert browser.evaluate(f"document.getElementById('node-{name}').getBoundingClientRect().width > 0")
    assert browser.wait_for("document.getElementById('ports-core0').textContent.includes('Active')")
    assert browser.wait_for("document.getElementById('counters').rows.length > 0")
    assert browser.wait_for("document.getElementById('events').textContent.includes('subnet_up')")
    sm_port = "document.getElementById('c-h0:1').cells[1].textContent"  # the SM's port: xmit octets
    before = browser.evaluate(sm_port)
    cable = _cable(fabric, *CUT)
    stroke = f"getComputedStyle({cable}).stroke"
    assert browser.evaluate(stroke) != RED

    t0 = time.monotonic()
    fabric.link([*CUT, "down"])
    browser.wait_for(f"{stroke} === '{RED}'", timeout_s=3.0, every_s=0.01)
    took = time.monotonic() - t0
    print(f"cut cable red on the page {took * 1e3:.0f} ms after the request")
    assert took < 1.0, f"the cut cable turned red after {took:.3f} s"
    assert browser.evaluate(f"{cable}.classList.contains('down')")
    # the SM's reaction reaches the page as events: the fault, the carrier, the trap at the SM
    assert browser.wait_for("document.getElementById('events').textContent.includes('link_down')")
    # the SM's reroute went out through its port: the counters on the page moved
    browser.wait_for(f"{sm_port} !== '{before}'", timeout_s=5.0)

    fabric.link([*CUT, "up"])
    browser.wait_for(f"{stroke} !== '{RED}'", timeout_s=5.0)
    assert browser.errors() == []


def test_read_only_and_event_stream(fabric: Session) -> None:
    assert fabric.web_url is not None
    for method in ("POST", "PUT", "DELETE"):
        req = urllib.request.Request(fabric.web_url + "state", data=b"{}", method=method)
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=5)
        assert err.value.code == 405 and err.value.headers["Allow"] == "GET, HEAD"
    with urllib.request.urlopen(fabric.web_url + "state", timeout=5) as r:
        state = json.load(r)
    assert set(state["ports"]) == set(fabric.topology.nodes)
    (cut,) = fabric.topology.links_between(*CUT)  # up again, maybe not yet Active (the SM's next sweep)
    for node, ports in state["ports"].items():
        for port, (carrier, port_state, phys) in ports.items():
            assert carrier == 1 and phys == "LinkUp", (node, port)
            assert port_state == "Active" or f"{node}:{port}" in (str(cut.a), str(cut.b)), (node, port, port_state)
    with urllib.request.urlopen(fabric.web_url + "events", timeout=5) as r:
        assert r.headers["Content-Type"] == "text/event-stream"
        assert r.readline() == b"event: snapshot\n"


@needs_chromium
def test_html_report_opens_without_errors(tmp_path: Path, browser: Browser) -> None:
    data = json.loads(REPORT.read_text())
    page = tmp_path / "report.html"
    page.write_text(render(data))
    browser.open(page.as_uri())
    switches = sorted(n for n, kind in data["link_load"]["nodes"].items() if kind == "switch")
    shown = browser.evaluate("Array.from(document.querySelectorAll('svg.topo g.node.switch')).map(g => g.dataset.name)")
    assert sorted(shown) == switches and len(switches) == 20
    assert browser.evaluate("document.querySelectorAll('figure.invalid').length") == 3
    failed = browser.evaluate("Array.from(document.querySelectorAll('svg.topo line.failed')).map(e => e.id)")
    assert failed == ["link-agg0_0:4-core1:1"]
    assert browser.evaluate(f"getComputedStyle(document.getElementById('{failed[0]}')).stroke") == RED
    browser.evaluate("document.querySelector('.legend span[data-flow=bulk]').click()")  # the legend's script
    assert browser.evaluate("document.querySelector('polyline[data-series=bulk]').style.display") == "none"
    assert browser.errors() == []


def _ibemu(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "IBEMU_STATE_DIR": str(state)}
    return subprocess.run([sys.executable, "-m", "ibemu.cli.main", *args], capture_output=True, text=True,
                          timeout=60, env=env, check=False)


def test_bad_web_addresses_start_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        r = _ibemu(state, "up", "--topo", "single-switch,hosts=2", "--sm", "none", "--web", str(port))
    assert r.returncode == 2 and f"--web 127.0.0.1:{port}: the port is in use" in r.stderr, r.stderr
    r = _ibemu(state, "up", "--topo", "single-switch,hosts=2", "--web", "0.0.0.0:8080")
    assert r.returncode == 2 and "not a loopback address" in r.stderr and "--web-remote" in r.stderr
    assert not list(state.glob("runs/*.json"))
