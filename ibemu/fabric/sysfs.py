"""A per-host ``/sys/class/infiniband`` tree of a live fabric, as the kernel's ib_core writes it.

``RUN/sysfs/<node>/class/infiniband/ibemu0/...`` holds, for every node, the device files
(``node_guid``, ``sys_image_guid``, ``node_type``, ``node_desc``, ``fw_ver``, ``hca_type``,
``board_id``) and per port ``ports/<n>/``: ``state`` ("4: ACTIVE"), ``phys_state`` ("5: LinkUp"),
``rate`` ("100 Gb/sec (4X EDR)"), ``lid``, ``sm_lid``, ``sm_sl``, ``lid_mask_count``, ``cap_mask``,
``link_layer``, ``gids/0``, ``pkeys/0``, ``counters/<name>`` and ``hw_counters/<name>``, in the
formats of drivers/infiniband/core/sysfs.c. Tools that take a sysfs root (node_exporter's
``--path.sysfs RUN/sysfs/<node>``) read it as they read a real host's.

``node_tree`` is pure: the files of one device agent as ``{relative path: content}``.
``TreeWriter`` writes what changed, each file to a temporary name and renamed over the old one
(a reader never sees a partial file). ``serve`` runs in the agent host's process and thread
(the agents are not thread-safe): every ``PERIOD_S`` real seconds, and at once after a port changes state
(``AgentHost.port_listeners``), it refreshes the kernel-carried ports' counters
(``PortCounters.follow_link``, as a PMA query does), builds the trees and hands the writing to
a worker thread. The tree goes when the fabric does (``FabricRuntime.running``).

Where this differs from a real host's sysfs:

- Every device is named ``ibemu0`` (a real host has ``mlx5_0``...), whatever its node.
- A switch has only ``ports/0``, as the kernel makes it for a switch device (its external
  ports have no directory); its counters are port 0's (management) PMA counters.
- The counters are the PMA's extended set (our PMA has ``CapabilityMask.ExtendedWidth``,
  so ib_core shows 64-bit ``port_xmit_data``... and the unicast/multicast packet counters);
  ``port_xmit_data``/``port_rcv_data`` are in 4-octet words, as the kernel reports them.
  The error counters saturate at their PortCounters field width, as the PMA's.
- ``hw_counters`` is driver-specific on a real host; ibemu's "driver" has ``lifespan`` (ms,
  ib_core's default) and ``qp1_dropped`` (the PMA's QP1Dropped, which ib_core's ``counters``
  does not show).
- Files are regular files rewritten in place, not attributes read on demand: a reader sees
  the state of the last write (at most ``PERIOD_S`` old, or longer on a large fabric: the
  period grows so that refreshing takes at most 1/``MAX_SHARE`` of the agents' thread).
- The ``device`` link, ``uevent``, ``gid_attrs``, ``power`` and sysfs permissions are absent.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from ibemu import __version__, clock
from ibemu.agents.counters import BASIC_FIELDS, PortCounters
from ibemu.agents.port import Port

if TYPE_CHECKING:
    from ibemu.fabric.agenthost import AgentHost

log = logging.getLogger(__name__)

DEVICE = "ibemu0"
"""The device name of every node's HCA (or switch) in its tree."""
PERIOD_S = 0.5
MIN_GAP_S = 0.05
"""The least time between two passes (more after an expensive one: 5 times its cost)."""
MAX_SHARE = 20
"""A refresh pass takes at most 1/MAX_SHARE of the period (the period grows on a large fabric)."""

STATE_NAMES = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
PHYS_NAMES = {1: "Sleep", 2: "Polling", 3: "Disabled", 4: "PortConfigurationTraining", 5: "LinkUp",
              6: "LinkErrorRecovery", 7: "Phy Test"}
# ib_core's per-lane speed in 0.1 Gb/s and the name it prints after the width (SDR: none)
SPEEDS = {"SDR": (25, ""), "DDR": (50, " DDR"), "QDR": (100, " QDR"), "FDR": (140, " FDR"),
          "EDR": (250, " EDR"), "HDR": (500, " HDR"), "NDR": (1000, " NDR")}
_WIDTHS = {f[0]: f[2] for f in BASIC_FIELDS}
# ib_core's counters/ file -> PortCounters attribute (the error counters saturate at their width)
ERROR_FILES = {
    "symbol_error": "symbol_error_counter",
    "link_error_recovery": "link_error_recovery_counter",
    "link_downed": "link_downed_counter",
    "port_rcv_errors": "port_rcv_errors",
    "port_rcv_remote_physical_errors": "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors": "port_rcv_switch_relay_errors",
    "port_xmit_discards": "port_xmit_discards",
    "port_xmit_constraint_errors": "port_xmit_constraint_errors",
    "port_rcv_constraint_errors": "port_rcv_constraint_errors",
    "local_link_integrity_errors": "local_link_integrity_errors",
    "excessive_buffer_overrun_errors": "excessive_buffer_overrun_errors",
    "VL15_dropped": "vl15_dropped",
}


def rate_text(width: int, speed: str) -> str:
    """``rate`` as ib_core prints it: "100 Gb/sec (4X EDR)", "2.5 Gb/sec (1X)"."""
    per_lane, name = SPEEDS[speed]
    rate = width * per_lane
    return f"{rate // 10}{'.5' if rate % 10 else ''} Gb/sec ({width}X{name})"


def rate_gbps(width: int, speed: str) -> float:
    return width * SPEEDS[speed][0] / 10


def guid_text(guid: int) -> str:
    """A GUID as ib_core prints it: "0002:c903:0000:0001"."""
    h = f"{guid:016x}"
    return ":".join(h[i:i + 4] for i in range(0, 16, 4))


def counter_files(pc: PortCounters) -> dict[str, str]:
    """``counters/``: the extended set's data and packet counters, the error counters."""
    out = {name: str(min(getattr(pc, attr), (1 << _WIDTHS[attr]) - 1)) for name, attr in ERROR_FILES.items()}
    out.update({
        "port_xmit_data": str(pc.xmit_octets // 4), "port_rcv_data": str(pc.rcv_octets // 4),
        "port_xmit_packets": str(pc.xmit_pkts), "port_rcv_packets": str(pc.rcv_pkts),
        "unicast_xmit_packets": str(pc.xmit_pkts - pc.multicast_xmit_pkts),
        "unicast_rcv_packets": str(pc.rcv_pkts - pc.multicast_rcv_pkts),
        "multicast_xmit_packets": str(pc.multicast_xmit_pkts),
        "multicast_rcv_packets": str(pc.multicast_rcv_pkts),
        "port_xmit_wait": str(min(pc.port_xmit_wait, 0xFFFFFFFF)),
    })
    return out


def port_files(p: Port, *, lid: int, sm_lid: int, lmc: int, sm_sl: int, gid_prefix: int,
               port_guid: int) -> dict[str, str]:
    """``ports/<n>/``: state, rate, addresses and counters of one port."""
    out = {
        "state": f"{int(p.state)}: {STATE_NAMES.get(int(p.state), 'UNKNOWN')}\n",
        "phys_state": f"{int(p.phys)}: {PHYS_NAMES.get(int(p.phys), '<unknown>')}\n",
        "rate": rate_text(p.width, p.speed) + "\n",
        "lid": f"0x{lid:x}\n",
        "sm_lid": f"0x{sm_lid:x}\n",
        "sm_sl": f"{sm_sl}\n",
        "lid_mask_count": f"{lmc}\n",
        "cap_mask": f"0x{p.capability_mask:08x}\n",
        "link_layer": "InfiniBand\n",
        "gids/0": f"{guid_text(gid_prefix)}:{guid_text(port_guid)}\n",
        "pkeys/0": f"0x{(p.pkeys[0] if p.pkeys else 0xFFFF):04x}\n",
        "hw_counters/lifespan": "10\n",
        "hw_counters/qp1_dropped": f"{p.counters.qp1_dropped}\n",
    }
    out.update({f"counters/{k}": v + "\n" for k, v in counter_files(p.counters).items()})
    return out


def node_tree(agent: Any) -> dict[str, str]:
    """Every file of one device agent's tree (``ibemu.agents.device.DeviceAgent``), paths
    relative to its sysfs root (``class/infiniband/ibemu0/...``)."""
    base = f"class/infiniband/{DEVICE}"
    switch = bool(agent.IS_SWITCH)
    out = {
        f"{base}/node_guid": guid_text(agent.node_guid) + "\n",
        f"{base}/sys_image_guid": guid_text(agent.system_image_guid) + "\n",
        f"{base}/node_type": ("2: switch" if switch else "1: CA") + "\n",
        f"{base}/node_desc": agent.description + "\n",
        f"{base}/fw_ver": f"{agent.revision >> 16}.{(agent.revision >> 8) & 0xFF}.{agent.revision & 0xFF}\n",
        f"{base}/hca_type": f"MT{agent.device_id}\n",
        f"{base}/board_id": f"IBEMU_{agent.vendor_id:06X}_{agent.device_id:04X}_{__version__}\n",
    }
    nums = [0] if switch else sorted(n for n in agent.ports if n)
    addr0 = agent.ports.get(0) if switch else None
    for num in nums:
        p: Port = agent.ports[num]
        a = addr0 or p  # a switch's LID and SM LID are port 0's
        files = port_files(p, lid=a.lid, sm_lid=a.master_sm_lid, lmc=a.lmc, sm_sl=a.master_sm_sl,
                           gid_prefix=a.gid_prefix, port_guid=agent.port_guid(num))
        out.update({f"{base}/ports/{num}/{k}": v for k, v in files.items()})
    return out


class TreeWriter:
    """Writes trees under ``root`` (``root/<node>/<relative path>``): only files whose content
    changed since its last write, each through a rename (blocking; a worker thread's job)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._last: dict[str, str] = {}
        self.files_written = 0

    def write(self, trees: Mapping[str, Mapping[str, str]]) -> int:
        n = 0
        for node, files in trees.items():
            for rel, content in files.items():
                key = f"{node}/{rel}"
                if self._last.get(key) == content:
                    continue
                path = self.root / key
                tmp = path.with_name(f".{path.name}.tmp")
                try:
                    tmp.write_text(content)
                except FileNotFoundError:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    tmp.write_text(content)
                os.replace(tmp, path)
                self._last[key] = content
                n += 1
        self.files_written += n
        return n

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        self._last.clear()


def refresh_link_counters(host: AgentHost, names: Iterable[str] | None = None) -> None:
    """Bring the kernel-carried ports' packet and octet counters up to date, as a PMA query
    does (``AgentHost._follow_links``). Blocking (netlink); on the agents' thread."""
    for name in host.nodes if names is None else names:
        rt = host.nodes[name]
        refresh = getattr(rt.agent, "link_counters", None)
        if refresh is not None and rt.powered:
            refresh(list(rt.plan.ports))


CHUNK = 16
"""Nodes refreshed between two checkpoints of the agents' loop in a metrics snapshot
(``fabric.metrics``)."""
SLICE_S = 0.001
"""The agents' loop gets a checkpoint once a pass has worked this long (real time) since the
last one: a pass over a k=4 fat-tree's 36 nodes in checkpoints of 16 nodes held the loop 2-6
ms at a time, twice a second (timed by hand), which alone put the agent host's p99 lag over the
fidelity monitor's 2 ms of real time (each node costs a netlink dump for its kernel-carried
ports and ~40 files' text)."""


async def trees(host: AgentHost, *, slice_s: float = SLICE_S) -> tuple[dict[str, dict[str, str]], float]:
    """Every node's tree, by node name, its kernel-carried counters refreshed first; and the
    seconds this took on the agents' thread (checkpoints, every ``slice_s`` of work, excluded)."""
    out: dict[str, dict[str, str]] = {}
    busy = 0.0
    t0 = time.perf_counter()
    for name in list(host.nodes):
        rt = host.nodes.get(name)
        if rt is None:
            continue
        refresh_link_counters(host, [name])
        agent = rt.agent
        if hasattr(agent, "ports"):
            out[name] = node_tree(agent)
        t = time.perf_counter()
        if t - t0 >= slice_s:
            busy += t - t0
            await trio.lowlevel.checkpoint()
            t0 = time.perf_counter()
    busy += time.perf_counter() - t0
    return out, busy


async def serve(host: AgentHost, root: Path, *, period_s: float = PERIOD_S,
                task_status: trio.TaskStatus[TreeWriter] = trio.TASK_STATUS_IGNORED) -> None:
    """Keep ``root`` up to date until cancelled, then remove it (see the module docstring)."""
    writer = TreeWriter(root)
    changed = trio.Event()

    def on_change(_node: str, _port: int) -> None:
        changed.set()

    host.port_listeners.append(on_change)
    period = period_s
    try:
        started = False
        while True:
            built, cost = await trees(host)
            period = max(period_s, MAX_SHARE * cost)
            await trio.to_thread.run_sync(writer.write, built)
            if not started:
                log.info("sysfs trees of %d nodes in %s (%d files; refreshed every %.2f s)",
                         len(built), root, writer.files_written, period)
                task_status.started(writer)
                started = True
            changed = trio.Event()
            # changes in a burst (a sweep brings every port up) coalesce into one pass per gap
            gap = min(period, max(MIN_GAP_S, 5 * cost))
            await trio.sleep(clock.loop_s(gap))  # real seconds, on a dilated loop too
            if not changed.is_set():
                with trio.move_on_after(clock.loop_s(period - gap)):
                    await changed.wait()
    finally:
        with contextlib.suppress(ValueError):
            host.port_listeners.remove(on_change)
        writer.remove()
