"""What this kernel offers ibemu (netem, tbf, htb, clsact, u32, mirred, bpf), probed for real.

The probe builds a throw-away pair of namespaces owned by a temporary run, tries each feature
with ``tc``, and removes everything again. Results are cached per kernel release.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass

from ibemu.kernel import netns, ownership
from ibemu.kernel.commands import run
from ibemu.kernel.links import Cable, create_cables

log = logging.getLogger(__name__)

FEATURES = ("netem", "tbf", "htb", "clsact", "u32", "mirred", "bpf")


@dataclass(frozen=True)
class KernelFeatures:
    release: str
    netem: bool
    tbf: bool
    htb: bool
    clsact: bool
    u32: bool
    mirred: bool
    bpf: bool

    def missing(self, needed: set[str]) -> list[str]:
        return sorted(f for f in needed if not getattr(self, f))


def _try(argv: list[str]) -> bool:
    return run(argv, check=False, timeout=10).returncode == 0


def probe() -> KernelFeatures:
    state = ownership.RunState(ownership.new_run_id(), scenario="feature-probe")
    a, b = ownership.ns_name(state.run_id, "probe-a"), ownership.ns_name(state.run_id, "probe-b")
    state.claim_namespaces([a, b])
    try:
        netns.create([a, b])
        create_cables([Cable(a, "p1", b, "p1")])
        tc = ["tc", "-n", a]
        found = {
            "netem": _try([*tc, "qdisc", "add", "dev", "p1", "root", "netem", "delay", "1ms"]),
        }
        if found["netem"]:
            run([*tc, "qdisc", "del", "dev", "p1", "root"], check=False)
        found["tbf"] = _try([*tc, "qdisc", "add", "dev", "p1", "root", "tbf", "rate", "1gbit",
                             "burst", "20000", "latency", "10ms"])
        run([*tc, "qdisc", "del", "dev", "p1", "root"], check=False)
        found["htb"] = _try([*tc, "qdisc", "add", "dev", "p1", "root", "handle", "1:", "htb"])
        found["clsact"] = _try([*tc, "qdisc", "add", "dev", "p1", "clsact"])
        found["u32"] = found["clsact"] and _try(
            [*tc, "filter", "add", "dev", "p1", "ingress", "prio", "1", "protocol", "all", "u32",
             "match", "u32", "0", "0", "action", "pass"])
        found["mirred"] = found["clsact"] and _try(
            [*tc, "filter", "add", "dev", "p1", "ingress", "prio", "2", "protocol", "all", "u32",
             "match", "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", "p1"])
        found["bpf"] = found["clsact"] and _try(
            [*tc, "filter", "add", "dev", "p1", "ingress", "prio", "3", "protocol", "all", "bpf",
             "bytecode", "1,6 0 0 0,", "action", "pass"])
        return KernelFeatures(release=os.uname().release, **found)
    finally:
        ownership.teardown(state)


def detect(use_cache: bool = True) -> KernelFeatures:
    """Features of the running kernel (cached in the state directory)."""
    cache = ownership.STATE_DIR / "features.json"
    release = os.uname().release
    if use_cache and cache.exists():
        try:
            data = json.loads(cache.read_text())
            if data.get("release") == release:
                return KernelFeatures(**data)
        except (ValueError, TypeError):
            pass
    feats = probe()
    ownership.STATE_DIR.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(asdict(feats)))
    log.info("kernel features: %s", feats)
    return feats
