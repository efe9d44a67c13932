"""Build a planned fabric in the kernel (and take it down), owned by a run.

Order: record the namespaces in the run state (write-ahead), create them, create all cables,
bring every port up, give each switch its forwarding plane (kernel datapath: the LFT in a BPF
map behind one tc classifier, ``kernel.lft_map``; u32 filters, ``kernel.tc``, on a kernel
that refuses the program, or with IBEMU_LFT=tc). Any failure
tears down what was built before the error propagates: nothing half-built is left.
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ibemu.fabric.plan import FabricPlan
from ibemu.kernel import lft_map, netns, ownership
from ibemu.kernel.lft_map import MapLft
from ibemu.kernel.links import LinkControl, create_cables
from ibemu.kernel.tc import KernelLft

log = logging.getLogger(__name__)


@dataclass
class BuiltFabric:
    """Kernel objects of a live fabric, with the time each build phase took."""

    plan: FabricPlan
    state: ownership.RunState
    links: LinkControl
    lfts: dict[str, MapLft | KernelLft] = field(default_factory=dict)
    phases_s: dict[str, float] = field(default_factory=dict)

    def close(self) -> None:
        """Close the sockets held on the fabric (the kernel objects stay)."""
        for lft in self.lfts.values():
            lft.close()
        self.links.close()


def build(plan: FabricPlan, state: ownership.RunState, *, datapath: str = "kernel") -> BuiltFabric:
    if datapath not in ("kernel", "user"):
        raise ValueError(f"datapath must be kernel or user, not {datapath!r}")
    netns.check_free(plan.namespaces)  # before claiming: a clash must not make them "ours"
    fabric = BuiltFabric(plan, state, LinkControl())
    t0 = time.perf_counter()
    try:
        state.claim_namespaces(plan.namespaces)
        netns.create(plan.namespaces)
        netns.quiet_ipv6(plan.namespaces)
        t1 = time.perf_counter()
        create_cables(plan.cables)
        t2 = time.perf_counter()
        for node in plan.nodes.values():
            fabric.links.all_up(node.ns, (p.ifname for p in node.ports.values()))
        fabric.links.wait_carrier({n.ns: [p.ifname for p in n.ports.values()] for n in plan.nodes.values()})
        t3 = time.perf_counter()
        if datapath == "kernel":
            switches = [n for n in plan.switches() if n.ports]
            refused = lft_map.unsupported() if switches else None
            if os.environ.get("IBEMU_LFT") == "tc":
                refused = "IBEMU_LFT=tc"
            if refused is not None:
                log.warning("LFTs as tc u32 filters: this kernel refuses the BPF LFT classifier (%s)", refused)
            lft_class = KernelLft if refused is not None else MapLft
            for sw in switches:
                fabric.lfts[sw.name] = lft_class(sw.ns, {p: pp.ifname for p, pp in sw.ports.items()})
            with ThreadPoolExecutor(max_workers=4) as pool:
                list(pool.map(lambda lft: lft.setup(), fabric.lfts.values()))
        t4 = time.perf_counter()
    except BaseException:
        log.error("fabric build failed: tearing down what was built")
        fabric.close()
        ownership.teardown(state)
        raise
    fabric.phases_s = {"namespaces": t1 - t0, "cables": t2 - t1, "ports_up": t3 - t2, "tc": t4 - t3}
    state.status = "built"
    state.info["datapath"] = datapath
    state.save()
    log.info("fabric %s built in %.2f s %s", plan.run_id, t4 - t0, fabric.phases_s)
    return fabric


def teardown(fabric: BuiltFabric) -> list[str]:
    fabric.close()
    return ownership.teardown(fabric.state)
