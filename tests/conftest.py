"""Shared fixtures: paths to ../shared, skips for missing tools or privileges."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("IBEMU_SHARED", PROJECT_ROOT.parent / "shared"))
HW_CAPTURE = SHARED / "fixtures" / "infiniband-hw-sample.pcap"


@pytest.fixture
def hw_capture() -> Path:
    if not HW_CAPTURE.is_file():
        pytest.skip(f"hardware capture not found at {HW_CAPTURE} (../shared absent; set IBEMU_SHARED)")
    return HW_CAPTURE


@pytest.fixture
def tshark() -> str:
    path = shutil.which("tshark")
    if path is None:
        pytest.skip("tshark not installed (scripts/setup.sh installs it when run as root)")
    return path


# Run in a child process, so this one never leaves its namespace: a fresh network namespace
# (what `ip netns add` needs) with a veth pair inside it; both vanish when the child exits.
_NETNS_PROBE = """
import ctypes, os, shutil, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x40000000) != 0:  # CLONE_NEWNET
    sys.exit("unshare(CLONE_NEWNET) failed: " + os.strerror(ctypes.get_errno()))
ip = shutil.which("ip")
if ip is None:
    sys.exit("iproute2's ip command is missing (scripts/setup.sh installs it as root)")
r = subprocess.run([ip, "link", "add", "probe0", "type", "veth", "peer", "name", "probe1"],
                   capture_output=True, text=True)
if r.returncode:
    sys.exit("cannot create a veth pair: " + (r.stderr.strip() or f"ip exited {r.returncode}"))
"""


def netns_unavailable() -> str | None:
    """Why root tests cannot build namespaces here (``None`` when they can)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth, tc): run with sudo"
    try:
        r = subprocess.run(
            [sys.executable, "-c", _NETNS_PROBE], capture_output=True, text=True, timeout=20
        )
    except subprocess.TimeoutExpired:
        return "needs network namespaces: the namespace probe timed out"
    if r.returncode == 0:
        return None
    why = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit status {r.returncode}"
    return (
        f"needs network namespaces, which this machine refuses ({why}); "
        "in a container, run it with --privileged"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any("root" in item.keywords for item in items):
        return  # no probe for runs without root tests
    reason = netns_unavailable()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "root" in item.keywords:
            item.add_marker(skip)


def pytest_configure(config: object) -> None:
    """A SIGTERM (a CI timeout, `timeout`) ends the run as Ctrl-C does, so fixtures tear down
    what they built (namespaces, fabric managers, traffic workers) instead of leaking it."""
    import signal

    def _interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _interrupt)
