"""Node names and interface names.

Every cabled port becomes one end of a veth pair whose interface name is
``ifname(node, port) == f"{node}-{port}"``. Linux limits interface names to 15 characters
(IFNAMSIZ - 1), ports go up to 255 (three digits), so node names are at most 11 characters.
Node names use letters, digits and ``_``; the ``-`` is reserved as the separator, which makes
``ifname`` injective: the name splits back at its last ``-``.
"""

from __future__ import annotations

import re

from ibemu.errors import ConfigError

IFNAME_MAX = 15
MAX_PORT = 255
MAX_NODE_NAME = IFNAME_MAX - 1 - len(str(MAX_PORT))  # 11

NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_]*$"
"""A node name (portable: the scenario JSON Schema says it too), at most ``MAX_NODE_NAME`` long."""
_NAME_RE = re.compile(NAME_PATTERN.removesuffix("$") + r"\Z")


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a node, or None when it can."""
    if not name:
        return "empty node name"
    if len(name) > MAX_NODE_NAME:
        return f"node name {name!r} is {len(name)} characters, at most {MAX_NODE_NAME} fit an interface name"
    if not _NAME_RE.match(name):
        return f"node name {name!r} must start with a letter and use only letters, digits and '_'"
    return None


def check_name(name: str, where: str | None = None) -> str:
    """Return ``name`` if it is a valid node name, else raise ConfigError."""
    problem = name_problem(name)
    if problem:
        raise ConfigError(problem, where)
    return name


def ifname(node: str, port: int) -> str:
    """Interface name of ``node``'s ``port`` (<= 15 characters for any valid name and port)."""
    if not 1 <= port <= MAX_PORT:
        raise ValueError(f"port {port} out of range 1..{MAX_PORT}")
    return f"{node}-{port}"


def split_ifname(name: str) -> tuple[str, int]:
    """Inverse of :func:`ifname`."""
    node, _, port = name.rpartition("-")
    if not node or not port.isdigit():
        raise ValueError(f"not an ibemu interface name: {name!r}")
    return node, int(port)


def sanitize(text: str) -> str:
    """Best effort: turn free text (a NodeDescription word) into a node-name candidate."""
    out = re.sub(r"[^A-Za-z0-9_]+", "_", text).strip("_")
    if out and not out[0].isalpha():
        out = "n" + out
    return out
