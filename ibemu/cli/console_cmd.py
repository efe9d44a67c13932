"""`ibemu cli [SCENARIO]`: build a fabric and talk to it from a Mininet-style console.

The fabric is built exactly as ``ibemu up`` builds it (its daemon keeps running while the
console is open); ``exit``, Ctrl-D or an error tears it down. Commands::

    nodes | links | dump                  what is there (links with each end's carrier, dump with LIDs)
    h1 perf write_bw h3 [-s 4096 ...]     perftest: server in h3, client in h1, the client's table
    link edge0_0 agg0_0 down|up           a cable, by its two nodes, one end (agg0_0:4) or both
    switch agg1_0 down|up                 every port of a switch; back up it is a fresh device
    sm routes [SW] | sm path h1 h15 | sm events [--tail N]   ibemu's SM, as `ibemu sm`
    NODE CMD...                           a shell command in the node's namespace (h1 ip -br link)

Faults go through the fabric daemon's control channel (:mod:`ibemu.fabric.control`), so each
is stamped in the run's event log like a scheduled one. Mininet's own ``mininet.cli.CLI`` is
not reused: it drives a ``Mininet`` object (a persistent shell per node through ``mnexec``,
``configLinkStatus``, IP-based ping/iperf) and runs its loop from its constructor; this console
keeps Mininet's command names and behaviour on :class:`cmd.Cmd`, which CLI subclasses too.
"""

from __future__ import annotations

import argparse
import cmd
import json
import selectors
import shlex
import subprocess
import sys
from typing import IO, Any, Protocol

from ibemu import clock
from ibemu.cli.fabric_cmd import add_fabric_arguments
from ibemu.errors import ConfigError, IbemuError
from ibemu.fabric.session import Session, link_request, switch_request
from ibemu.topo import Topology

PROMPT = "ibemu> "
PERF_WAIT_S = 30.0


class Backend(Protocol):
    """What the console does to a live fabric (a fake one in unit tests)."""

    def fault(self, request: dict[str, Any]) -> dict[str, Any]: ...
    def sm(self, argv: list[str]) -> int: ...
    def shell(self, node: str, command: str) -> int: ...
    def perf(self, client: str, test: str, server: str, options: list[str]) -> int: ...
    def carrier_down(self) -> set[str]: ...
    def lids(self) -> dict[str, int]: ...
    def namespace(self, node: str) -> str: ...


# ---------------------------------------------------------------------- parsing (pure)


def perf_call(topo: Topology, client: str, args: list[str]) -> tuple[str, str, list[str]]:
    """``write_bw h3 -s 4096`` typed after ``h1 perf`` -> (test, server, client options)."""
    from ibemu.cli.perf_cmd import TESTS

    if len(args) < 2 or args[0] not in TESTS:
        raise ConfigError(f"usage: HOST perf TEST SERVER [options]; TEST is one of {', '.join(TESTS)}")
    test, server, options = args[0], args[1], args[2:]
    for name in (client, server):
        if name not in topo.nodes or not topo.node(name).is_ca:
            raise ConfigError(f"{name} is not a host of this fabric")
    if client == server:
        raise ConfigError("the server must be another host")
    return test, server, options


# ---------------------------------------------------------------------- the console


class Console(cmd.Cmd):
    """Mininet's command set on an ibemu fabric."""

    prompt = PROMPT
    intro = "ibemu console: `help` lists the commands, `exit` or Ctrl-D tears the fabric down."

    def __init__(self, topo: Topology, backend: Backend, *, run_id: str = "",
                 stdin: IO[str] | None = None, stdout: IO[str] | None = None) -> None:
        super().__init__(stdin=stdin, stdout=stdout)
        self.topo, self.backend, self.run_id = topo, backend, run_id
        if stdin is not None and not stdin.isatty():
            self.use_rawinput = False

    def _out(self, text: str) -> None:
        self.stdout.write(text + "\n")
        self.stdout.flush()

    def onecmd(self, line: str) -> bool:
        try:
            return bool(super().onecmd(line))
        except (IbemuError, OSError) as exc:
            self._out(f"*** {exc}")
            return False

    def emptyline(self) -> bool:  # Mininet: Enter does not repeat the last command
        return False

    def do_nodes(self, _line: str) -> None:
        """List all nodes."""
        names = [n.name for n in self.topo.switches()] + [n.name for n in self.topo.cas()]
        self._out("available nodes are: \n" + " ".join(names))

    def do_links(self, _line: str) -> None:
        """List every cable with each end's carrier (OK / MISSING, as Mininet)."""
        down = self.backend.carrier_down()
        for link in self.topo.links:
            ends = [self.topo.ifname(ep.node, ep.port) for ep in link.ends]
            self._out(f"{ends[0]}<->{ends[1]} ({' '.join('MISSING' if e in down else 'OK' for e in ends)})")

    def do_dump(self, _line: str) -> None:
        """Every node with its namespace, ports and LID (LIDs from ibemu's SM)."""
        lids = self.backend.lids()
        for node in [*self.topo.switches(), *self.topo.cas()]:
            kind = "Switch" if node.is_switch else "Host"
            cabled = sum(1 for p in node.port_range if self.topo.link_at(node.name, p) is not None)
            lid = lids.get(node.name)
            self._out(f"<{kind} {node.name}: ns={self.backend.namespace(node.name)} ports={cabled}/"
                      f"{node.num_ports} guid={node.guid:#018x} lid={lid if lid else '-'}>")

    def do_link(self, line: str) -> None:
        """link NODE1 NODE2 up|down, or link NODE:PORT up|down: take a cable down or up."""
        self._fault(link_request(self.topo, line.split()))

    def do_switch(self, line: str) -> None:
        """switch SWITCH up|down: every port of a switch down (agent silent), or back as a fresh device."""
        self._fault(switch_request(self.topo, line.split()))

    def _fault(self, request: dict[str, Any]) -> None:
        reply = self.backend.fault(request)
        if not reply.get("ok"):
            self._out(f"*** {reply.get('error', 'the daemon refused')}")
            return
        target = reply.get("link") or reply.get("switch") or ""
        self._out(f"{request['fault']} {target}: injected (t_fault {reply.get('t_fault_ns')} ns)")

    def do_sm(self, line: str) -> None:
        """sm routes [SWITCH] | sm path SRC DST | sm events [--kind K] [--tail N]: ibemu's SM."""
        self.backend.sm(shlex.split(line))

    def do_exit(self, _line: str) -> bool:
        """Exit (the fabric is torn down)."""
        return True

    do_quit = do_exit

    def do_EOF(self, _line: str) -> bool:
        """Exit on Ctrl-D."""
        self._out("")
        return True

    def default(self, line: str) -> None:
        """NODE perf ... or NODE CMD...: Mininet's per-node commands."""
        first, _, rest = line.strip().partition(" ")
        if first not in self.topo.nodes:
            self._out(f"*** Unknown command: {line}")
            return
        words = shlex.split(rest)
        if words[:1] == ["perf"]:
            test, server, options = perf_call(self.topo, first, words[1:])
            self.backend.perf(first, test, server, options)
        elif not rest.strip():
            self._out(f"*** usage: {first} CMD...  (a shell command in {first}'s namespace)")
        else:
            self.backend.shell(first, rest)

    def completenames(self, text: str, *ignored: Any) -> list[str]:
        return super().completenames(text, *ignored) + [n for n in self.topo.nodes if n.startswith(text)]

    def do_help(self, arg: str) -> bool | None:
        """List the commands, or describe one."""
        super().do_help(arg)
        if not arg:
            self._out("Per node (Mininet style):\n  NODE CMD...            a shell command in the node's namespace"
                      "\n  HOST perf TEST SERVER  perftest between two hosts, e.g. h1 perf write_bw h3 -s 4096\n")
        return None


# ---------------------------------------------------------------------- the live fabric


class LiveFabric:
    """The console's ``Backend`` on a ``Session`` (a fabric its daemon keeps running)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.run_id, self.run_dir, self.topo = session.run_id, session.run_dir, session.topology

    def namespace(self, node: str) -> str:
        return self.session.namespace(node)

    def _in_ns(self, node: str, argv: list[str]) -> tuple[list[str], dict[str, str]]:
        return self.session.command(node, argv)

    def fault(self, request: dict[str, Any]) -> dict[str, Any]:
        return self.session.fault(request)

    def sm(self, argv: list[str]) -> int:
        from ibemu.cli import sm_cmd

        parser = argparse.ArgumentParser(prog="", add_help=False, exit_on_error=False)
        sm_cmd.register(parser.add_subparsers(dest="command"))
        try:
            args = parser.parse_args(["sm", "--run", self.run_id, *argv])
        except (argparse.ArgumentError, SystemExit):
            raise ConfigError("usage: sm routes [SWITCH] | sm path SRC DST | sm events [--tail N]") from None
        sys.stdout.flush()
        return int(args.func(args) or 0)

    def shell(self, node: str, command: str) -> int:
        argv, env = self._in_ns(node, ["sh", "-c", command])
        sys.stdout.flush()
        return subprocess.run(argv, env=env, stdin=subprocess.DEVNULL).returncode

    def perf(self, client: str, test: str, server: str, options: list[str]) -> int:
        ibemu = [sys.executable, "-m", "ibemu.cli.main", "perf", test]
        argv, env = self._in_ns(server, ibemu)
        srv = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
        assert srv.stdout is not None
        try:
            if not self._wait_for(srv, "waiting for a client"):
                print(f"*** the server in {server} did not start")
                return 1
            argv, env = self._in_ns(client, [*ibemu, server, *options])
            sys.stdout.flush()
            rc = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL).returncode
            try:
                out, _ = srv.communicate(timeout=PERF_WAIT_S)
            except subprocess.TimeoutExpired:
                srv.kill()
                out, _ = srv.communicate()
            for line in out.splitlines():
                print(f"[{server}] {line}")
            return rc
        finally:
            if srv.poll() is None:
                srv.kill()
                srv.wait()

    @staticmethod
    def _wait_for(proc: subprocess.Popen[str], marker: str) -> bool:
        assert proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        deadline = clock.monotonic() + PERF_WAIT_S
        try:
            while clock.monotonic() < deadline:
                if not sel.select(timeout=clock.real_s(max(0.0, deadline - clock.monotonic()))):
                    return False
                line = proc.stdout.readline()
                if not line:  # exited: show why
                    return False
                if marker in line:
                    return True
                print(f"[server] {line.rstrip()}")
            return False
        finally:
            sel.close()

    def carrier_down(self) -> set[str]:
        from ibemu.kernel import rtnl

        down: set[str] = set()
        for node in self.topo.nodes.values():
            names = [self.topo.ifname(node.name, p) for p in node.port_range
                     if self.topo.link_at(node.name, p) is not None]
            if names:
                down.update(rtnl.carrier_down(self.namespace(node.name), names))
        return down

    def lids(self) -> dict[str, int]:
        from ibemu.cli.sm_cmd import _name

        path = self.run_dir / "ibemu" / "state.json"
        try:
            snap = json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            return {}
        return {_name(n): int(n["lid"]) for n in snap.get("nodes", {}).values() if n.get("lid")}


def run(args: argparse.Namespace) -> int:
    from ibemu.cli.fabric_cmd import request_from_args, say_up, up_with_progress
    from ibemu.fabric.session import require_root

    require_root("up")
    req = request_from_args(args)
    session = up_with_progress(req)  # raises (leaving nothing) when the fabric does not come up
    say_up(session, req)
    run_id = session.run_id
    try:
        console = Console(session.topology, LiveFabric(session), run_id=run_id, stdin=sys.stdin, stdout=sys.stdout)
        while True:
            try:
                console.cmdloop()
                break
            except KeyboardInterrupt:  # as Mininet: Ctrl-C interrupts a command, not the console
                print("\nInterrupt")
                console.intro = ""
    finally:
        problems = session.down()
        if problems:
            print(f"fabric {run_id}: {'; '.join(problems)} (try `ibemu clean {run_id}`)", file=sys.stderr)
        else:
            print(f"fabric {run_id} down")
    return 1 if problems else 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cli", help="build a fabric and open a Mininet-style console on it",
                       description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog=__doc__.split("\n", 2)[2])
    add_fabric_arguments(p)
    p.set_defaults(func=run)
