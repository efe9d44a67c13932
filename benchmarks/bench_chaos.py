#!/usr/bin/env python3
"""Chaos campaign: short runs killed at random moments, each followed by ``ibemu clean RUN``;
counts what ibemu leaked and which foreign objects it touched (all must be 0). Needs root.

Kill kinds (one per run, round robin; the moment is drawn from a seeded RNG, printed):

- ``runner-int``, ``runner-term``, ``runner-kill``: SIGINT, SIGTERM, SIGKILL of ``ibemu run``
  at a moment uniform over its whole life (start-up, build, SM bring-up, warm-up, traffic,
  teardown), on the IB kernel datapath, the IB user datapath and the RoCE user datapath in
  turn. In ``ibemu run`` the agent host (and the IB user datapath) is the runner's own process.
- ``sm-kill``: SIGKILL of ibemu's SM (the run's ``sm-ibemu`` process) while it lives.
- ``agenthost-kill``: SIGKILL of the agent host of ``ibemu up`` (its ``fabric-daemon``, which
  runs every agent and, on the user datapath, the switches' forwarding), during its build, SM
  bring-up or while it serves.
- ``worker-kill``: SIGKILL of a traffic worker (``traffic-worker-N``) while it lives.
- ``userpath-kill``: SIGKILL of the RoCE user datapath process (``roce-userpath``).

The processes are found from the run's state file in the state directory
(``ibemu.kernel.ownership``). After the kill the benchmark waits for the runner (or ``ibemu
up``) to exit by itself (a bound of 40 s: past it the run counts as hung and is killed), then
runs ``ibemu clean RUN`` for that run only, when its state file is still there.

Counted after each run (a run's objects are those named with its run id or recorded in its
state file): namespaces left; interfaces left in the root namespace or in the foreign
namespaces; processes left (recorded in the state file, or any process whose environment
carries this campaign's mark, set for every command it starts); files left (the state file,
the run directory, the /dev/shm files it recorded, new entries under /sys/fs/bpf); and
foreign objects touched: two
foreign namespaces (one named like a run's, ``ibemu-f0f0f0-h0``), veth pairs in them and in
the root namespace named like ibemu's (with a clsact qdisc and a tc filter on one), and a
foreign process in a foreign namespace, created at start, fingerprinted (inode, ifindex, MAC,
MTU, qdiscs, filters, start time) and compared after every run and at the end, then removed.

Run: sudo IBEMU_STATE_DIR=/run/ibemu-campaign .venv/bin/python benchmarks/bench_chaos.py [--runs 100] [--seed S]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
TOPOLOGY = "{generator: leaf-spine, leaves: 2, spines: 1, hosts_per_leaf: 2, uplinks_per_leaf: 1}"
NODES = ("leaf0", "leaf1", "spine0", "h0", "h1", "h2", "h3")
def _scenario(name: str, head: str, faults: bool) -> str:
    """One chaos scenario: the same topology and flows, ``head`` (its SM and fabric lines)
    and, where the fabric has an SM to reroute it, a cable cut."""
    cut = '\nfaults:\n  - {at_s: 1, action: link_down, link: "leaf1:3"}' if faults else ""
    return (f"\nname: chaos-{name}\ntopology: {TOPOLOGY}\n{head}\ntraffic:\n"
            "  - {name: bulk, kind: write_bw, from: h0, to: h3, size: 64KiB}\n"
            f"  - {{name: probe, kind: stream, from: h1, to: h2, rate_pps: 1000}}{cut}\nduration_s: 2\n")


SCENARIOS = {
    "ib-kernel": _scenario("ib-kernel", "sm: {impl: ibemu, host: h0}", faults=True),
    "ib-user": _scenario("ib-user", "sm: {impl: ibemu, host: h0}\nfabric: {datapath: user}", faults=True),
    "roce-user": _scenario("roce-user", "fabric: {kind: roce, datapath: user}", faults=False),
}


@dataclass(frozen=True)
class KillKind:
    name: str
    sig: signal.Signals
    target: str
    """``runner`` (the ``ibemu run`` process itself) or the role prefix in the state file."""
    scenarios: tuple[str, ...]
    window_s: float
    """Kill moment: uniform in [0, window_s] after the runner starts (runner) or after the
    target process appears in the state file."""
    up: bool = False
    """Drive ``ibemu up`` (then ``ibemu clean RUN``) instead of ``ibemu run``."""


KINDS = (
    KillKind("runner-int", signal.SIGINT, "runner", ("ib-kernel", "ib-user", "roce-user"), 8.0),
    KillKind("runner-term", signal.SIGTERM, "runner", ("ib-kernel", "ib-user", "roce-user"), 8.0),
    KillKind("runner-kill", signal.SIGKILL, "runner", ("ib-kernel", "ib-user", "roce-user"), 8.0),
    KillKind("sm-kill", signal.SIGKILL, "sm-", ("ib-kernel", "ib-user"), 5.0),
    KillKind("agenthost-kill", signal.SIGKILL, "fabric-daemon", ("ib-kernel", "ib-user"), 3.0, up=True),
    KillKind("worker-kill", signal.SIGKILL, "traffic-worker-", ("ib-kernel", "ib-user", "roce-user"), 3.0),
    KillKind("userpath-kill", signal.SIGKILL, "roce-userpath", ("roce-user",), 5.0),
)
LEAKS = ("namespaces", "interfaces", "processes", "files", "foreign")
HANG_S = 40.0


def sh(*argv: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check)


# ---------------------------------------------------------------------------- foreign objects

FOREIGN_NS = ("ibemu-f0f0f0-h0", "chaos-foreign")
FOREIGN_ROOT_LINKS = ("h0-1", "leaf0-1")  # a pair in the root namespace named like a run's cables


def make_foreign() -> subprocess.Popen[bytes]:
    for ns in FOREIGN_NS:
        sh("ip", "netns", "add", ns, check=True)
        sh("ip", "-n", ns, "link", "add", "h0-1", "type", "veth", "peer", "name", "leaf0-1", check=True)
        sh("ip", "-n", ns, "link", "set", "h0-1", "up", check=True)
    sh("ip", "link", "add", FOREIGN_ROOT_LINKS[0], "type", "veth", "peer", "name", FOREIGN_ROOT_LINKS[1], check=True)
    sh("ip", "link", "set", FOREIGN_ROOT_LINKS[0], "up", check=True)
    for dev in FOREIGN_ROOT_LINKS[:1]:
        sh("tc", "qdisc", "add", "dev", dev, "clsact", check=True)
        sh("tc", "filter", "add", "dev", dev, "ingress", "protocol", "all", "prio", "7", "u32",
           "match", "u32", "0", "0", "classid", "1:1", check=True)
    # A foreign process in a foreign namespace, its command line like an SM's.
    return subprocess.Popen(["ip", "netns", "exec", FOREIGN_NS[0], PY, "-c",
                             "import time; time.sleep(1e6)", "ibemu.sm"], env=foreign_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def foreign_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "IBEMU_STATE_DIR"}


def remove_foreign(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()
    for ns in FOREIGN_NS:
        sh("ip", "netns", "del", ns)
    sh("ip", "link", "del", FOREIGN_ROOT_LINKS[0])


def links(ns: str | None) -> dict[str, tuple[object, ...]]:
    argv = ["ip", "-j", "-d", "link", "show"] if ns is None else ["ip", "-n", ns, "-j", "-d", "link", "show"]
    out = sh(*argv)
    if out.returncode != 0:
        return {}
    return {d["ifname"]: (d["ifindex"], d.get("address"), d.get("mtu"), d.get("operstate"), d.get("master"))
            for d in json.loads(out.stdout or "[]")}


def tc_text(dev: str, ns: str | None = None) -> str:
    pre = [] if ns is None else ["-n", ns]
    return "".join(sh("tc", *pre, what, "show", "dev", dev, *extra).stdout
                   for what, extra in (("qdisc", []), ("filter", ["ingress"]), ("filter", ["egress"])))


def pid_start(pid: int) -> str | None:
    """Start time of a live process (a zombie has finished: None), as ibemu.kernel.ownership."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def fingerprint(proc: subprocess.Popen[bytes]) -> dict[str, object]:
    fp: dict[str, object] = {}
    for ns in FOREIGN_NS:
        try:
            fp[f"ns {ns}"] = os.stat(f"/run/netns/{ns}").st_ino
        except FileNotFoundError:
            fp[f"ns {ns}"] = None
        fp[f"links in {ns}"] = links(ns)
        fp[f"tc in {ns}"] = tc_text("h0-1", ns)
    root = links(None)
    for dev in FOREIGN_ROOT_LINKS:
        fp[f"root link {dev}"] = root.get(dev)
        fp[f"tc {dev}"] = tc_text(dev)
    fp["process"] = (proc.pid, pid_start(proc.pid), proc.poll())
    return fp


# ---------------------------------------------------------------------------- one run


@dataclass
class Outcome:
    kind: str
    scenario: str
    delay_s: float
    run_id: str | None = None
    killed: bool = False
    hung: bool = False
    cleaned: str = "-"
    exit: int | None = None
    duration_s: float = 0.0
    phase: str = "-"
    """Where the run was when the signal left: start-up (no state file yet), fabric (built or
    being built, the SM coming up), traffic (workers started), gone (the target had ended)."""
    leaks: dict[str, list[str]] = field(default_factory=lambda: {k: [] for k in LEAKS})


def runs_dir() -> Path:
    return Path(os.environ["IBEMU_STATE_DIR"]) / "runs"


def run_ids() -> set[str]:
    return {p.stem for p in runs_dir().glob("*.json")}


def load_state(rid: str) -> dict[str, object] | None:
    with contextlib.suppress(FileNotFoundError, ValueError):
        return json.loads((runs_dir() / f"{rid}.json").read_text())
    return None


MARK = "IBEMU_CHAOS_CAMPAIGN"
"""Set in the environment of every command the campaign starts (and so of all their children)."""


def phase_of(seen: set[str]) -> str:
    roles = [p["role"] for rid in seen for p in (load_state(rid) or {}).get("processes", [])]  # type: ignore[union-attr]
    if not seen:
        return "start-up"
    return "traffic" if any(r.startswith("traffic-worker-") for r in roles) else "fabric"


def campaign_processes(exclude: set[int]) -> list[str]:
    """Processes whose environment carries this campaign's mark (the runs' children)."""
    want = f"{MARK}={os.getpid()}".encode()
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) in exclude:
            continue
        try:
            env = (d / "environ").read_bytes()
            if want in env.split(b"\0") and pid_start(int(d.name)) is not None:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ")[:80].decode(errors="replace")
                found.append(f"{d.name} {cmd}")
        except OSError:
            continue
    return found


def ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            break
    return pids


def one_run(i: int, kind: KillKind, scen: str, rng: random.Random, work: Path, shm_before: set[str],
            bpf_before: set[str], own: set[int]) -> Outcome:
    out = Outcome(kind.name, scen, rng.uniform(0.0, kind.window_s))
    before_ids = run_ids()
    root_before = set(links(None))
    scen_file = work / f"{scen}.yaml"
    if kind.up:
        argv = [PY, "-m", "ibemu.cli.main", "up", str(scen_file)]
    else:
        argv = [PY, "-m", "ibemu.cli.main", "run", str(scen_file), "--quiet", "--no-plots",
                "--out", str(work / f"o{i}"), "--json", str(work / f"r{i}.json")]
    env = {**os.environ, "PYTHONPATH": str(REPO), MARK: str(os.getpid())}
    t0 = time.monotonic()
    # SIGINT as in a foreground shell: a campaign started in the background would hand its
    # runs SIGINT ignored, and a Ctrl-C would not be one
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen: set[str] = set()

    def new_runs() -> set[str]:  # this command's run (another job may share the state dir)
        return {rid for rid in run_ids() - before_ids - seen if (load_state(rid) or {}).get("owner_pid") == proc.pid}

    appeared: float | None = None
    target_pid: int | None = None
    while True:
        seen |= new_runs()
        now = time.monotonic()
        if kind.target == "runner":
            if now - t0 >= out.delay_s:
                if proc.poll() is None:
                    out.phase = phase_of(seen)
                    proc.send_signal(kind.sig)
                    out.killed = True
                break
        else:
            for rid in seen:
                state = load_state(rid) or {}
                for p in state.get("processes", []):  # type: ignore[union-attr]
                    if (appeared is None and p["role"].startswith(kind.target)
                            and pid_start(p["pid"]) == str(p["start_time"])):
                        appeared, target_pid = now, p["pid"]
            if appeared is not None and now - appeared >= out.delay_s:
                if target_pid is not None and pid_start(target_pid) is not None:
                    out.phase = phase_of(seen)
                    os.kill(target_pid, kind.sig)
                    out.killed = True
                break
            if proc.poll() is not None and not kind.up:
                break  # the run ended before its target appeared or before the moment came
            if kind.up and proc.poll() is not None and appeared is None:
                break
        if now - t0 > 60:
            break
        time.sleep(0.01)
    try:
        out.exit = proc.wait(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        out.hung = True
        proc.kill()
        out.exit = proc.wait()
    seen |= new_runs()
    out.duration_s = time.monotonic() - t0
    states = {rid: load_state(rid) for rid in seen}
    if kind.up:  # `ibemu up` leaves its fabric running unless the daemon died: clean it in any case
        pass
    for rid in sorted(seen):
        out.run_id = rid
        if (runs_dir() / f"{rid}.json").exists():
            res = subprocess.run([PY, "-m", "ibemu.cli.main", "clean", rid], cwd=REPO, env=env,
                                 capture_output=True, text=True, timeout=180)
            out.cleaned = "clean" if res.returncode == 0 else f"clean rc={res.returncode}: {res.stdout.strip()[-200:]}"
        else:
            out.cleaned = "self"
    # Count what is left.
    after_ns = set(sh("ip", "netns", "list").stdout.split())
    for rid in seen:
        prefix = f"ibemu-{rid}-"
        st = states.get(rid) or {}
        recorded = set(st.get("namespaces", []))  # type: ignore[arg-type]
        out.leaks["namespaces"] += sorted(n for n in after_ns if n.startswith(prefix) or n in recorded)
        for p in st.get("processes", []):  # type: ignore[union-attr]
            if pid_start(p["pid"]) == str(p["start_time"]):
                out.leaks["processes"].append(f"{p['pid']} {p['role']}")
        for path in [runs_dir() / f"{rid}.json", runs_dir() / f"{rid}.tmp", runs_dir() / rid,
                     *map(Path, st.get("shared_memory", []))]:  # type: ignore[arg-type]
            if path.exists():
                out.leaks["files"].append(str(path))
    # A namespace of a run whose state file the polls never saw cannot exist: the state file is
    # written before any namespace (write-ahead) and removed only after the last is gone. New
    # namespaces of other names are other jobs' (this machine is shared), not counted.
    root_new = set(links(None)) - root_before
    ours = {f"{n}-{p}" for n in NODES for p in range(1, 5)}
    out.leaks["interfaces"] += sorted(f"root:{n}" for n in root_new if n in ours or any(r in n for r in seen))
    for ns in FOREIGN_NS:
        extra = set(links(ns)) - {"lo", "h0-1", "leaf0-1"}
        out.leaks["interfaces"] += sorted(f"{ns}:{n}" for n in extra)
    known = {p.split()[0] for p in out.leaks["processes"]}
    out.leaks["processes"] += [p for p in campaign_processes(own) if p.split()[0] not in known]
    out.leaks["files"] += sorted(f"/dev/shm/{n}" for n in set(os.listdir("/dev/shm")) - shm_before
                                 if any(r in n for r in seen))
    out.leaks["files"] += sorted(f"/sys/fs/bpf/{n}" for n in set(os.listdir("/sys/fs/bpf")) - bpf_before)
    return out


# ---------------------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--kinds", default=",".join(k.name for k in KINDS), help="comma-separated kill kinds")
    ap.add_argument("-v", "--verbose", action="store_true", help="one line per run")
    ap.add_argument("--window", type=float, default=None,
                    help="seconds over which a runner's kill moment is drawn (default 8; on a loaded machine "
                         "a run's start-up alone can take that long: give a run's whole length here)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root (namespaces)")
        return 2
    if "IBEMU_STATE_DIR" not in os.environ:
        print("set IBEMU_STATE_DIR (e.g. /run/ibemu-campaign): the campaign's runs go there")
        return 2
    def stop(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for sig in (signal.SIGINT, signal.SIGTERM):  # even started in the background: clean up on the way out
        signal.signal(sig, stop)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    rng = random.Random(seed)
    kinds = [k for k in KINDS if k.name in args.kinds.split(",")]
    if args.window is not None:  # the runner kinds' kill moments: uniform over this many seconds
        kinds = [dataclasses.replace(k, window_s=args.window) if k.target == "runner" else k for k in kinds]
    print(f"chaos campaign: {args.runs} runs, seed {seed}, state dir {os.environ['IBEMU_STATE_DIR']}")
    print(f"load before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    work = Path(tempfile.mkdtemp(prefix="ibemu-chaos-"))
    for name, text in SCENARIOS.items():
        (work / f"{name}.yaml").write_text(text)
    stale = run_ids()
    if stale:
        print(f"the state dir already holds runs {sorted(stale)}: clean them first")
        return 2
    foreign: subprocess.Popen[bytes] | None = None
    outcomes: list[Outcome] = []
    t_start = time.monotonic()
    try:
        foreign = make_foreign()
        time.sleep(0.2)
        fp0 = fingerprint(foreign)
        shm_before, bpf_before = set(os.listdir("/dev/shm")), set(os.listdir("/sys/fs/bpf"))
        # Processes that were there before the campaign (this one's ancestors, a pipe's other end)
        # are not the runs'.
        own = ancestors() | {foreign.pid} | {int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit()}
        per_kind_count: Counter[str] = Counter()
        for i in range(args.runs):
            kind = kinds[i % len(kinds)]
            scen = kind.scenarios[per_kind_count[kind.name] % len(kind.scenarios)]
            per_kind_count[kind.name] += 1
            own.add(foreign.pid)
            o = one_run(i, kind, scen, rng, work, shm_before, bpf_before, own)
            fp = fingerprint(foreign)
            o.leaks["foreign"] += [k for k in fp0 if fp.get(k) != fp0[k]]
            outcomes.append(o)
            bad = {k: v for k, v in o.leaks.items() if v}
            if args.verbose or bad or o.hung:
                print(f"  run {i:3d} {o.kind:15s} {o.scenario:9s} at {o.delay_s:5.2f} s ({o.phase}) run {o.run_id} "
                      f"killed={o.killed} exit={o.exit} hung={o.hung} clean={o.cleaned} "
                      f"{o.duration_s:5.1f} s {bad if bad else ''}", flush=True)
            if bad:
                fp0 = fingerprint(foreign)  # count each touch once
        fp_end = fingerprint(foreign)
        end_touched = [k for k in fp0 if fp_end.get(k) != fp0[k]]
    finally:
        remove_foreign(foreign)
        shutil.rmtree(work, ignore_errors=True)
    elapsed = time.monotonic() - t_start
    print(f"\n{len(outcomes)} runs in {elapsed:.0f} s (load after: {os.getloadavg()[0]:.2f}); "
          f"seed {seed}")
    rows: dict[str, Counter[str]] = defaultdict(Counter)
    for o in outcomes:
        c = rows[o.kind]
        c["runs"] += 1
        c["killed"] += o.killed
        c["hung"] += o.hung
        c["cleaned"] += o.cleaned == "clean"
        c["self"] += o.cleaned == "self"
        c["clean failed"] += o.cleaned.startswith("clean rc")
        for k in LEAKS:
            c[k] += len(o.leaks[k])
    cols = ["runs", "killed", "hung", "cleaned", "self", "clean failed", *LEAKS]
    head = f"{'kill kind':15s} " + " ".join(f"{c:>12s}" for c in cols)
    print(head)
    print("-" * len(head))
    total: Counter[str] = Counter()
    for k in kinds:
        c = rows.get(k.name, Counter())
        total.update(c)
        print(f"{k.name:15s} " + " ".join(f"{c[col]:>12d}" for col in cols))
    print("-" * len(head))
    print(f"{'total':15s} " + " ".join(f"{total[col]:>12d}" for col in cols))
    print("(killed: the signal reached its target; self: the run removed everything itself, "
          "so `ibemu clean RUN` had nothing to do; cleaned: `ibemu clean RUN` ran and succeeded)")
    print(f"foreign objects at the end: {'untouched' if not end_touched else 'TOUCHED: ' + ', '.join(end_touched)}")
    by_scen = Counter(f"{o.kind}@{o.scenario}" for o in outcomes)
    print("runs per kind and scenario: " + ", ".join(f"{k} {v}" for k, v in sorted(by_scen.items())))
    by_phase = Counter(o.phase for o in outcomes)
    print("kills by phase: " + ", ".join(f"{k} {v}" for k, v in sorted(by_phase.items())))
    leaked = sum(total[k] for k in LEAKS) + total["hung"] + total["clean failed"] + len(end_touched)
    print("RESULT: " + ("all 0" if not leaked else f"{leaked} leaks/hangs/failures"))
    return 0 if not leaked else 1


if __name__ == "__main__":
    sys.exit(main())
