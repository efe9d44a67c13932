"""Running unmodified libibumad programs (OpenSM, infiniband-diags) on an emulated host.

``libumad2sim.so`` (Debian ibsim-utils) makes a program send its MADs over the host's MAD
socket instead of /dev/infiniband; the socket lives in the host's namespace, so the program
runs there too. umad2sim writes a fake sysfs into its working directory.

On a dilated run (``ibemu.clock``) the program also gets libfaketime, after libumad2sim in
``LD_PRELOAD``, so its clocks and timeouts run on the run's clock (``ibemu.kernel.faketime``).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ibemu import clock
from ibemu.errors import ConfigError
from ibemu.kernel import faketime, netns
from ibemu.kernel.faketime import SharedStart, preload

UMAD2SIM_GLOBS = (
    "/usr/lib/*/umad2sim/libumad2sim.so",
    "/usr/lib/umad2sim/libumad2sim.so",
    "/usr/lib64/umad2sim/libumad2sim.so",
)


def umad2sim_path() -> str | None:
    for pattern in UMAD2SIM_GLOBS:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


def tool_argv(ns: str, argv: Sequence[str], *, env: dict[str, str] | None = None,
              faketime: SharedStart | None = None) -> list[str]:
    """argv that runs ``argv`` in namespace ``ns`` attached to that host's MAD socket (and on
    ``faketime``'s clock when given)."""
    lib = umad2sim_path()
    if lib is None:
        raise ConfigError("libumad2sim.so not found: install ibsim-utils (scripts/setup.sh does)")
    if shutil.which(argv[0]) is None and not os.path.exists(argv[0]):
        raise ConfigError(f"{argv[0]}: not installed (infiniband-diags / opensm provide the tools)")
    extra = [f"{k}={v}" for k, v in {**(env or {}), **(faketime.env() if faketime else {})}.items()]
    ld_preload = preload(lib, faketime) if faketime else lib
    return netns.exec_argv(ns, ["env", f"LD_PRELOAD={ld_preload}", *extra, *argv])


def scratch_dir(base: Path, node: str) -> Path:
    """Where a tool on ``node`` may write (umad2sim's sys-<pid>/, OpenSM's files)."""
    d = base / "tools" / node
    d.mkdir(parents=True, exist_ok=True)
    return d


def dilated_clock() -> faketime.SharedStart | None:
    """libfaketime's start for a libibumad program on this run's clock; None at dilation 1. A
    dilated run without libfaketime is a ``ConfigError`` (located at ``time.dilation``)."""
    if clock.dilation() == 1:
        return None
    if faketime.library_path() is None:
        raise ConfigError(f"a libibumad program (OpenSM, infiniband-diags) at dilation {clock.dilation():g} runs "
                          f"under libfaketime, which is not installed: {faketime.INSTALL_HINT}", "time.dilation")
    return faketime.create(clock.dilation(), clock.epoch_ns())


def run_tool(ns: str, argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run`` of a libibumad tool in ``ns`` on this run's clock (``kw`` pass through)."""
    shared = dilated_clock()
    try:
        return subprocess.run(tool_argv(ns, argv, faketime=shared), **kw)
    finally:
        if shared is not None:
            shared.remove()
