"""Run the unmodified OpenSM (Debian ``opensm``) on an emulated host, every file in a work dir.

On a dilated run (``ibemu.clock.dilation() != 1``) OpenSM runs under libfaketime on the run's
clock, from the run's epoch (``ibemu.kernel.faketime``): its sweep interval, transaction
timeouts and log stamps are emulated time, N times longer in real time. ``workdir/clock.json``
records that clock (the log parser reads its stamps with it); its absence means the real
clock (dilation 1: nothing is preloaded, as before). Without libfaketime a dilated OpenSM is
refused (``ConfigError``), never silently run on the real clock.

OpenSM's SMPs leave and return through the C twin of the MAD socket's path
(``kernel.madtwin``, which ``fabric.mad_socket`` hands OpenSM's slot) when ``make native``
built it; when it did not, ``start`` says so in one line and they take the agent host's
Python path.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ibemu import clock
from ibemu.errors import IbemuError
from ibemu.fabric import opensm_log
from ibemu.fabric.umad2sim import dilated_clock, tool_argv
from ibemu.kernel import faketime, madtwin
from ibemu.kernel.ownership import RunState
from ibemu.physics.qos import code_of_vls
from ibemu.sm.partitions import SmPartitions
from ibemu.sm.qos import SmQos

OPENSM_ENGINE = {"ftree_ar": "ftree", "updn_ar": "updn"}
"""ibemu's adaptive engines -> the OpenSM engine that routes like their base."""


def opensm_available() -> bool:
    return shutil.which("opensm") is not None or Path("/usr/sbin/opensm").exists()


def write_key_config(workdir: Path, keys: Mapping[str, int]) -> Path:
    """``workdir/opensm.conf`` with OpenSM's own M_Key options (``m_key``,
    ``m_key_protection_level``, ``m_key_lease_period``; ``m_key_lookup FALSE``: one key for
    the subnet, no guid2mkey file); every other option keeps OpenSM's default."""
    path = workdir / "opensm.conf"
    path.write_text(f"m_key {keys['m_key']:#018x}\n"
                    f"m_key_protection_level {keys.get('m_key_protect', 0)}\n"
                    f"m_key_lease_period {keys.get('m_key_lease_s', 0)}\n"
                    "m_key_lookup FALSE\n")
    return path


PARTITIONS_FILE = "partitions.conf"


def partitions_conf(parts: SmPartitions, port_guids: Mapping[int, Sequence[int]]) -> str:
    """``parts`` in OpenSM's partitions.conf format: the default partition first (every port
    a full member, as ibemu's SM has it), then one line per partition, members by port GUID
    (``port_guids``: CA node GUID -> its ports' GUIDs) or ``ALL``."""
    lines = ["# written by ibemu from the scenario's partitions", "Default=0x7fff : ALL=full ;"]
    for p in parts.partitions:
        if p.everyone:
            members = f"ALL={'full' if p.everyone_full else 'limited'}"
        else:
            members = ", ".join(f"{guid:#018x}={'full' if full else 'limited'}"
                                for node, full in p.members for guid in port_guids.get(node, ()))
        lines.append(f"{p.name}={p.pkey:#06x} : {members} ;")
    return "\n".join(lines) + "\n"


def part_enforce(parts: SmPartitions) -> str:
    """OpenSM's one ``part_enforce`` for the subnet: the partitions' common mode (the loader
    refuses partitions whose modes differ under OpenSM)."""
    modes = {p.enforce for p in parts.partitions}
    return modes.pop() if len(modes) == 1 else "both"


def qos_options(qos: SmQos) -> str:
    """A scenario's ``fabric.qos`` as OpenSM's own options (one set for every port: CAs, switch
    port 0 and external ports take the ``qos_*`` defaults, as ibemu's SM programs one map and
    one pair of tables everywhere):

    - ``qos TRUE``; ``max_op_vls``: the VLCap code of ``vls`` (OpenSM sets each port's
      OperationalVLs to the smaller of both ends' VLCap and this; ``qos_max_vls`` only serves
      its torus engine);
    - ``qos_sl2vl``: the 16 VLs; ``qos_vlarb_high`` / ``qos_vlarb_low``: ``VL:weight`` lists
      (an empty table as ``0:0``: OpenSM would otherwise put its own default there, VL0 at
      weight 4 in the high table); ``qos_high_limit``: VLHighLimit.
    """
    high, low = qos.tables()

    def table(entries: tuple[tuple[int, int], ...]) -> str:
        return ",".join(f"{vl}:{w}" for vl, w in entries) or "0:0"

    return ("qos TRUE\n"
            f"max_op_vls {code_of_vls(qos.vls)}\n"
            f"qos_high_limit {qos.vl_high_limit}\n"
            f"qos_vlarb_high {table(high)}\n"
            f"qos_vlarb_low {table(low)}\n"
            f"qos_sl2vl {','.join(str(vl) for vl in qos.sl_to_vl())}\n")


def election_config(election: Mapping[str, Any]) -> str:
    """OpenSM's options for ``election`` (``SMSpec.election`` of one SM): ``sm_priority``,
    ``sminfo_polling_timeout`` (ms) and ``polling_retry_number``. OpenSM takes over once more
    than ``polling_retry_number`` polls went unanswered; ibemu's standby after ``poll_retries``
    failed polls: the number written is ``poll_retries - 1``, so both give up after as many
    unanswered polls (OpenSM one interval later: it looks at its count on the next tick)."""
    return (f"sm_priority {int(election.get('priority', 0))}\n"
            f"sminfo_polling_timeout {int(election.get('poll_interval_ms', 10000))}\n"
            f"polling_retry_number {max(0, int(election.get('poll_retries', 4)) - 1)}\n")


def write_config(workdir: Path, keys: Mapping[str, int] | None, parts: SmPartitions | None,
                 election: Mapping[str, Any] | None = None, qos: SmQos | None = None) -> str:
    """OpenSM's config file for ``keys`` (``write_key_config``), ``parts`` (``part_enforce``),
    ``election`` (``election_config``) and ``qos`` (``qos_options``); ``/dev/null`` (every
    option at OpenSM's default) when there is none of them."""
    if not (keys and keys.get("m_key")) and not (parts and parts.partitions) and not election and qos is None:
        return "/dev/null"
    path = workdir / "opensm.conf"
    text = write_key_config(workdir, keys).read_text() if keys and keys.get("m_key") else ""
    if parts and parts.partitions:
        text += f"part_enforce {part_enforce(parts)}\n"
    if election:
        text += election_config(election)
    if qos is not None:
        text += qos_options(qos)
    path.write_text(text)
    return str(path)


def start(ns: str, workdir: Path, *, engine: str = "minhop", extra: list[str] | None = None,
          state: RunState | None = None, keys: Mapping[str, int] | None = None,
          partitions: tuple[SmPartitions, Mapping[int, Sequence[int]]] | None = None,
          election: Mapping[str, Any] | None = None,
          qos: SmQos | None = None) -> subprocess.Popen[bytes]:
    """OpenSM attached to the MAD socket of the host in ``ns``; log in ``workdir/opensm.log``.

    ``-d2`` flushes the log after each message, so its phases can be read as they happen.
    ibemu's adaptive engines (``ftree_ar``, ``updn_ar``) run as their base engine: OpenSM
    writes no alternates (it knows nothing of ibemu's AlternatePorts attribute). ``keys``
    (``SMSpec.keys``) go into OpenSM's config file (``write_key_config``). ``partitions``
    (the partitions and the CAs' port GUIDs) go into ``workdir/partitions.conf``, passed with
    ``-P``, and ``part_enforce`` into the config file. ``election`` (priority, poll interval
    and retries: ``election_config``) goes into the config file too, and ``qos`` (a scenario's ``fabric.qos``) as OpenSM's QoS
    options (``qos_options``).
    """
    engine = OPENSM_ENGINE.get(engine, engine)
    madtwin.notice_if_missing()
    workdir.mkdir(parents=True, exist_ok=True)
    config = write_config(workdir, keys, partitions[0] if partitions else None, election, qos)
    extra = list(extra or [])
    if partitions and partitions[0].partitions:
        pfile = workdir / PARTITIONS_FILE
        pfile.write_text(partitions_conf(*partitions))
        extra += ["-P", str(pfile)]
    (workdir / opensm_log.CLOCK_FILE).unlink(missing_ok=True)
    shared = dilated_clock(state)
    try:
        argv = tool_argv(ns, ["opensm", "-F", config, "-f", str(workdir / "opensm.log"), "--dump_files_dir",
                              str(workdir), "-d2", "-s", "0", "-R", engine, *extra],
                         env={"OSM_TMP_DIR": str(workdir), "OSM_CACHE_DIR": str(workdir)}, faketime=shared)
        if shared is not None:
            (workdir / opensm_log.CLOCK_FILE).write_text(json.dumps(shared.describe()) + "\n")
        return subprocess.Popen(argv, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except BaseException:
        if shared is not None:
            shared.remove()
        raise


def release_clock(workdir: Path) -> None:
    """Remove the shared start time of OpenSM's clock once it has started (libfaketime read it
    when OpenSM started) or ended: nothing of it stays in /dev/shm."""
    faked = opensm_log.log_clock(workdir)
    shared = faked.get("shared") if faked else None
    if isinstance(shared, list) and len(shared) == 2:
        faketime.remove_shared(str(shared[0]), str(shared[1]))


LIGHT_SWEEP = "state_mgr_light_sweep_start"
"""The stamped line of OpenSM's ``INITIATING LIGHT SWEEP`` box (log level 0x04, ``-D 0x07``)."""


def light_sweeps(workdir: Path, text: str | None = None) -> list[int]:
    """Emulated stamps of the light sweeps in ``workdir/opensm.log`` (or ``text``), on the
    clock OpenSM ran on (``clock.json``)."""
    if text is None:
        text = (workdir / "opensm.log").read_text(errors="replace")
    faked = opensm_log.log_clock(workdir)
    offset = faked["realtime_offset_ns"] if faked else opensm_log.wall_to_monotonic_offset_ns()
    return [t for t, msg in opensm_log.stamped(text.splitlines(), offset, time.time(), faked is not None)
            if LIGHT_SWEEP in msg]


def clock_name(workdir: Path) -> str:
    """Which clock OpenSM ran on: ``libfaketime`` (the run's dilated clock) or ``real``."""
    return "libfaketime" if opensm_log.log_clock(workdir) is not None else "real"


def wait_subnet_up(proc: subprocess.Popen[bytes], workdir: Path, timeout_s: float = 60.0, *,
                   started_ns: int | None = None) -> float:
    """Seconds until OpenSM logged SUBNET UP; raises if it exits or takes longer.

    With ``started_ns`` (monotonic, taken just before ``start``): from then to the log's own
    stamp of SUBNET UP, not to when this poll saw it.
    """
    log = workdir / "opensm.log"
    t0 = clock.monotonic()
    while True:
        text = log.read_text(errors="replace") if log.exists() else ""
        if text:  # OpenSM is running: libfaketime has read its start time
            release_clock(workdir)
        if "SUBNET UP" in text:
            if started_ns is not None:
                up = next((e["t_ns"] for e in opensm_log.parse_workdir(workdir, text) if e["kind"] == "subnet_up"),
                          None)
                if up is not None:
                    return max(0.0, (up - started_ns) / 1e9)
            return clock.monotonic() - t0
        if proc.poll() is not None:
            release_clock(workdir)
            raise IbemuError(f"opensm exited ({proc.returncode}) before SUBNET UP:\n{text[-2000:]}")
        if clock.monotonic() - t0 > timeout_s:
            raise IbemuError(f"no SUBNET UP from opensm in {timeout_s:.0f} s:\n{text[-2000:]}")
        time.sleep(0.05)


def wait_state(proc: subprocess.Popen[bytes], workdir: Path, state: str, timeout_s: float = 60.0) -> None:
    """Until OpenSM logs ``Entering STATE state`` (``standby``, ``master``)."""
    log = workdir / "opensm.log"
    want = f"Entering {state.upper()} state"
    t0 = clock.monotonic()
    while True:
        text = log.read_text(errors="replace") if log.exists() else ""
        if text:
            release_clock(workdir)
        if want in text:
            return
        if proc.poll() is not None:
            release_clock(workdir)
            raise IbemuError(f"opensm exited ({proc.returncode}) before {want!r}:\n{text[-2000:]}")
        if clock.monotonic() - t0 > timeout_s:
            raise IbemuError(f"no {want!r} from opensm in {timeout_s:.0f} s:\n{text[-2000:]}")
        time.sleep(0.05)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 10 s (any SM process: OpenSM or ibemu's). SIGCONT follows
    the SIGTERM, as a shell's ``kill`` does for a stopped job: a stopped SM (SIGSTOP, a
    debugger let go) would otherwise get it only when the 10 s were over."""
    if proc.poll() is None:
        proc.terminate()
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGCONT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
