"""YAML with locations: compose a file into nodes and read typed values off them.

:class:`Reader` walks the node tree produced by ``yaml.compose`` and collects every problem
as ``file:line key.path: what was expected`` instead of stopping at the first, so one run
of ``ibemu validate`` reports everything wrong with a scenario.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from ibemu.errors import ConfigError, did_you_mean

T = TypeVar("T")

_constructor = yaml.SafeLoader("")


class ScenarioError(ConfigError):
    """A scenario is invalid; ``problems`` lists every located problem, in file order."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


def compose(text: str, source: str) -> yaml.Node | None:
    """The YAML node tree of ``text`` (None for an empty document); syntax errors located."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        what = exc.problem or "invalid YAML"
        raise ScenarioError([f"{source}:{line}: YAML syntax error: {what}"]) from None
    except yaml.YAMLError as exc:
        raise ScenarioError([f"{source}:1: YAML error: {exc}"]) from None
    _check_tags(root, source)
    return root


def _check_tags(root: yaml.Node | None, source: str) -> None:
    """Refuse (located) a node with a tag safe YAML cannot construct (``!!python/object``,
    ``!custom``): reading its value later would raise yaml's own error, unlocated."""
    known = yaml.SafeLoader.yaml_constructors
    stack = [root] if root is not None else []
    while stack:
        node = stack.pop()
        if node.tag not in known:
            raise ScenarioError([f"{source}:{line_of(node)}: unsupported YAML tag {node.tag!r}"])
        if isinstance(node, yaml.MappingNode):
            stack.extend(n for pair in node.value for n in pair)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)


def line_of(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def scalar(node: yaml.Node) -> Any:
    """The Python value of a scalar node (int, float, bool, None or str)."""
    return _constructor.construct_object(node, deep=True)


def describe(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    value = scalar(node)
    if value is None:
        return "nothing (null)"
    return repr(value)


SIZE_PATTERN = r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KkMmGg][Ii]?[Bb]?|[Bb])?\s*$"
"""A size as text (portable: the scenario JSON Schema says it too): ``64KiB``, ``1.5M``, ``4096``."""
_SIZE_RE = re.compile(SIZE_PATTERN.removesuffix("$") + r"\Z")
_SIZE_UNITS = {"": 1, "b": 1, "k": 1024, "kib": 1024, "ki": 1024, "kb": 1000}
_SIZE_UNITS |= {"m": 1024**2, "mib": 1024**2, "mi": 1024**2, "mb": 1000**2}
_SIZE_UNITS |= {"g": 1024**3, "gib": 1024**3, "gi": 1024**3, "gb": 1000**3}


def parse_size(value: Any) -> int | None:
    """Bytes from ``4096``, ``"64K"``/``"64KiB"`` (1024s) or ``"64KB"`` (1000s); None if not a size."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m:
            n = float(m.group(1)) * _SIZE_UNITS[(m.group(2) or "").lower()]
            if n.is_integer():
                return int(n)
    return None


class Reader:
    """Typed access to YAML nodes that records located problems in ``problems``."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.problems: list[tuple[int, str]] = []

    def error(self, node: yaml.Node | int, path: str, message: str) -> None:
        line = node if isinstance(node, int) else line_of(node)
        where = f"{self.source}:{line} {path}" if path else f"{self.source}:{line}"
        self.problems.append((line, f"{where}: {message}"))

    def sorted_problems(self) -> list[str]:
        return [msg for _, msg in sorted(self.problems, key=lambda p: p[0])]

    # --- containers -----------------------------------------------------------------------

    def mapping(
        self, node: yaml.Node, path: str, allowed: Iterable[str], required: Iterable[str] = ()
    ) -> dict[str, tuple[yaml.Node, yaml.Node]] | None:
        """``{key: (key node, value node)}``; unknown, duplicate and missing keys reported."""
        if not isinstance(node, yaml.MappingNode):
            self.error(node, path, f"expected a mapping, got {describe(node)}")
            return None
        allowed = list(allowed)
        out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for knode, vnode in node.value:
            key = scalar(knode) if isinstance(knode, yaml.ScalarNode) else None
            kpath = f"{path}.{key}" if path else str(key)
            if not isinstance(key, str):
                self.error(knode, path, f"keys must be names, got {describe(knode)}")
                continue
            if key in out:
                self.error(knode, kpath, f"duplicate key (first at line {line_of(out[key][0])})")
                continue
            if key not in allowed:
                self.error(
                    knode,
                    kpath,
                    f"unknown key{did_you_mean(key, allowed)}; expected one of: {', '.join(allowed)}",
                )
                continue
            out[key] = (knode, vnode)
        for key in required:
            if key not in out:
                self.error(node, path, f"missing required key {key!r}")
        return out

    def sequence(self, node: yaml.Node, path: str) -> list[yaml.Node] | None:
        if not isinstance(node, yaml.SequenceNode):
            self.error(node, path, f"expected a list, got {describe(node)}")
            return None
        return list(node.value)

    # --- scalars --------------------------------------------------------------------------

    def _scalar(self, node: yaml.Node, path: str, expected: str) -> tuple[bool, Any]:
        if not isinstance(node, yaml.ScalarNode):
            self.error(node, path, f"expected {expected}, got {describe(node)}")
            return False, None
        return True, scalar(node)

    def string(self, node: yaml.Node, path: str, expected: str = "a string") -> str | None:
        ok, v = self._scalar(node, path, expected)
        if not ok:
            return None
        if not isinstance(v, str) or not v:
            self.error(node, path, f"expected {expected}, got {describe(node)}")
            return None
        return v

    def integer(
        self, node: yaml.Node, path: str, lo: int | None = None, hi: int | None = None
    ) -> int | None:
        expected = _bounds("an integer", lo, hi)
        ok, v = self._scalar(node, path, expected)
        if not ok:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            self.error(node, path, f"expected {expected}, got {describe(node)}")
            return None
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            self.error(node, path, f"expected {expected}, got {v}")
            return None
        return v

    def number(
        self,
        node: yaml.Node,
        path: str,
        lo: float | None = None,
        hi: float | None = None,
        lo_open: bool = False,
    ) -> float | None:
        expected = _bounds("a number", lo, hi, lo_open)
        ok, v = self._scalar(node, path, expected)
        if not ok:
            return None
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            self.error(node, path, f"expected {expected}, got {describe(node)}")
            return None
        if (lo is not None and (v < lo or (lo_open and v == lo))) or (hi is not None and v > hi):
            self.error(node, path, f"expected {expected}, got {v:g}")
            return None
        return float(v)

    def boolean(self, node: yaml.Node, path: str) -> bool | None:
        ok, v = self._scalar(node, path, "true or false")
        if not ok:
            return None
        if not isinstance(v, bool):
            self.error(node, path, f"expected true or false, got {describe(node)}")
            return None
        return v

    def choice(self, node: yaml.Node, path: str, choices: Iterable[str]) -> str | None:
        choices = list(choices)
        expected = "one of " + ", ".join(choices)
        ok, v = self._scalar(node, path, expected)
        if not ok:
            return None
        if v not in choices:
            hint = did_you_mean(v, choices) if isinstance(v, str) else ""
            self.error(node, path, f"expected {expected}, got {describe(node)}{hint}")
            return None
        return str(v)

    def size(self, node: yaml.Node, path: str, lo: int = 1, hi: int = 2**31) -> int | None:
        expected = "a size in bytes like 4096, '64KiB' or '1MiB'"
        ok, v = self._scalar(node, path, expected)
        if not ok:
            return None
        n = parse_size(v)
        if n is None:
            self.error(node, path, f"expected {expected}, got {describe(node)}")
            return None
        if not lo <= n <= hi:
            self.error(node, path, f"expected a size from {lo} to {hi} bytes, got {n}")
            return None
        return n

    def convert(
        self, node: yaml.Node, path: str, func: Callable[[Any], T], expected: str
    ) -> T | None:
        """Apply ``func`` to a scalar; a ConfigError/ValueError from it becomes a problem."""
        ok, v = self._scalar(node, path, expected)
        if not ok:
            return None
        try:
            return func(v)
        except ConfigError as exc:
            self.error(node, path, str(exc))
        except ValueError:
            self.error(node, path, f"expected {expected}, got {describe(node)}")
        return None


def _bounds(what: str, lo: float | None, hi: float | None, lo_open: bool = False) -> str:
    def fmt(x: float) -> str:
        return f"{x:g}"

    if lo is not None and hi is not None:
        return (
            f"{what} from {fmt(lo)} to {fmt(hi)}"
            if not lo_open
            else f"{what} > {fmt(lo)} and <= {fmt(hi)}"
        )
    if lo is not None:
        return f"{what} > {fmt(lo)}" if lo_open else f"{what} >= {fmt(lo)}"
    if hi is not None:
        return f"{what} <= {fmt(hi)}"
    return what


def read_text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read scenario: {exc.strerror or exc}", str(path)) from None
