"""``lock``, ``env`` and ``reproduce``: the pinned inputs, the stack's venv, a build again."""

from __future__ import annotations

import sys
from pathlib import Path

from qwen38build.cli import stages
from qwen38build.errors import CheckFailed, ExitCode

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse


def cmd_reproduce(args: argparse.Namespace) -> int:
    from qwen38build.engine.report import make_reporter
    from qwen38build.engine.reproduce import reproduce

    result = reproduce(stages.open_store(args), args.build_hash, make_reporter(quiet=args.quiet),
                       keep=args.keep)
    stages.emit(args, result.as_json(), result.text())
    if not result.ok:
        raise CheckFailed(f"build {args.build_hash[:12]} is not reproduced: the differences "
                          "are above.")
    return ExitCode.OK


def cmd_lock(args: argparse.Namespace) -> int:
    from qwen38build.pinning import pylock as envlock
    from qwen38build.pinning.sources import check_lock, lock_all

    loaded = stages.load_recipe(args)
    if args.check:
        check_lock(loaded)
        env = envlock.check(loaded)
        print(f"lock is current for {loaded.path.name} (sources and {env.name})")
        return ExitCode.OK
    path, env = lock_all(loaded, stages.open_store(args))
    print(f"wrote {path}\nwrote {env}")
    return ExitCode.OK


def cmd_env(args: argparse.Namespace) -> int:
    from qwen38build.wheels.venv import make

    made = make(stages.load_recipe(args), stages.open_store(args), Path(args.dir),
                python=args.python, offline=args.offline)  # UV_OFFLINE reaches uv by itself
    if made.note:
        print(f"note: {made.note}", file=sys.stderr)
    stages.emit(args, {"env": str(made.dest), "python": made.python,
                "python_version": made.python_version, "note": made.note,
                "site_packages": str(made.site_packages), "locked_packages": made.packages,
                "wheels": list(made.wheels)},
         f"env {made.dest} (Python {made.python_version}): {made.packages} locked package(s) "
         f"and {', '.join(made.wheels)}; verified {made.site_packages}")
    return ExitCode.OK
