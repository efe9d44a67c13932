"""Fixtures for root tests: an isolated state directory and a run that is always torn down."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ibemu.kernel import ownership


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setattr(ownership, "STATE_DIR", d)
    return d


@pytest.fixture
def run_state(state_dir: Path) -> Iterator[ownership.RunState]:
    state = ownership.RunState(ownership.new_run_id(), scenario="pytest")
    state.save()
    try:
        yield state
    finally:
        problems = ownership.teardown(state)
        assert not problems, problems
