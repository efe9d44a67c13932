"""Limits the running kernel sets on a process (read from /proc/sys)."""

from __future__ import annotations

NR_OPEN = "/proc/sys/fs/nr_open"


def nr_open() -> int | None:
    """``fs.nr_open``: the most descriptors a process's limit may be raised to (None if unreadable)."""
    try:
        with open(NR_OPEN) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None
