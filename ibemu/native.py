"""Compiled twins of the hot pure-Python modules (mypyc), and the way back to the sources.

The live link model (``physics.live`` and the modules it runs on) and the switches'
forwarding fast path (``agents.forwarder``, ``agents.lft``) do plain integer bookkeeping per
frame and hop, and in the interpreter that was most of the IB user datapath's CPU time
(the model ~60% of the forwarding thread, the forwarder ~10%: py-spy,
``benchmarks/bench_user_datapath.py --profile``); the RoCE user datapath's routers
(``roce.userplane`` with ``kernel.fib``, and ``roce.linkframes``) likewise. ``make native``
(which ``scripts/setup.sh`` runs) compiles the modules of
:data:`MODULES`, unchanged, with mypyc (it ships with mypy; a C compiler and Python's headers
are needed) into C extensions next to their sources (``scripts/build_native.py``). Python
imports an extension module before a source file of the same name, so where they are built
they are what runs, and where not (no compiler, a fresh checkout) the sources run: the same
code, slower. The trace digests of ``tests/unit/physics/test_live_trace.py`` hold for both
(``tests/unit/test_native.py`` plays them with the sources when the twins are built).

``IBEMU_NATIVE=0`` in the environment makes a process import the sources even where the
twins are built (:func:`prefer_sources`, installed by ``ibemu/__init__`` through
:func:`choose`): to compare, or to debug with the interpreter's tools. Where a source was
edited after the build (:func:`stale`), the sources run too, with a warning, until ``make
native`` again: a test or a benchmark never runs compiled code older than what it reads. All
of the group or none: a compiled module calls the others' compiled code directly.

What mypyc changes at runtime: the classes of these modules are native (no attributes
beyond those declared, methods cannot be replaced on an instance, no subclass outside the
compiled modules) and the annotations are checked as values are stored (a wrong type raises
``TypeError`` where the interpreter would carry it on).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

MODULES: tuple[str, ...] = (
    "ibemu.physics.qos",
    "ibemu.physics.link",
    "ibemu.physics.model",
    "ibemu.physics.live",
    "ibemu.agents.lft",
    "ibemu.agents.forwarder",
    "ibemu.fabric.linkframes",
    "ibemu.kernel.fib",
    "ibemu.roce.userplane",
    "ibemu.roce.linkframes",
)
"""The modules compiled, in one group (calls between them are C calls): the link model, and
the switches' LFT and forwarding decision (``Forwarder.forward_run``, every frame's), and
the IB user datapath's hand-in of frames to the model and hand-over of the departures between
switches (``fabric.linkframes``); the RoCE user datapath's routers (``roce.userplane``: checks,
FIB lookup and ECMP in ``kernel.fib``, TTL, MACs) and its hand-in of frames to the model and
hand-over of the departures (``roce.linkframes``)."""
GROUP = "ibemu.physics._native"
"""The group's shared library (``ibemu/physics/_native__mypyc*.so``)."""
ROOT = Path(__file__).resolve().parents[1]

log = logging.getLogger(__name__)
_why = "not built (make native)"
"""Why the sources run where they do (for :func:`status`)."""


def source(module: str) -> Path:
    return ROOT / (module.replace(".", "/") + ".py")


def extension(module: str) -> Path | None:
    """The built extension of ``module`` next to its source, if any."""
    src = source(module)
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = src.with_suffix(suffix)
        if path.exists():
            return path
    return None


def group_library() -> Path | None:
    """The group's shared library (the per-module extensions are stubs that load it)."""
    base = ROOT / GROUP.replace(".", "/")
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = base.with_name(base.name + "__mypyc" + suffix)
        if path.exists():
            return path
    return None


def compiled(module: ModuleType | str) -> bool:
    """Whether ``module`` (imported, or its name) runs compiled in this process."""
    if isinstance(module, str):
        module = sys.modules.get(module) or importlib.import_module(module)
    return not (getattr(module, "__file__", None) or "").endswith(".py")


def stale() -> list[str]:
    """Modules whose extension is older than their source (built before an edit)."""
    lib = group_library()
    built = lib.stat().st_mtime if lib is not None else None
    return [m for m in MODULES if extension(m) is not None
            and (built is None or built < source(m).stat().st_mtime)]


def status() -> str:
    """One line: which of :data:`MODULES` run compiled here (for the benchmarks' output)."""
    done = [m for m in MODULES if compiled(m)]
    if not done:
        return f"hot path interpreted ({_why})"
    return f"hot path compiled (mypyc: {len(done)} of {len(MODULES)} modules)"


def choose() -> None:
    """At ``ibemu``'s import: the sources instead of the compiled twins when
    ``IBEMU_NATIVE=0`` or when a source is newer than the build (module docstring)."""
    global _why
    if os.environ.get("IBEMU_NATIVE") == "0":
        _why = "IBEMU_NATIVE=0"
        prefer_sources()
        return
    old = stale()
    if old:
        _why = f"the build is older than {', '.join(old)}: make native"
        log.warning("ibemu: the compiled hot path is older than %s: running the sources (make native)",
                    ", ".join(old))
        prefer_sources()


class _Sources(importlib.abc.MetaPathFinder):
    """Finds the modules of :data:`MODULES` as their source files only."""

    def __init__(self, modules: Sequence[str]) -> None:
        self.modules = set(modules)

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.modules:
            return None
        src = source(fullname)
        return importlib.util.spec_from_file_location(fullname, src) if src.exists() else None


def prefer_sources(modules: Sequence[str] = MODULES) -> None:
    """Import ``modules`` from their sources from now on (before anything imported them)."""
    if not any(isinstance(f, _Sources) for f in sys.meta_path):
        sys.meta_path.insert(0, _Sources(modules))
