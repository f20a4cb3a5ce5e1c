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
    lines = [f"{verb} {d}" for d in report.removed]
    lines += [f"removed tmp/{t} (its owner is dead)" for t in report.tmp_removed]
    print("\n".join(lines) or "nothing to remove")
    for problem in report.problems:
        print(f"warning: {problem}", file=sys.stderr)
    return ExitCode.OK


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
