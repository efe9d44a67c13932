"""minhop: shortest paths, equal-cost choices balanced by how many LIDs each port carries."""

from __future__ import annotations

from ibemu.sm.routing.core import Job, Layers, State, base_lfts, fill_balanced, minhop_layers
from ibemu.sm.routing.fabric import Fabric


def lids_on(fab: Fabric, w: int) -> list[int]:
    """Every LID that lives on switch ``w``: its endpoints' and its own."""
    own = [fab.sw_lid[w]] if fab.sw_lid[w] else []
    return fab.ca_lids[w] + own


def minhop_tables(fab: Fabric) -> list[Layers | None]:
    return [
        minhop_layers(fab.adj, w) if fab.ca_lids[w] or fab.sw_lid[w] else None
        for w in range(fab.n)
    ]


def route(fab: Fabric, **_opts: object) -> tuple[list[dict[int, int]], State]:
    st = State("minhop", fab, minhop_tables(fab))
    lfts = base_lfts(fab)
    jobs: list[Job] = [
        (lay, w, lids_on(fab, w), -1) for w, lay in enumerate(st.minhop) if lay is not None
    ]
    fill_balanced(st, lfts, jobs)
    return lfts, st
