"""Subnet graphs (LIDs assigned) of generated topologies, for the routing tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ibemu.sm.graph import SubnetGraph
from ibemu.testing.fromtopo import graph_of
from ibemu.topo import generate

TOPOLOGIES: dict[str, tuple[str, dict[str, Any]]] = {
    "fat-tree-k4": ("fat-tree", {"k": 4}),
    "fat-tree-k8": ("fat-tree", {"k": 8}),
    "fat-tree-2l": ("fat-tree", {"k": 6, "levels": 2}),
    "leaf-spine": ("leaf-spine", {"leaves": 6, "spines": 3, "hosts_per_leaf": 3}),
    "torus-4x4": ("torus", {"dims": (4, 4)}),
    "torus-3x3x3": ("torus", {"dims": (3, 3, 3)}),
    "mesh-4x4": ("mesh", {"dims": (4, 4)}),
    "mesh-3x4x2": ("mesh", {"dims": (3, 4, 2), "hosts_per_switch": 2}),
    "ring": ("ring", {"switches": 6, "hosts_per_switch": 2}),
    "dragonfly": ("dragonfly", {}),
}


@pytest.fixture
def subnet() -> Callable[..., SubnetGraph]:
    """``subnet("fat-tree", k=4)``: a fresh SubnetGraph of a generated topology."""

    def make(name: str, **params: Any) -> SubnetGraph:
        return graph_of(generate(name, **params))

    return make
