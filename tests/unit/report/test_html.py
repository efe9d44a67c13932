"""The HTML report (``ibemu report RESULT --html``) on a real run's result.

``data/live-k4-link-down.json`` is what ``ibemu run`` wrote for the default scenario shortened
(k=4 fat-tree, ftree, agg0_0:4 down at 2 s and up at 4.5 s, 6 s of traffic) on this 2-core
machine while other work ran: it fell behind its clock, so it is an INVALID run, and it carries
``link_load`` from the ports' counters.
"""

from __future__ import annotations

import copy
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from ibemu.cli.main import main
from ibemu.report.html import render, topology_of
from ibemu.report.plots import INVALID_TITLE
from ibemu.report.result import RunResult, validate
from ibemu.report.summary import INVALID_MARK
from tests.unit.report.sample import result as synthetic

LIVE = Path(__file__).parent / "data" / "live-k4-link-down.json"


def live() -> dict[str, Any]:
    return dict(json.loads(LIVE.read_text()))


class _Tags(HTMLParser):
    """Every start tag with its attributes, and whether the tags balance."""

    VOID = {"meta", "br", "link", "img", "input", "hr", "line", "rect", "circle", "path", "polyline"}

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.stack: list[str] = []
        self.errors: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag: str) -> None:
        if tag in self.VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()


def parse(page: str) -> _Tags:
    p = _Tags()
    p.feed(page)
    p.close()
    return p


def test_live_result_is_valid_and_has_loads() -> None:
    data = live()
    assert validate(data) == []
    r = RunResult.from_dict(data)
    assert r.link_load is not None and len(r.link_load.links) == r.fabric.links == 48
    assert r.invalid  # what the page must say on every figure


def test_every_switch_host_and_cable_drawn_with_its_load() -> None:
    data = live()
    page = render(data)
    tags = parse(page)
    assert not tags.errors and not tags.stack
    ids = {a.get("id"): (t, a) for t, a in tags.tags if a.get("id")}
    topo = topology_of(RunResult.from_dict(data).link_load)  # type: ignore[arg-type]
    assert len(topo.switches()) == 20 and len(topo.cas()) == 16
    for n in topo.nodes.values():
        tag, attrs = ids[f"node-{n.name}"]
        assert tag == "g" and ("switch" if n.is_switch else "host") in (attrs["class"] or "")
    loads = {}
    for lk in data["link_load"]["links"]:
        tag, attrs = ids[f"link-{lk['a']}-{lk['b']}"]
        assert tag == "line"
        loads[lk["a"], lk["b"]] = float(attrs["data-load"] or 0)
    busiest = max(data["link_load"]["links"], key=lambda lk: lk["bytes"])
    assert loads[busiest["a"], busiest["b"]] == 1.0
    idle = [k for k, v in loads.items() if v < 0.01]
    assert idle, "a cable no flow crossed carries only management traffic"
    # the cable the run cut is marked failed (agg0_0:4, to core1)
    failed = [a["id"] for t, a in tags.tags if t == "line" and "failed" in (a.get("class") or "").split()]
    assert failed == ["link-agg0_0:4-core1:1"]


def test_invalid_run_marked_on_every_figure() -> None:
    page = render(live())
    figures = re.findall(r"<figure .*?</figure>", page, re.S)
    assert len(figures) == 3  # topology, phases, throughput
    for fig in figures:
        assert INVALID_MARK in fig
    svgs = re.findall(r"<svg .*?</svg>", page, re.S)
    assert len(svgs) == 3 and all(INVALID_TITLE.rstrip(": ") in s for s in svgs)
    assert '<div class="banner invalid" id="fidelity">' in page
    assert "<title>INVALID: " in page


def test_valid_run_has_no_invalid_mark() -> None:
    data = live()
    data["fidelity"]["valid"] = True
    page = render(data)
    assert INVALID_MARK not in page and INVALID_TITLE.rstrip(": ") not in page
    assert 'class="banner valid"' in page


def test_phases_and_throughput_from_the_result() -> None:
    data = live()
    page = render(data)
    for i, f in enumerate(data["faults"], 1):
        assert f"#{i} {f['action']} {f['target']} at {f['t_fault_s']:.2f} s" in page
        for phase in ("detect", "trap", "routed", "programmed"):
            if f["phases_ms"][phase] is not None:
                assert f'class="phase {phase}"' in page
    for t in data["traffic"]:
        assert f'data-series="{t["name"]}"' in page and f'data-flow="{t["name"]}"' in page


def test_self_contained_no_fetches() -> None:
    tags = parse(render(live()))
    for tag, attrs in tags.tags:
        for key in ("src", "href"):
            assert attrs.get(key) is None, f"<{tag} {key}=...> would fetch"
        assert tag not in ("link", "img", "iframe", "object", "embed")


def test_older_and_loadless_results() -> None:
    page = render(synthetic())  # no link_load: a note instead of the topology
    assert "does not record the fabric" in page and 'class="topo"' not in page
    v1 = synthetic()
    v1["schema"] = "ibemu.run/1"
    v1.pop("fidelity")
    page = render(v1)
    assert "Fidelity unknown" in page
    roundtrip = RunResult.from_dict(live()).to_dict()
    assert roundtrip["link_load"] == live()["link_load"]


def test_link_load_validation_is_located() -> None:
    data = live()
    bad = copy.deepcopy(data)
    bad["link_load"]["links"][0]["a"] = "nosuch:1"
    bad["link_load"]["links"][1]["b"] = "edge0_0"
    bad["link_load"]["nodes"]["h0"] = "server"
    problems = validate(bad)
    assert any(p.startswith("link_load.links[0].a: node 'nosuch'") for p in problems)
    assert any(p.startswith("link_load.links[1].b: expected NODE:PORT") for p in problems)
    assert any(p.startswith("link_load.nodes.h0: expected one of switch, ca, router") for p in problems)


def test_cli_writes_the_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "run.json"
    src.write_text(LIVE.read_text())
    assert main(["report", str(src), "--html"]) == 0
    out = tmp_path / "run.html"
    assert out.read_text() == render(live())
    assert "INVALID" in capsys.readouterr().out
    assert main(["report", str(src)]) == 0  # no --html: the terminal summary
    assert capsys.readouterr().out.startswith("ibemu run: html-report-sample")


@pytest.mark.parametrize(("text", "message"), [
    ('{"schema": "ibemu.compare/1", "runs": {}}', "not a run result: schema 'ibemu.compare/1'"),
    ('{"name": "x"}', "not a run result: no 'schema' key"),
    ("[1, 2", "line 1 column 6: not JSON"),
    ('{"schema": "ibemu.run/3"}', "scenario: missing"),
])
def test_cli_bad_input_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str,
                                      message: str) -> None:
    src = tmp_path / "bad.json"
    src.write_text(text)
    assert main(["report", str(src), "--html", "--out", str(tmp_path / "page.html")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ibemu: error: {src}") and message in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json"]


def test_credit_loops_get_a_figure() -> None:
    d = synthetic()
    assert "Credit loops" not in render(d)
    d["credit_loops"] = [{"t_s": 0.13, "hops": [{"switch": f"sw{i}", "port": 3, "vl": 0} for i in range(5)],
                          "stalled_us": 59245.0}]
    page = render(d)
    assert "<h2>Credit loops (deadlocks)</h2>" in page
    assert "sw0:3/VL0 -&gt; sw1:3/VL0 -&gt; sw2:3/VL0 -&gt; sw3:3/VL0 -&gt; sw4:3/VL0 -&gt; (back)" in page
    assert "59,245" in page
