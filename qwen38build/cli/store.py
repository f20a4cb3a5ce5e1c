"""``gc`` and ``store verify``: keeping the store small and proving it intact."""

from __future__ import annotations

import sys

from qwen38build.cli import stages
from qwen38build.errors import CheckFailed, ExitCode

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse


def cmd_gc(args: argparse.Namespace) -> int:
    from qwen38build.store.gc import collect

    report = collect(stages.open_store(args), dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    shown = [("tmp/" + f.path if f.kind == "tmp" else f.name or "(no readable record)",
              "(its owner is dead)" if f.kind == "tmp" else f"{f.kind or '?'} {f.path}",
              f.size) for f in report.freed]
    width = max((len(what) for what, _, _ in shown), default=0)
    lines = [f"{verb} {what:<{width}}  {_size(size):>9}  {rest}" for what, rest, size in shown]
    count = len(report.freed)
    lines.append(f"{'would free' if args.dry_run else 'freed'} {_size(report.total)} in {count} "
                 f"entr{'y' if count == 1 else 'ies'}" if count else "nothing to remove")
    stages.emit(args, {"dry_run": args.dry_run, "removed": [f.as_json() for f in report.freed],
                       "bytes": report.total, "problems": report.problems}, "\n".join(lines))
    for problem in report.problems:
        print(f"warning: {problem}", file=sys.stderr)
    return ExitCode.OK


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def cmd_store_verify(args: argparse.Namespace) -> int:
    from qwen38build.store.check import damage, verify

    found = verify(stages.open_store(args))
    bad = damage(found)
    lines = [*map(str, found), *([] if bad else ["every store entry is intact"])]
    stages.emit(args, {"ok": not bad, "findings": [f.as_json() for f in found]}, "\n".join(lines))
    if bad:
        raise CheckFailed(f"{len(bad)} damaged store entr{'y' if len(bad) == 1 else 'ies'} "
                          "(listed above).",
                          hint="a build removes and rebuilds them; `qwen38build gc` drops "
                          "what no root keeps")
    return ExitCode.OK
