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


@pytest.fixture
def run_ids(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The run ids this test's runs take, in order (to check each was torn down)."""
    ids: list[str] = []
    new_run_id = ownership.new_run_id

    def recorded() -> str:
        ids.append(new_run_id())
        return ids[-1]

    monkeypatch.setattr(ownership, "new_run_id", recorded)
    return ids
