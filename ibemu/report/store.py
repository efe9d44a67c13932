"""Run results as JSON files (``ibemu run --json FILE``), validated on the way in and out."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ibemu.report.result import ResultError, RunResult, validate

log = logging.getLogger(__name__)


def dumps(result: RunResult | Mapping[str, Any]) -> str:
    """JSON text of ``result`` (indented, keys in schema order); raises :class:`ResultError`."""
    data = result.to_dict() if isinstance(result, RunResult) else dict(result)
    problems = validate(data)
    if problems:
        raise ResultError(problems)
    return json.dumps(data, indent=2, allow_nan=False) + "\n"


def loads(text: str, source: str | None = None) -> RunResult:
    """Parse and validate JSON text; raises :class:`ResultError` with every problem."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ResultError([f"line {e.lineno} column {e.colno}: {e.msg}"], source) from None
    return RunResult.from_dict(data, source)


def dump(result: RunResult | Mapping[str, Any], path: str | Path) -> Path:
    """Write ``result`` to ``path`` (parents created) and return the path."""
    path = Path(path)
    text = dumps(result)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    log.info("wrote run result to %s", path)
    return path


def load(path: str | Path) -> RunResult:
    """Read and validate a result file."""
    path = Path(path)
    return loads(path.read_text(), str(path))
