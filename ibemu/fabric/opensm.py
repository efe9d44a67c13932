"""Run the unmodified OpenSM (Debian ``opensm``) on an emulated host, every file in a work dir."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from ibemu import clock
from ibemu.errors import IbemuError
from ibemu.fabric import opensm_log
from ibemu.fabric.umad2sim import tool_argv


def opensm_available() -> bool:
    return shutil.which("opensm") is not None or Path("/usr/sbin/opensm").exists()


def start(ns: str, workdir: Path, *, engine: str = "minhop", extra: list[str] | None = None) -> subprocess.Popen[bytes]:
    """OpenSM attached to the MAD socket of the host in ``ns``; log in ``workdir/opensm.log``.

    ``-d2`` flushes the log after each message, so its phases can be read as they happen.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    argv = tool_argv(ns, ["opensm", "-F", "/dev/null", "-f", str(workdir / "opensm.log"), "--dump_files_dir",
                          str(workdir), "-d2", "-s", "0", "-R", engine, *(extra or [])],
                     env={"OSM_TMP_DIR": str(workdir), "OSM_CACHE_DIR": str(workdir)})
    return subprocess.Popen(argv, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_subnet_up(proc: subprocess.Popen[bytes], workdir: Path, timeout_s: float = 60.0, *,
                   started_ns: int | None = None) -> float:
    """Seconds until OpenSM logged SUBNET UP; raises if it exits or takes longer.

    With ``started_ns`` (monotonic, taken just before ``start``): from then to the log's own
    stamp of SUBNET UP, not to when this poll saw it.
    """
    log = workdir / "opensm.log"
    t0 = clock.monotonic()
    while True:
        text = log.read_text(errors="replace") if log.exists() else ""
        if "SUBNET UP" in text:
            if started_ns is not None:
                up = next((e["t_ns"] for e in opensm_log.parse(text.splitlines()) if e["kind"] == "subnet_up"), None)
                if up is not None:
                    return max(0.0, (up - started_ns) / 1e9)
            return clock.monotonic() - t0
        if proc.poll() is not None:
            raise IbemuError(f"opensm exited ({proc.returncode}) before SUBNET UP:\n{text[-2000:]}")
        if clock.monotonic() - t0 > timeout_s:
            raise IbemuError(f"no SUBNET UP from opensm in {timeout_s:.0f} s:\n{text[-2000:]}")
        time.sleep(0.05)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 10 s (any SM process: OpenSM or ibemu's)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
