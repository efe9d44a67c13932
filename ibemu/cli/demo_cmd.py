"""`ibemu demo`: placeholder until the wire demo lands."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="build and decode a few real IB / RoCEv2 frames")
    p.set_defaults(func=lambda args: 0)
