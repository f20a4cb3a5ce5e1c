"""tree-patch: one diff applied at fuzz 0 to a source tree (FA2's ``fp8-kv.diff``).

The output is the whole tree after patching, so what compiles from it needs nothing else.
A hunk that does not apply fails the step by name, as a patch of the series does.
"""

from __future__ import annotations

import shutil

from qwen38build.engine.executor import Context
from qwen38build.series.gnupatch import describe_failure, require_release, run_patch
from qwen38build.series.patchfile import PatchFile
from qwen38build.steps import ENGINE

KIND = "tree-patch"
IMPLEMENTATION = (
    *ENGINE,
    "qwen38build.series.diff",
    "qwen38build.series.gnupatch",
    "qwen38build.series.headers",
    "qwen38build.series.patchfile",
)


def run(ctx: Context) -> None:
    require_release(str(ctx.step.params["gnu_patch"]))
    tree = ctx.dep_entry("tree")
    work = ctx.scratch / "tree"
    for name in sorted(tree.outputs):
        dest = work / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(tree.file(name), dest)
    (diff_name, _), = ctx.step.inputs
    pf = PatchFile.parse(ctx.input_path(diff_name))
    ctx.report(f"applying {diff_name}")
    result = run_patch(pf.path, work)
    if not result.ok:
        raise describe_failure(pf, result, work)
    for child in sorted(work.iterdir()):
        child.rename(ctx.out / child.name)
