"""``python -m ibemu.sm``: arguments and the route function it loads."""

from __future__ import annotations

import subprocess
import sys

from ibemu.sm.__main__ import load_route_fn, parse_args
from ibemu.sm.manager import SmConfig, SubnetManager, default_reroute_fn, default_route_fn
from ibemu.sm.transport import DEFAULT_MAX_IN_FLIGHT
from tests.unit.sm.helpers import minhop


def test_arguments_and_defaults() -> None:
    a = parse_args(["--ns", "x-h0", "--engine", "ftree", "--max-in-flight", "8", "--sweep-interval", "2.5"])
    assert (a.ns, a.engine, a.max_in_flight, a.sweep_interval, a.sockname) == ("x-h0", "ftree", 8, 2.5, "sim")
    assert parse_args([]).max_in_flight == DEFAULT_MAX_IN_FLIGHT


def test_route_function_spec() -> None:
    assert load_route_fn(None) is default_route_fn
    assert load_route_fn("tests.unit.sm.helpers:minhop") is minhop


def test_default_routing_also_reroutes_incrementally_an_injected_one_does_not() -> None:
    class Port:
        async def send(self, req: object) -> None: ...
        async def recv(self) -> object: ...

    assert SubnetManager(Port(), SmConfig()).reroute_fn is default_reroute_fn  # type: ignore[arg-type]
    assert SubnetManager(Port(), SmConfig(), route_fn=default_route_fn).reroute_fn is default_reroute_fn  # type: ignore[arg-type]
    assert SubnetManager(Port(), SmConfig(), route_fn=minhop).reroute_fn is None  # type: ignore[arg-type]


def test_help_runs() -> None:
    r = subprocess.run([sys.executable, "-m", "ibemu.sm", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--max-in-flight" in r.stdout


def test_a_dump_dir_that_cannot_be_one_exits_before_attaching(tmp_path) -> None:  # type: ignore[no-untyped-def]
    afile = tmp_path / "afile"
    afile.write_text("x")
    r = subprocess.run([sys.executable, "-m", "ibemu.sm", "--ns", "no-such-ns", "--dump-dir", str(afile / "sub")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and f"--dump-dir {afile / 'sub'}: Not a directory" in r.stderr, r.stderr
    assert parse_args(["--dump-dir", str(tmp_path)]).dump_dir == str(tmp_path)
