"""Shared fixtures: paths to ../shared, skips for missing tools or privileges."""

from __future__ import annotations

import os
import shutil
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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="needs root (network namespaces, veth, tc): run with sudo")
    for item in items:
        if "root" in item.keywords:
            item.add_marker(skip)
