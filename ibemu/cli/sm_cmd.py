"""`ibemu sm routes [SWITCH] | path SRC DST | events | dumps [FILE]`: what ibemu's SM decided.

Reads the snapshot the running SM keeps (``--state``, in the run directory) and its event
log. ``routes`` prints LFTs the way ``ibroute`` does, ``path`` walks them from one host to
another the way ``ibtracert`` does. ``dumps`` lists (or prints) the OpenSM-format files the SM
keeps in the run directory (``ibemu.sm.dumps``: ``opensm-subnet.lst``, ``opensm-lfts.dump``,
``guid2lid``), to diff against OpenSM's own.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ibemu.errors import ConfigError
from ibemu.events import read_events


def _run_dir(args: argparse.Namespace) -> Path:
    from ibemu.fabric.session import Session

    state = Session.attach(args.run).state
    sm_dir = state.run_dir / "ibemu"
    if not sm_dir.is_dir():
        raise ConfigError(f"fabric {state.run_id} does not run ibemu's SM (start it with `ibemu up --sm ibemu`)")
    return sm_dir


def _snapshot(args: argparse.Namespace) -> dict[str, Any]:
    path = _run_dir(args) / "state.json"
    if not path.exists():
        raise ConfigError("ibemu's SM has not programmed the fabric yet (no snapshot): try again shortly")
    return dict(json.loads(path.read_text()))


def _name(node: dict[str, Any]) -> str:
    desc = str(node.get("desc", ""))
    return desc[len("ibemu "):] if desc.startswith("ibemu ") else desc.split(" ", 1)[0]


def _find(snap: dict[str, Any], name: str) -> str:
    for guid, node in snap["nodes"].items():
        if name in (_name(node), node.get("desc"), guid):
            return str(guid)
    known = sorted(_name(n) for n in snap["nodes"].values())
    raise ConfigError(f"no node {name!r} in the SM's view ({', '.join(known[:8])}, ...)")


def _by_lid(snap: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {int(n["lid"]): n for n in snap["nodes"].values() if n.get("lid")}


def cmd_routes(args: argparse.Namespace) -> int:
    snap = _snapshot(args)
    owners = _by_lid(snap)
    guids = [_find(snap, args.switch)] if args.switch else sorted(snap["lfts"])
    for guid in guids:
        node = snap["nodes"][guid]
        lft = {int(k): v for k, v in snap["lfts"].get(guid, {}).items()}
        if not node.get("switch"):
            raise ConfigError(f"{args.switch} is not a switch")
        top = max(lft, default=0)
        print(f"Unicast lids [0x0-{top:#x}] of switch Lid {node['lid']} guid {guid} ({node['desc']}) "
              f"[{snap.get('engine')}]:")
        print("  Lid  Out   Destination")
        for lid in sorted(lft):
            dest = owners.get(lid)
            what = f"{'Switch' if dest and dest['switch'] else 'Channel Adapter'}: '{dest['desc']}'" if dest else "?"
            print(f"{lid:#06x} {lft[lid]:03d} : ({what})")
        print(f"{len(lft)} valid lids dumped\n")
    return 0


def cmd_path(args: argparse.Namespace) -> int:
    snap = _snapshot(args)
    src, dst = _find(snap, args.src), _find(snap, args.dst)
    nodes, lfts = snap["nodes"], snap["lfts"]
    dlid = int(nodes[dst]["lid"])
    if not dlid:
        raise ConfigError(f"{args.dst} has no LID yet")
    print(f"From {nodes[src]['desc']} (lid {nodes[src]['lid']}) to {nodes[dst]['desc']} (lid {dlid}):")
    peer = nodes[src]["ports"].get("1")
    hops = 0
    while peer is not None and hops < 64:
        guid, in_port = peer
        node = nodes.get(guid)
        if node is None:
            print("  -> unknown node: the path leaves what the SM knows")
            return 1
        if guid == dst:
            print(f"  -> [{in_port}] {node['desc']} (lid {node['lid']}): arrived after {hops} switches")
            return 0
        out = lfts.get(guid, {}).get(str(dlid))
        if out is None or out == 255:
            print(f"  -> [{in_port}] {node['desc']}: no route to lid {dlid}")
            return 1
        print(f"  -> [{in_port}] {node['desc']} (lid {node['lid']}) [{out}]")
        hops += 1
        peer = node["ports"].get(str(out))
    print("  -> dead end")
    return 1


def cmd_events(args: argparse.Namespace) -> int:
    path = _run_dir(args) / "events.jsonl"
    if not path.exists():
        raise ConfigError("ibemu's SM has written no events yet")
    records = read_events(path)
    if args.kind:
        records = [r for r in records if r.get("kind") in args.kind]
    t0 = records[0]["t_ns"] if records else 0
    for r in records[-args.tail:] if args.tail else records:
        fields = " ".join(f"{k}={v}" for k, v in r.items() if k not in ("kind", "t_ns"))
        print(f"{(r['t_ns'] - t0) / 1e6:12.3f} ms  {r['kind']:<18} {fields}")
    return 0


def cmd_dumps(args: argparse.Namespace) -> int:
    from ibemu.sm import dumps

    sm_dir = _run_dir(args)
    if args.file is not None:
        path = sm_dir / args.file
        if not path.exists():
            raise ConfigError(f"ibemu's SM has not written {args.file} yet (it does after SUBNET UP): try again shortly")
        print(path.read_text(), end="")
        return 0
    present = [sm_dir / name for name in dumps.FILES if (sm_dir / name).exists()]
    if not present:
        raise ConfigError("ibemu's SM has written no dump files yet (it does after SUBNET UP): try again shortly")
    for path in present:
        print(path)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sm", help="what ibemu's subnet manager decided: routes, paths, events")
    p.add_argument("--run", help="run id (when several fabrics run)")
    s = p.add_subparsers(dest="sm_command", metavar="QUERY")
    s.required = True
    r = s.add_parser("routes", help="LFTs as the SM wrote them (like ibroute)")
    r.add_argument("switch", nargs="?", help="one switch (default: all)")
    r.set_defaults(func=cmd_routes)
    pa = s.add_parser("path", help="the path from one host to another through the LFTs (like ibtracert)")
    pa.add_argument("src")
    pa.add_argument("dst")
    pa.set_defaults(func=cmd_path)
    e = s.add_parser("events", help="the SM's event log")
    e.add_argument("--kind", action="append", help="only these kinds (repeatable)")
    e.add_argument("--tail", type=int, default=0, help="only the last N")
    e.set_defaults(func=cmd_events)
    d = s.add_parser("dumps", help="OpenSM-format opensm-subnet.lst, opensm-lfts.dump, guid2lid: their paths, "
                     "or one printed")
    d.add_argument("file", nargs="?", choices=("opensm-subnet.lst", "opensm-lfts.dump", "guid2lid"),
                   help="print this file instead of listing the paths")
    d.set_defaults(func=cmd_dumps)
