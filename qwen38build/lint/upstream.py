"""The ``fa2-upstream`` rule: FA2's diff applies at fuzz 0 to the tree the recipe pins.

The ledger's ``fa2-upstream`` job, as a rule: the diff is dry-run against a copy of the
pinned tree (the fixed-output source, hash-checked), and each hunk that fails is a finding
at its line of the diff, saying where its context stands now. The build's tree-patch step
fails the same way; this says it before anything is compiled.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from qwen38build.lint.finding import Context, Finding
from qwen38build.series.gnupatch import context_elsewhere, hunk_of, run_patch
from qwen38build.series.patchfile import PatchFile

RULE = "fa2-upstream"


def fa2_upstream(ctx: Context, tree: Path) -> Iterator[Finding]:
    """Findings of FA2's diff against ``tree`` (the pinned, unpatched source)."""
    fa2 = ctx.recipe.fa2
    diff = ctx.root / fa2.diff
    commit = ctx.recipe.sources[fa2.source].commit
    pf = PatchFile.parse(diff, strict=False)
    with tempfile.TemporaryDirectory(prefix="q38-fa2.") as tmp:
        work = Path(tmp) / "tree"
        shutil.copytree(tree, work, symlinks=True)
        result = run_patch(diff, work, dry_run=True)
        for h in result.failed:
            hunk = hunk_of(pf, h)
            found = context_elsewhere(hunk, work / h.file) if hunk is not None else []
            where = (f"its lines stand at line {', '.join(map(str, found))} with other "
                     "context" if found else "its lines are nowhere in the file")
            yield ctx.finding(
                diff, hunk.patch_line if hunk is not None else 1, RULE,
                f"hunk #{h.number} of {h.file} does not apply at fuzz 0 to flash-attention "
                f"{commit[:12]}: {where}.",
                "re-cut the diff against the pinned tree (extract it from the store with "
                "`qwen38build build --only fa2` failing, or the mirror) and regenerate it")
        if result.reversed:
            yield ctx.finding(diff, 1, RULE, f"flash-attention {commit[:12]} already carries "
                              "this diff (GNU patch detects it reversed).",
                              "upstream took it: drop fa2.diff's hunks it carries")
        if not result.ok and not result.failed and not result.reversed:
            last = (result.output.strip().splitlines() or ["no output"])[-1]
            yield ctx.finding(diff, 1, RULE, f"GNU patch refused the diff: {last}.",
                              "regenerate the diff with `git diff` in the pinned tree")
