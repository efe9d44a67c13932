"""The live page of ``ibemu up --web [ADDR:]PORT``: the fabric as it runs, in a browser.

Served by the fabric daemon (``ibemu.fabric.daemon``), the process that owns the fabric, with
the standard library's ``ThreadingHTTPServer`` on a socket ``Session.up`` bound before anything
was built (``listen``: a port in use or an address not on this machine is an error while
nothing exists yet; the socket is inherited by the daemon). 127.0.0.1 unless told otherwise;
an address that is not a loopback one is refused unless the caller allows it
(``ibemu up --web-remote``).

What it serves, read-only (GET and HEAD; any other method is 405, nothing it reads changes
the fabric):

- ``/``: the page: the topology (``ibemu.topo.svg``, every switch and host, every cable by its
  ends), each node's ports (PortState, PortPhysicalState, carrier), their PMA counters, and
  the SM's events as they happen; a few lines of inline script, no outside fetches;
- ``/events``: server-sent events (``text/event-stream``): ``snapshot`` first (everything),
  then ``ports`` (only the ports that changed: within ``STATE_POLL_S`` of the kernel's carrier
  event, so a cut cable turns red within a second), ``counters`` (the nodes read in the last
  tick, ``COUNTER_BATCH`` a tick, a pass at most every ``COUNTER_POLL_S``, while a page is open) and ``events`` (new records of the run's event logs: SM sweeps, traps, reroute
  phases, faults, carrier changes);
- ``/state``: the snapshot as JSON.

The state is read on the agent host's trio thread (``watch``: the agents are not
thread-safe) and handed to the server's threads through ``LiveFeed``. Counters cost a netlink
dump per node on that thread, so they are read only while a page is connected, a batch of
nodes a tick (the agents never stall for a whole pass over a large fabric).
"""

from __future__ import annotations

import errno
import ipaddress
import json
import logging
import socket
import threading
from collections import deque
from html import escape
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import trio

from ibemu import clock
from ibemu.errors import ConfigError
from ibemu.events import Kind, LogTail
from ibemu.fabric.agenthost import AgentHost
from ibemu.fabric.observe import SHOWN_COUNTERS, port_counters, port_states
from ibemu.topo import Topology
from ibemu.topo.svg import SVG_CSS, topology_svg

log = logging.getLogger(__name__)

STATE_POLL_S = 0.1
"""How often the port states are compared with the last ones sent (real seconds)."""
COUNTER_POLL_S = 1.0
"""How often a pass over every node's PMA counters starts while a page is connected (at most)."""
COUNTER_BATCH = 16
"""Nodes whose counters are read per ``STATE_POLL_S`` tick: each costs a netlink dump on the
agent thread (0.4-0.8 ms here), so a tick stalls the agents ~10 ms at most; a pass over a
k=4 fat-tree takes 3 ticks, over a k=16 one (1,344 nodes) 84 ticks (8.4 s)."""
EVENT_POLL_S = 0.2
KEEPALIVE_S = 10.0
KEEP = 1024
"""Messages kept for a client that fell behind; one further behind gets a fresh snapshot."""
EVENT_LOGS = ("events.jsonl", "ibemu/events.jsonl", "opensm/events.jsonl")
"""The run's event logs the page follows (``ibemu.events.Log``: the fabric's, the SMs')."""
FABRIC_KINDS = {Kind.CARRIER, Kind.FAULT, Kind.LOCAL_FAILOVER, Kind.TRAP_SENT}
"""Of the fabric log (one record per agent action), the kinds the page lists."""
QUIET_KINDS = {Kind.LFT_BLOCK_ACKED}
"""Of the SM logs, the kinds the page leaves out (one per LFT block)."""


def parse_address(text: str, allow_remote: bool = False) -> tuple[str, int]:
    """``8080`` / ``127.0.0.1:8080`` / ``[::1]:8080`` / ``localhost:8080`` -> (host, port).
    A non-loopback address is a ``ConfigError`` unless ``allow_remote``."""
    where = f"--web {text}"
    host, sep, port_text = text.rpartition(":")
    if not sep:
        host = "127.0.0.1"
    host = host.strip("[]") or "127.0.0.1"
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(f"{where}: expected [ADDR:]PORT, e.g. 8080 or 127.0.0.1:8080") from None
    if not 0 <= port <= 65535:
        raise ConfigError(f"{where}: port {port} is not in 0..65535")
    if host == "localhost":
        host = "127.0.0.1"
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        raise ConfigError(f"{where}: {host!r} is not an IP address (give a numeric address, or localhost)") from None
    if not addr.is_loopback and not allow_remote:
        raise ConfigError(f"{where}: {host} is not a loopback address: the page would be reachable from other "
                          "machines; pass --web-remote to allow it")
    return host, port


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port), inheritable; a clear error when it cannot be."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(64)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(f"--web {host}:{port}: the port is in use (another server listens there); "
                              "choose another") from None
        if exc.errno == errno.EADDRNOTAVAIL:
            raise ConfigError(f"--web {host}:{port}: {host} is not an address of this machine") from None
        if exc.errno == errno.EACCES:
            raise ConfigError(f"--web {host}:{port}: not allowed to listen there ({exc.strerror})") from None
        raise ConfigError(f"--web {host}:{port}: cannot listen: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


# --------------------------------------------------------------------------- the feed


class LiveFeed:
    """What the agent thread publishes and the server's threads send: the latest full state
    and the messages since, numbered (thread-safe)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._seq = 0
        self._recent: deque[tuple[int, str, str]] = deque(maxlen=KEEP)
        self._state: dict[str, Any] = {"ports": {}, "counters": {}, "events": []}
        self.closed = False
        self.clients = 0

    def publish(self, event: str, data: Any, state_key: str | None = None, merge: bool = False) -> None:
        """Send ``event`` with ``data``; also fold ``data`` into the snapshot's ``state_key``
        (``merge``: node by node into what is there; events are appended, the last 200 kept)."""
        text = json.dumps(data, separators=(",", ":"))
        with self._cond:
            self._seq += 1
            self._recent.append((self._seq, event, text))
            if state_key == "events":
                self._state["events"] = (self._state["events"] + list(data))[-200:]
            elif state_key is not None and merge:
                for node, ports in data.items():
                    self._state[state_key].setdefault(node, {}).update(ports)
            elif state_key is not None:
                self._state[state_key] = data
            self._cond.notify_all()

    def attach(self, n: int = 1) -> None:
        """A page connected (``n`` 1) or left (-1): counters are read while one is."""
        with self._cond:
            self.clients += n

    def set_static(self, **items: Any) -> None:
        with self._cond:
            self._state.update(items)

    def snapshot(self) -> tuple[int, str]:
        with self._cond:
            return self._seq, json.dumps({**self._state, "seq": self._seq}, separators=(",", ":"))

    def wait(self, after: int, timeout: float) -> list[tuple[int, str, str]] | None:
        """Messages numbered above ``after`` (waiting up to ``timeout``); ``None`` when the
        client fell further behind than the kept ones (it needs a snapshot)."""
        with self._cond:
            if self._seq == after and not self.closed:
                self._cond.wait(timeout)
            if self._recent and self._recent[0][0] > after + 1:
                return None
            return [m for m in self._recent if m[0] > after]

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()


# --------------------------------------------------------------------------- the agent side


def _ports_json(states: dict[str, dict[int, tuple[bool, str, str]]]) -> dict[str, dict[str, list[Any]]]:
    return {n: {str(p): [int(up), st, ph] for p, (up, st, ph) in ports.items()} for n, ports in states.items()}


def _shown(source: str, rec: dict[str, Any]) -> bool:
    kind = rec.get("kind")
    if source == "fabric":
        return kind in FABRIC_KINDS
    return kind not in QUIET_KINDS


async def watch(host: AgentHost, run_dir: Path, feed: LiveFeed) -> None:
    """Publish the fabric's state to ``feed`` until cancelled (runs on the agent thread)."""
    tails = [("fabric" if rel == EVENT_LOGS[0] else rel.split("/")[0], LogTail(run_dir / rel)) for rel in EVENT_LOGS]
    feed.set_static(t0_ns=clock.now_ns())
    last = _ports_json(port_states(host))
    feed.publish("ports", last, "ports")
    feed.publish("counters", port_counters(host, refresh=False), "counters")  # as the agents have them
    order = list(host.nodes)
    cursor = 0
    next_pass = 0.0
    next_events = 0.0
    while True:
        await trio.sleep(clock.loop_s(STATE_POLL_S))  # real seconds, on a dilated fabric too
        now = _ports_json(port_states(host))
        changed: dict[str, dict[str, list[Any]]] = {}
        for node, ports in now.items():
            diff = {p: v for p, v in ports.items() if last.get(node, {}).get(p) != v}
            if diff:
                changed[node] = diff
        if changed:
            feed.publish("ports", changed, "ports", merge=True)
            last = now
        t = trio.current_time()
        if t >= next_events:
            next_events = t + clock.loop_s(EVENT_POLL_S)
            records = [{"source": source, **r} for source, tail in tails for r in tail.new() if _shown(source, r)]
            if records:
                records.sort(key=lambda r: r.get("t_ns", 0))
                feed.publish("events", records, "events")
        if feed.clients and (cursor or t >= next_pass):  # a pass over the nodes, a batch a tick
            if not cursor:
                next_pass = t + clock.loop_s(COUNTER_POLL_S)
            batch = order[cursor:cursor + COUNTER_BATCH]
            feed.publish("counters", port_counters(host, nodes=batch), "counters", merge=True)
            cursor = cursor + COUNTER_BATCH if cursor + COUNTER_BATCH < len(order) else 0


# --------------------------------------------------------------------------- the server side


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    feed: LiveFeed
    page: bytes


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    server_version = "ibemu-live"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def _send(self, code: int, body: bytes, ctype: str, extra: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path in ("/", "/index.html"):
            self._send(200, self.server.page, "text/html; charset=utf-8")
        elif path == "/state":
            self._send(200, self.server.feed.snapshot()[1].encode(), "application/json")
        elif path == "/events":
            if self.command == "GET":
                self._stream()
            else:  # HEAD: what a GET would start with
                self._send(200, b"", "text/event-stream")
        elif path == "/favicon.ico":
            self._send(204, b"", "image/x-icon")
        else:
            self._send(404, b"not found\n", "text/plain; charset=utf-8")

    do_HEAD = do_GET

    def _refuse(self) -> None:
        self._send(405, b"read-only: GET and HEAD only\n", "text/plain; charset=utf-8", {"Allow": "GET, HEAD"})

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _refuse

    def _stream(self) -> None:
        feed = self.server.feed
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-store")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        feed.attach()
        try:
            seq, snap = feed.snapshot()
            self._write("snapshot", snap)
            while not feed.closed:
                msgs = feed.wait(seq, KEEPALIVE_S)
                if msgs is None:  # too far behind: start again from the state
                    seq, snap = feed.snapshot()
                    self._write("snapshot", snap)
                    continue
                if not msgs:
                    self.wfile.write(b": keepalive\n\n")
                    self.wfile.flush()
                    continue
                for n, event, data in msgs:
                    self._write(event, data, flush=False)
                    seq = n
                self.wfile.flush()
        except OSError:  # the page went away (BrokenPipe, ConnectionReset...)
            return
        finally:
            feed.attach(-1)

    def _write(self, event: str, data: str, flush: bool = True) -> None:
        self.wfile.write(f"event: {event}\ndata: {data}\n\n".encode())
        if flush:
            self.wfile.flush()


class LiveServer:
    """The HTTP server on an already listening socket, in its own thread."""

    def __init__(self, sock: socket.socket, feed: LiveFeed, page: str) -> None:
        server = _Server(sock.getsockname()[:2], _Handler, bind_and_activate=False)
        server.socket.close()
        server.socket = sock
        server.server_address = sock.getsockname()[:2]
        server.feed = feed
        server.page = page.encode()
        self.server = server
        self.feed = feed
        self.url = url_of(sock)
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="ibemu-web", daemon=True)

    def start(self) -> None:
        self._thread.start()
        log.info("live page at %s", self.url)

    def stop(self) -> None:
        self.feed.close()
        if self._thread.is_alive():
            self.server.shutdown()
        self.server.server_close()


# --------------------------------------------------------------------------- the page

PAGE_CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 0; padding: 10px 18px; color: #222; }
h1 { font-size: 20px; margin: 4px 0; } h2 { font-size: 16px; margin: 16px 0 6px; }
#conn { font-size: 12px; padding: 2px 8px; border-radius: 10px; background: #eee; }
#conn.live { background: #e6f4ea; color: #137333; } #conn.lost { background: #fde0dc; color: #a50e0e; }
.cols { display: flex; gap: 18px; flex-wrap: wrap; } .cols > div { flex: 1 1 420px; min-width: 0; }
table { border-collapse: collapse; font-size: 12px; } th, td { padding: 2px 6px; border-bottom: 1px solid #eee; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.port { display: inline-block; margin: 1px 2px; padding: 0 4px; border-radius: 3px; font-size: 11px; background: #e6f4ea; }
.port.Init, .port.Armed { background: #fff4ce; } .port.down { background: #fde0dc; color: #a50e0e; }
#events { max-height: 420px; overflow: auto; font: 12px monospace; background: #fafafa; padding: 4px; }
#events div.fault, #events div.link_down, #events div.trap { color: #a50e0e; }
.scroll { max-height: 420px; overflow: auto; }
"""

PAGE_JS = r"""
(function () {
  'use strict';
  var state = {}, t0 = 0, linksAt = {};
  document.querySelectorAll('svg.topo line.link').forEach(function (el) {
    [el.dataset.a, el.dataset.b].forEach(function (end) { (linksAt[end] = linksAt[end] || []).push(el); });
  });
  function isUp(end) {
    var i = end.lastIndexOf(':'), node = end.slice(0, i), p = state[node] && state[node][end.slice(i + 1)];
    return !p || p[0] === 1;
  }
  function text(tag, s, cls) {
    var el = document.createElement(tag); el.textContent = s; if (cls) el.className = cls; return el;
  }
  function paintNode(node) {
    var ports = state[node] || {}, cell = document.getElementById('ports-' + node);
    if (cell) {
      cell.textContent = '';
      Object.keys(ports).sort(function (a, b) { return a - b; }).forEach(function (p) {
        var v = ports[p];
        cell.appendChild(text('span', p + ' ' + v[1], 'port ' + v[1] + (v[0] ? '' : ' down')));
      });
    }
    var g = document.getElementById('node-' + node), all = Object.keys(ports);
    if (g) g.classList.toggle('down', all.length > 0 && all.every(function (p) { return !ports[p][0]; }));
  }
  function applyPorts(data) {
    Object.keys(data).forEach(function (node) {
      state[node] = state[node] || {};
      Object.keys(data[node]).forEach(function (p) {
        state[node][p] = data[node][p];
        (linksAt[node + ':' + p] || []).forEach(function (el) {
          el.classList.toggle('down', !(isUp(el.dataset.a) && isUp(el.dataset.b)));
        });
      });
      paintNode(node);
    });
  }
  function applyCounters(data) {
    var body = document.getElementById('counters');
    Object.keys(data).forEach(function (node) {
      Object.keys(data[node]).forEach(function (p) {
        var c = data[node][p], tr = document.getElementById('c-' + node + ':' + p);
        if (!tr) {
          tr = document.createElement('tr'); tr.id = 'c-' + node + ':' + p;
          tr.appendChild(text('td', node + ':' + p));
          COUNTERS.forEach(function () { tr.appendChild(text('td', '', 'num')); });
          body.appendChild(tr);
        }
        COUNTERS.forEach(function (k, i) { tr.cells[i + 1].textContent = (c[k] || 0).toLocaleString(); });
      });
    });
  }
  function addEvents(list) {
    var box = document.getElementById('events');
    list.forEach(function (r) {
      var t = ((r.t_ns - t0) / 1e9).toFixed(3), rest = Object.assign({}, r);
      ['t_ns', 'kind', 'source', 'node'].forEach(function (k) { delete rest[k]; });
      box.appendChild(text('div', t + ' s  ' + r.source + (r.node ? ' ' + r.node : '') + '  ' + r.kind + '  ' +
                           JSON.stringify(rest), r.kind));
    });
    while (box.childNodes.length > 500) box.removeChild(box.firstChild);
    box.scrollTop = box.scrollHeight;
  }
  var conn = document.getElementById('conn');
  var es = new EventSource('events');
  es.addEventListener('open', function () { conn.textContent = 'live'; conn.className = 'live'; });
  es.addEventListener('error', function () { conn.textContent = 'disconnected (retrying)'; conn.className = 'lost'; });
  es.addEventListener('snapshot', function (e) {
    var d = JSON.parse(e.data);
    t0 = d.t0_ns || 0; state = {};
    applyPorts(d.ports); applyCounters(d.counters);
    document.getElementById('events').textContent = ''; addEvents(d.events);
    document.body.dataset.seq = d.seq;
  });
  es.addEventListener('ports', function (e) { applyPorts(JSON.parse(e.data)); });
  es.addEventListener('counters', function (e) { applyCounters(JSON.parse(e.data)); });
  es.addEventListener('events', function (e) { addEvents(JSON.parse(e.data)); });
})();
"""


COUNTER_LABELS = {"xmit_octets": "xmit octets", "rcv_octets": "rcv octets", "xmit_pkts": "xmit pkts",
                  "rcv_pkts": "rcv pkts", "symbol_error_counter": "symbol err", "link_downed_counter": "link downed",
                  "port_rcv_errors": "rcv err", "port_xmit_discards": "xmit discards", "port_xmit_wait": "xmit wait"}
"""Column heads (the PMA's PortCounters fields; octets, not the 4-octet words perfquery shows)."""


def page(topo: Topology, title: str) -> str:
    """The live page of ``topo`` (static: the script fills it from ``/events``)."""
    rows = "".join(f'<tr><td>{escape(n.name)}</td><td>{"switch" if n.is_switch else "host"}</td>'
                   f'<td id="ports-{escape(n.name)}"></td></tr>' for n in topo.nodes.values())
    heads = "".join(f"<th>{escape(COUNTER_LABELS.get(c, c))}</th>" for c in ("port", *SHOWN_COUNTERS))
    c = topo.counts()
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>ibemu live: {escape(title)}</title>",
        f"<style>{PAGE_CSS}{SVG_CSS}</style></head><body>",
        f'<h1>ibemu live: {escape(title)} <span id="conn">connecting</span></h1>',
        f"<div>{c.switches} switches, {c.cas} hosts, {c.links} cables; red: a cable with an end down</div>",
        topology_svg(topo),
        '<div class="cols"><div><h2>Ports</h2><div class="scroll"><table><thead><tr><th>node</th><th>kind</th>'
        f'<th>ports (PortState; red: carrier down)</th></tr></thead><tbody>{rows}</tbody></table></div></div>',
        '<div><h2>SM and fabric events</h2><div id="events"></div></div></div>',
        f'<h2>PMA counters</h2><div class="scroll"><table><thead><tr>{heads}</tr></thead>'
        '<tbody id="counters"></tbody></table></div>',
        f"<script>var COUNTERS = {json.dumps(list(SHOWN_COUNTERS))};{PAGE_JS}</script>",
        "</body></html>",
    ]) + "\n"
