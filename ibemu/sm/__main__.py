"""``python -m ibemu.sm``: ibemu's subnet manager on one emulated host's MAD socket.

    python -m ibemu.sm --ns ibemu-xxxx-h0 --engine minhop --events sm.jsonl

Attaches as the SM (IsSM) to the MAD socket of the host in namespace ``--ns`` (the sockets
are made inside that namespace; this process stays where it is), brings the subnet up and
keeps it up until SIGTERM/SIGINT. Events go to ``--events`` as JSON lines.

With ``--direct`` and the process on CPUs of its own (as ``ibemu run`` places it), the far end
of its cable steers what it receives (RPS, ``kernel.steer``) to the other CPUs once the subnet
is up, while the SMPs are the kernel's to answer (``SubnetManager.offload``: Gets and LFT
Sets; not a heavy sweep's PortInfo, P_Key and SwitchInfo Sets, which the agents on that other
CPU answer): each SMP's trip through the fabric and back then runs there instead of inside
the SM's ``send`` (``IBEMU_SM_STEER=0`` turns that off). Not during the cold sweep (see
``_Steering.start``). The setting is taken back at a clean
exit; it goes with the cable otherwise. It applies to everything the host sends on that
cable, its traffic too.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import logging
import os
import signal
import sys
from collections import Counter
from collections.abc import Callable
from typing import cast

import trio

from ibemu import lagmon
from ibemu.events import EventLog, Kind
from ibemu.hca.umad_client import UmadClient
from ibemu.kernel import steer
from ibemu.kernel.commands import KernelError
from ibemu.kernel.timerfd import run_trio
from ibemu.sm.directport import DirectPort
from ibemu.sm.manager import RouteFn, SmConfig, SubnetManager, default_route_fn
from ibemu.sm.transport import DEFAULT_MAX_IN_FLIGHT, DEFAULT_RETRIES, DEFAULT_TIMEOUT_S, UmadPort
from ibemu.wire.umad import DEFAULT_SOCKNAME

log = logging.getLogger("ibemu.sm")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ibemu.sm", description=__doc__.split("\n\n")[0])
    p.add_argument("--ns", default=None, help="network namespace of the SM's host (default: this one)")
    p.add_argument("--sockname", default=DEFAULT_SOCKNAME, help="MAD socket base name (default %(default)s)")
    p.add_argument("--engine", default="minhop", help="routing engine: minhop|updn|ftree|dor|ftree_ar|updn_ar")
    p.add_argument("--events", default=None, help="JSON-lines event log file")
    p.add_argument("--sweep-interval", type=float, default=10.0, help="seconds between light sweeps (emulated, to scale under time dilation)")
    p.add_argument("--max-in-flight", type=int, default=DEFAULT_MAX_IN_FLIGHT, help="SMPs in flight")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per SMP attempt (emulated; under time dilation at most 1 s of real time: "
                   "ibemu.sm.timers)")
    p.add_argument("--retries", type=int, default=DEFAULT_RETRIES, help="retries per SMP")
    p.add_argument("--route-fn", default=None, help="module:function computing routes (default: ibemu.sm.routing)")
    p.add_argument("--state", default=None, help="JSON snapshot of LIDs, cables and LFTs (for `ibemu sm`)")
    p.add_argument("--dump-dir", default=None, help="write OpenSM's opensm-subnet.lst, opensm-lfts.dump and "
                   "guid2lid here after each heavy sweep and reroute (ibemu.sm.dumps)")
    p.add_argument("--direct", default=None, metavar="IFNAME=PEER_MAC",
                   help="send and receive SMPs on the HCA's own cable (a packet socket on IFNAME in --ns, "
                        "whose far end has PEER_MAC), the MAD socket for the rest (ibemu.sm.directport)")
    p.add_argument("--qos", default=None, help="QoS to program (JSON: vls, sl2vl, vlarb_high, vlarb_low, "
                   "vl_high_limit; ibemu.sm.qos.SmQos)")
    p.add_argument("--partitions", default=None, help="partitions to program (JSON list of name, pkey, "
                   "members [[node GUID, full]], everyone, everyone_full, enforce; ibemu.sm.partitions)")
    p.add_argument("--m-key", type=_u64, default=0, help="M_Key for every port and SMP (0x.. or decimal; 0: none)")
    p.add_argument("--m-key-protect", type=int, choices=range(4), default=0, metavar="0-3",
                   help="M_KeyProtectBits written with the key")
    p.add_argument("--m-key-lease", type=int, default=0, metavar="SECONDS",
                   help="M_KeyLeasePeriod written with the key (0-65535; 0: never runs out)")
    p.add_argument("--no-local-failover", action="store_true",
                   help="with an _ar engine: write no alternates or fault-notice settings (switches "
                        "wait for the SM's reroute)")
    p.add_argument("--priority", type=int, choices=range(16), default=0, metavar="0-15",
                   help="SMInfo priority in the election (higher wins, then the lower port GUID)")
    p.add_argument("--poll-interval", type=float, default=1.0, metavar="SECONDS",
                   help="a standby polls its master's SMInfo this often (OpenSM: sminfo_polling_timeout)")
    p.add_argument("--poll-retries", type=int, default=3, metavar="N",
                   help="failed polls in a row before a standby takes over (OpenSM: polling_retry_number)")
    p.add_argument("--log-level", default="WARNING")
    args = p.parse_args(argv)
    if not 0 <= args.m_key_lease <= 0xFFFF:
        p.error(f"--m-key-lease {args.m_key_lease}: expected 0-65535 seconds")
    if not 0 < args.poll_interval <= 3600:
        p.error(f"--poll-interval {args.poll_interval}: expected 0 < seconds <= 3600")
    if not 1 <= args.poll_retries <= 100:
        p.error(f"--poll-retries {args.poll_retries}: expected 1-100")
    return args


def _u64(text: str) -> int:
    """A 64-bit value, 0x.. or decimal (argparse type)."""
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value < 1 << 64:
        raise argparse.ArgumentTypeError(f"{text} is not a 64-bit value")
    return value


def parse_direct(value: str) -> tuple[str, bytes]:
    """``IFNAME=aa:bb:cc:dd:ee:ff`` -> (ifname, MAC bytes)."""
    ifname, sep, mac = value.partition("=")
    try:
        raw = bytes.fromhex(mac.replace(":", ""))
    except ValueError:
        raw = b""
    if not sep or not ifname or len(raw) != 6:
        raise SystemExit(f"--direct {value!r}: expected IFNAME=aa:bb:cc:dd:ee:ff")
    return ifname, raw


def load_route_fn(spec: str | None) -> RouteFn:
    if not spec:
        return default_route_fn
    module, _, name = spec.partition(":")
    fn = getattr(importlib.import_module(module), name or "compute")
    return cast(Callable[..., object], fn)  # type: ignore[return-value]


async def _freeze_after_up(sm: SubnetManager) -> None:
    """What exists at SUBNET UP lives on: keep it out of the collector (no pauses in a reroute)."""
    await sm.up.wait()
    gc.collect()
    gc.freeze()


def check_dump_dir(value: str | None) -> None:
    """``--dump-dir``: a directory this process can write (made if missing), or a clear exit
    before the SM attaches to anything."""
    if not value:
        return
    try:
        os.makedirs(value, exist_ok=True)
    except OSError as exc:
        raise SystemExit(f"--dump-dir {value}: {exc.strerror or exc}") from None
    if not os.access(value, os.W_OK | os.X_OK):
        raise SystemExit(f"--dump-dir {value}: not writable")


class _Steering:
    """The far end of the SM's cable steered to the CPUs this process is not on while the
    SMPs are the kernel's to answer (``SubnetManager.offload``; see the module docstring)."""

    def __init__(self, ns: str | None, ifname: str) -> None:
        self.ns, self.ifname = ns, ifname
        self.ctl: steer.RpsControl | None = None
        self.cpus: list[int] = []
        self.want = False
        self.active = False
        self.stats: Counter[str] | None = None

    async def start(self, port: DirectPort, up: trio.Event) -> None:
        """Steering follows ``offload`` from SUBNET UP on: with a cold sweep's window of 128
        SMPs steered to a CPU other jobs kept busy, k=8 bring-ups were slower and retried
        (1.8-6.6 s against 1.4-2.6 s unsteered at load 8-15, ``benchmarks/bench_sm.py``)."""
        if os.environ.get(steer.ENV, "1") == "0":
            return
        await up.wait()  # found and opened only then: nothing of it in the cold sweep's time
        cpus = steer.other_cpus()  # this thread's CPUs: where ``ibemu run`` placed the process
        if not cpus:
            log.info("not on CPUs of its own: the SM's SMPs are not steered")
            return
        try:
            self.ctl = await trio.to_thread.run_sync(self._open)
        except (KernelError, OSError, ValueError) as exc:
            log.warning("cannot steer the SM's cable %s: %s", self.ifname, exc)
            return
        self.cpus, self.stats = cpus, port.stats
        port.stats["steer_cpu_mask"] = int(steer.mask(cpus), 16)
        log.info("SMPs sent on %s can be carried by CPUs %s (%s)", self.ifname, cpus, self.ctl.where)
        self.active = True
        if self.ctl is not None:
            self._apply()

    def _open(self) -> steer.RpsControl:
        return steer.RpsControl(*steer.peer_of(self.ns, self.ifname))

    def offload(self, kernel: bool) -> None:
        """``SubnetManager.offload``: steer while the kernel answers."""
        if kernel != self.want:
            self.want = kernel
            if self.ctl is not None and self.active:
                self._apply()

    def _apply(self) -> None:
        assert self.ctl is not None
        try:
            self.ctl.set(self.cpus if self.want else [])
        except KernelError as exc:
            log.warning("steering stopped: %s", exc)
            self.ctl.close()
            self.ctl = None
            return
        if self.stats is not None:
            self.stats["steer_changes"] += 1

    def undo(self) -> None:
        if self.ctl is None:
            return
        with contextlib.suppress(KernelError):  # the fabric (and the cable) may be gone already
            self.ctl.set([])
        self.ctl.close()


async def amain(args: argparse.Namespace) -> int:
    qos = partitions = None
    if args.qos:  # imported only when given (start-up)
        from ibemu.sm.qos import SmQos

        qos = SmQos.from_json(args.qos)
    if args.partitions:
        from ibemu.sm.partitions import SmPartitions

        partitions = SmPartitions.from_json(args.partitions)
    events = EventLog(args.events)
    client = await UmadClient.connect(args.ns, sockname=args.sockname, issm=True)
    cfg = SmConfig(engine=args.engine, max_in_flight=args.max_in_flight, timeout_s=args.timeout,
                   retries=args.retries, sweep_interval_s=args.sweep_interval, state_path=args.state,
                   dump_dir=args.dump_dir,
                   qos=qos, m_key=args.m_key,
                   m_key_protect=args.m_key_protect, m_key_lease_s=args.m_key_lease,
                   partitions=partitions,
                   local_failover=not args.no_local_failover, priority=args.priority,
                   poll_interval_s=args.poll_interval, poll_retries=args.poll_retries)
    umad = UmadPort(client)
    port: UmadPort | DirectPort = DirectPort.open(umad, args.ns, *parse_direct(args.direct)) if args.direct else umad
    steering = _Steering(args.ns, parse_direct(args.direct)[0]) if args.direct else None
    sm = SubnetManager(port, cfg, route_fn=load_route_fn(args.route_fn), events=events)
    try:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as n:
                if isinstance(port, DirectPort):
                    await n.start(port.serve)
                    if steering is not None:
                        sm.offload = steering.offload
                        n.start_soon(steering.start, port, sm.up)
                n.start_soon(sm.serve)
                n.start_soon(lagmon.watch_from_env, "sm")  # in a run: its lag behind the clock

                async def stop() -> None:
                    async for _sig in signals:
                        n.cancel_scope.cancel()
                        return

                n.start_soon(stop)
                n.start_soon(_freeze_after_up, sm)
    finally:
        port_stats = {**port.stats, **port.wake_summary()} if isinstance(port, DirectPort) else {}
        events.emit(Kind.SM_STOP, sweeps=sm.sweeps, smps=dict(sm.transport.stats), stats=dict(sm.stats),
                    port=port_stats)
        events.close()
        if isinstance(port, DirectPort):
            port.close()
        if steering is not None:
            steering.undo()
        client.close()
    return 0


SWITCH_INTERVAL_S = 0.0005
"""The GIL's hand-over interval here (Python's default is 5 ms): a helper thread (the LFT
snapshot writer) must not hold up the event loop for milliseconds in a reroute."""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    check_dump_dir(args.dump_dir)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return run_trio(amain, args)


if __name__ == "__main__":
    sys.exit(main())
