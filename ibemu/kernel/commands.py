"""Running ``ip`` and ``tc``: argv lists only, batch mode for bulk work, located errors."""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Sequence

from ibemu.errors import IbemuError

log = logging.getLogger(__name__)


class KernelError(IbemuError):
    """A kernel operation failed (the message says which command and why)."""


def _binary(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin:/bin")
    if path is None:
        raise KernelError(f"`{name}` not found: install iproute2 (scripts/setup.sh does)")
    return path


def run(argv: Sequence[str], *, timeout: float = 60.0, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run one command; raise KernelError with its stderr when it fails and ``check``."""
    argv = [_binary(argv[0]), *argv[1:]]
    log.debug("run %s", argv)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise KernelError(f"{' '.join(argv)}: no answer within {timeout} s") from exc
    if check and proc.returncode != 0:
        raise KernelError(f"{' '.join(argv)}: {proc.stderr.strip() or f'exit status {proc.returncode}'}")
    return proc


def batch(tool: str, lines: Sequence[str], *, netns: str | None = None, force: bool = False,
          timeout: float = 120.0) -> list[str]:
    """Run ``ip -batch -`` or ``tc -batch -`` (in ``netns``); returns error lines with -force.

    Without ``force`` the first failing line raises KernelError quoting that line.
    """
    if not lines:
        return []
    argv = [tool]
    if netns:
        argv += ["-n", netns]
    if force:
        argv.append("-force")
    argv += ["-batch", "-"]
    text = "\n".join(lines) + "\n"
    argv = [_binary(tool), *argv[1:]]
    try:
        proc = subprocess.run(argv, input=text, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise KernelError(f"{tool} -batch ({len(lines)} lines): no answer within {timeout} s") from exc
    errors = [e for e in proc.stderr.splitlines() if e.strip()]
    if proc.returncode != 0 and not force:
        raise KernelError(_located(tool, lines, errors, netns))
    return errors


def _located(tool: str, lines: Sequence[str], errors: list[str], netns: str | None) -> str:
    # iproute2 prints "Command failed -:N" naming the failing line.
    where = ""
    for e in errors:
        if "Command failed" in e and ":" in e:
            try:
                n = int(e.rsplit(":", 1)[1])
                where = f" at line {n}: `{lines[n - 1]}`"
            except (ValueError, IndexError):
                pass
    scope = f" in {netns}" if netns else ""
    detail = "; ".join(e for e in errors if "Command failed" not in e) or "failed"
    return f"{tool} -batch{scope}{where}: {detail}"
