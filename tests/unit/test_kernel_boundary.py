"""The kernel boundary, checked on the source (AST only, no root, nothing imported).

``ibemu/kernel/`` is the only code that touches the kernel: outside it, no module imports
ctypes, fcntl or pyroute2, creates a netlink, packet or raw socket, or names a path under
/proc or /sys. And ``ibemu/kernel/`` reaches up to nothing: it imports only itself,
``ibemu.wire``, ``ibemu.errors``, ``ibemu.events`` and ``ibemu.clock`` (the bottom layer: kernel
stamps are taken on the emulated clock), and the pure layers just below it that the live link
model's IO needs (``ibemu.physics``, ``ibemu.lagmon``: ``kernel.linkio``, shared by both user
datapaths).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import ibemu

ROOT = Path(ibemu.__file__).resolve().parent
KERNEL_ONLY_MODULES = frozenset({"ctypes", "fcntl", "pyroute2"})
KERNEL_SOCKET_NAMES = frozenset({"AF_NETLINK", "AF_PACKET", "SOCK_RAW"})
KERNEL_FAMILIES = frozenset({16, 17})  # AF_NETLINK, AF_PACKET
SOCK_RAW = 3
KERNEL_PATHS = ("/proc", "/sys")
KERNEL_MAY_IMPORT = frozenset({"kernel", "wire", "errors", "events", "clock", "physics", "lagmon"})


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in ``tree`` (relative ones resolved;
    ``from pkg import name`` yields ``pkg.name``, which may be a module)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[:len(package) - (node.level - 1)]
                base = ".".join([*package, *([base] if base else [])])
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}" if base else alias.name


def _is_socket_constructor(func: ast.expr) -> bool:
    """``socket.socket``, ``trio.socket.socket`` or a bare ``socket`` (``from socket import socket``)."""
    if isinstance(func, ast.Name):
        return func.id == "socket"
    return isinstance(func, ast.Attribute) and func.attr == "socket"


def _kernel_socket_args(call: ast.Call) -> bool:
    args = [*call.args[:2], *(k.value for k in call.keywords if k.arg in ("family", "type"))]
    for arg in args:
        for sub in ast.walk(arg):
            if isinstance(sub, ast.Attribute) and sub.attr in KERNEL_SOCKET_NAMES:
                return True
            if isinstance(sub, ast.Name) and sub.id in KERNEL_SOCKET_NAMES:
                return True
    if call.args and isinstance(call.args[0], ast.Constant) and call.args[0].value in KERNEL_FAMILIES:
        return True
    kind = call.args[1] if len(call.args) > 1 else None
    return isinstance(kind, ast.Constant) and isinstance(kind.value, int) and kind.value & 0xF == SOCK_RAW


def _kernel_path(node: ast.AST) -> bool:
    """A string (or the start of an f-string) naming /proc or /sys or a path under them."""
    if isinstance(node, ast.JoinedStr):
        node = node.values[0] if node.values else node
    if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
        return False
    return any(node.value == p or node.value.startswith(p + "/") for p in KERNEL_PATHS)


def violations(source: str, module: str, *, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, what) of each boundary crossing in ``source``, the text of module ``module``."""
    tree = ast.parse(source)
    found: list[tuple[int, str]] = []
    in_kernel = module == "ibemu.kernel" or module.startswith("ibemu.kernel.")
    for line, name in _imported(tree, module, is_package):
        top = name.split(".")[0]
        if not in_kernel and top in KERNEL_ONLY_MODULES:
            found.append((line, f"imports {name} (only ibemu.kernel may)"))
        parts = name.split(".")
        if in_kernel and parts[0] == "ibemu" and len(parts) > 1 and parts[1] not in KERNEL_MAY_IMPORT:
            found.append((line, f"ibemu.kernel imports {name} (a layer above it)"))
    if in_kernel:
        return sorted(found)
    joined_parts = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _is_socket_constructor(node.func) and _kernel_socket_args(node):
            found.append((node.lineno, "creates a netlink, packet or raw socket (only ibemu.kernel may)"))
        elif id(node) not in joined_parts and _kernel_path(node):
            found.append((node.lineno, "names a path under /proc or /sys (only ibemu.kernel may)"))
    return sorted(found)


def test_only_the_kernel_package_touches_the_kernel_and_it_reaches_up_to_nothing() -> None:
    report: list[str] = []
    modules = sorted(ROOT.rglob("*.py"))
    assert len(modules) > 50 and (ROOT / "kernel" / "netns.py") in modules
    for path in modules:
        for line, what in violations(path.read_text(), _module_name(path), is_package=path.name == "__init__.py"):
            report.append(f"{path.relative_to(ROOT.parent)}:{line}: {what}")
    assert not report, "kernel boundary crossed:\n" + "\n".join(report)


def test_the_check_sees_each_kind_of_crossing() -> None:
    outside = '''\
"""A module that reads /proc/self/status in its docstring only: fine."""
import ctypes
import socket
from fcntl import ioctl
from pyroute2 import IPRoute
import trio

def f(ns: str) -> None:
    a = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, 0)
    b = trio.socket.socket(family=socket.AF_PACKET)
    c = socket.socket(socket.AF_INET, socket.SOCK_RAW)
    d = socket.socket(16, 3)
    e = open("/proc/sys/fs/nr_open")
    g = open(f"/sys/class/net/{ns}/carrier")
    ok = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM), trio.socket.socket(socket.AF_UNIX)
'''
    assert [line for line, _ in violations(outside, "ibemu.roce.example")] == [2, 4, 5, 9, 10, 11, 12, 13, 14]
    assert violations(outside, "ibemu.kernel.example") == []  # the kernel may

    kernel = '''\
from ibemu.kernel import netns
from ibemu.wire.roce import EMULATED_NET
from ibemu.errors import ConfigError
from ibemu.roce.routes import NextHops
import ibemu.fabric.plan
from .. import sm
from . import netlink
'''
    found = violations(kernel, "ibemu.kernel.example")
    assert [(line, what.split()[2]) for line, what in found] == [
        (4, "ibemu.roce.routes.NextHops"), (5, "ibemu.fabric.plan"), (6, "ibemu.sm")]
    assert violations(kernel, "ibemu.kernel", is_package=True)[-1][0] == 6
