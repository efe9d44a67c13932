"""Debian's headless Chromium driven over the DevTools protocol, for tests of ibemu's pages.

No WebDriver: Chromium speaks the protocol on a pipe (``--remote-debugging-pipe``: it reads
NUL-terminated JSON commands on fd 3 and writes replies and events on fd 4), so the standard
library is enough. ``Browser.open(url)`` loads a page in a new tab and collects what the page
reports as errors (console ``error`` calls, uncaught exceptions, log entries of level error:
failed loads among them); ``evaluate`` runs an expression in it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
"""What the browser starts with: no GPU, no sandbox (root), nothing that reaches outside."""


class Browser:
    def __init__(self, profile: Path, timeout_s: float = 20.0) -> None:
        assert CHROMIUM is not None
        self.timeout_s = timeout_s
        cmd_r, self._cmd_w = os.pipe()  # we write, Chromium reads (its fd 3)
        self._out_r, out_w = os.pipe()  # Chromium writes (its fd 4), we read
        argv = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-pipe", "about:blank"]
        shell = f'exec "$@" 3<&{cmd_r} 4>&{out_w}'  # bash: fd numbers above 9 (dash takes one digit)
        self.proc = subprocess.Popen(["bash", "-c", shell, "chromium", *argv], pass_fds=(cmd_r, out_w),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        os.close(cmd_r)
        os.close(out_w)
        self._next = 0
        self._replies: dict[int, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.session: str | None = None

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self._out_r, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                with self._cond:
                    self._cond.notify_all()
                return
            buf += chunk
            *msgs, buf = buf.split(b"\0")
            with self._cond:
                for raw in msgs:
                    msg = json.loads(raw)
                    if "id" in msg:
                        self._replies[msg["id"]] = msg
                    else:
                        self.events.append(msg)
                self._cond.notify_all()

    def send(self, method: str, params: dict[str, Any] | None = None, *, session: bool = True) -> dict[str, Any]:
        """One command; its result (an error reply raises)."""
        with self._cond:
            self._next += 1
            n = self._next
        msg: dict[str, Any] = {"id": n, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            while n not in self._replies:
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise TimeoutError(f"chromium did not answer {method}")
                self._cond.wait(left)
            reply = self._replies.pop(n)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return dict(reply.get("result", {}))

    def open(self, url: str) -> None:
        """A new tab at ``url``, once its load event fired."""
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True},
                                 session=False)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable")
        with self._cond:
            start = len(self.events)
        self.send("Page.navigate", {"url": url})
        self.wait_event("Page.loadEventFired", start)

    def wait_event(self, method: str, start: int = 0) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            while True:
                for ev in self.events[start:]:
                    if ev.get("method") == method:
                        return ev
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no {method}")
                self._cond.wait(left)

    def evaluate(self, expression: str) -> Any:
        """The value of ``expression`` in the page (JSON-able; an exception in it raises)."""
        r = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = 10.0, every_s: float = 0.02) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            v = self.evaluate(expression)
            if v:
                return v
            if time.monotonic() > deadline:
                raise TimeoutError(f"never true: {expression}")
            time.sleep(every_s)

    def errors(self) -> list[str]:
        """What the page reported as errors so far."""
        out = []
        with self._cond:
            events = list(self.events)
        for ev in events:
            m, p = ev.get("method"), ev.get("params", {})
            if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append("console: " + " ".join(str(a.get("value", a.get("description"))) for a in p.get("args", [])))
            elif m == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                out.append(f"exception: {d.get('text')} {d.get('exception', {}).get('description', '')}")
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                e = p["entry"]
                out.append(f"log: {e.get('text')} {e.get('url', '')}")
        return out

    def close(self) -> None:
        with contextlib.suppress(TimeoutError, RuntimeError, OSError):
            self.send("Browser.close", session=False)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # the process this helper started, by its handle
            self.proc.wait(5)
        for fd in (self._cmd_w, self._out_r):
            with contextlib.suppress(OSError):
                os.close(fd)
