#!/usr/bin/env python3
"""Compile the modules of ``ibemu.native.MODULES`` with mypyc into C extensions next to their
sources (``make native``; see ``ibemu/native.py``). ``--clean`` removes them.

Without mypyc (a dev dependency: ``pip install -e '.[lint]'``) or a C compiler, says so and
exits 0: the sources run instead, the same code, slower. The intermediate C and objects go to
``build/mypyc`` (ignored by git).

Usage: python scripts/build_native.py [--clean]
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ["IBEMU_NATIVE"] = "0"  # (ibemu imported for its list only)

from ibemu.native import GROUP, MODULES, extension, group_library, source  # noqa: E402


def built() -> list[Path]:
    out = [e for m in MODULES if (e := extension(m)) is not None]
    lib = group_library()
    return out + ([lib] if lib is not None else [])


def main() -> int:
    if "--clean" in sys.argv[1:]:
        for path in built():
            path.unlink()
        shutil.rmtree(ROOT / "build" / "mypyc", ignore_errors=True)
        return 0
    try:
        from mypyc.build import mypycify
        from setuptools import Distribution
    except ImportError as exc:
        print(f"build_native: {exc}: the hot path runs interpreted", file=sys.stderr)
        return 0
    if shutil.which(os.environ.get("CC", "cc")) is None:
        print("build_native: no C compiler: the hot path runs interpreted", file=sys.stderr)
        return 0
    os.chdir(ROOT)  # mypycify takes paths relative to here, and the build writes in place
    paths = [str(source(m).relative_to(ROOT)) for m in MODULES]
    exts = mypycify(paths, opt_level="3", group_name=GROUP, target_dir="build/mypyc")
    # (not setuptools.setup(): it would read pyproject.toml, which describes the package)
    dist = Distribution({"name": "ibemu-native", "ext_modules": exts})
    cmd = dist.get_command_obj("build_ext")
    cmd.inplace = True  # type: ignore[attr-defined]
    cmd.build_temp = "build/mypyc/temp"  # type: ignore[attr-defined]
    cmd.build_lib = "build/mypyc/lib"  # type: ignore[attr-defined]
    dist.run_command("build_ext")
    # The build is current now. build_ext leaves an extension whose C did not change (an edit
    # to a docstring or a comment) untouched, with its old time, which ``native.stale`` would
    # then take for a build older than the edit, and run the sources for ever.
    for path in built():
        os.utime(path)
    print(f"build_native: {len(MODULES)} modules compiled: {', '.join(MODULES)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
