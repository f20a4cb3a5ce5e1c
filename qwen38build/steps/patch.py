"""patch: apply the series, in order, to the members of the pristine wheel it touches.

Only the files the series names are extracted (a few dozen of 5,000); the output is that
small tree after patching plus ``patch.json``: for each file its pristine and patched sha256
and the patches that own it (in order), and for each patch the hunks that needed an offset.
"""

from __future__ import annotations

import json
from pathlib import Path

from qwen38build.digest import sha256_file
from qwen38build.engine.executor import Context
from qwen38build.series.gnupatch import describe_failure, require_release, run_patch
from qwen38build.series.patchfile import PatchFile
from qwen38build.steps import ENGINE
from qwen38build.wheels.manifest import OwnedFile, PatchApplied, PatchReport
from qwen38build.wheels.wheelzip import extract

KIND = "patch"
IMPLEMENTATION = (
    *ENGINE,
    "qwen38build.wheels.manifest",
    "qwen38build.series.diff",
    "qwen38build.series.gnupatch",
    "qwen38build.series.headers",
    "qwen38build.series.patchfile",
    "qwen38build.wheels.record",
    "qwen38build.wheels.wheelzip",
)
REPORT = "patch.json"
TREE = "tree"


def run(ctx: Context) -> None:
    require_release(str(ctx.step.params["gnu_patch"]))
    package = str(ctx.step.params["package"])
    series = [str(s) for s in ctx.step.params["series"]]
    wheel_entry = ctx.dep_entry("wheel")
    wheel = wheel_entry.the_output(".whl")
    patches = [PatchFile.parse(ctx.input_path(name)) for name in series]
    work = ctx.scratch / package
    work.mkdir(parents=True)
    pristine: dict[str, str | None] = {}
    touched = [rel for pf in patches for rel in pf.touched_paths]
    wanted = {f"{package}/{rel}": rel for rel in touched}
    # The one extraction routine: every member name checked, nothing written outside work/.
    written = set(extract(wheel, ctx.scratch, wanted))
    for rel in touched:
        if rel not in pristine:
            member = f"{package}/{rel}"
            pristine[rel] = sha256_file(work / rel) if member in written else None
    owners: dict[str, list[str]] = {rel: [] for rel in pristine}
    report: list[PatchApplied] = []
    for name, pf in zip(series, patches, strict=True):
        ctx.report(f"applying {name}")
        result = run_patch(pf.path, work)
        if not result.ok:
            raise describe_failure(pf, result, work)
        for f in pf.files:
            owners[f.path].append(name)
            if f.old_path and f.old_path != f.path:
                owners[f.old_path].append(name)
        report.append({
            "patch": name,
            "offsets": [
                {"file": h.file, "hunk": h.number, "line": h.line, "offset": h.offset}
                for h in result.offsets
            ],
        })
    files: dict[str, OwnedFile] = {}
    tree = ctx.out / TREE
    for rel in sorted(pristine):
        src = work / rel
        patched = sha256_file(src) if src.exists() else None
        files[rel] = {"pristine": pristine[rel], "patched": patched, "owners": owners[rel]}
        if patched is not None:
            dest = tree / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(src.read_bytes())
    (ctx.out / REPORT).write_text(
        json.dumps({"package": package, "files": files, "patches": report}, indent=1,
                   sort_keys=True)
    )
    if not tree.exists():
        tree.mkdir()


def read_report(out: Path) -> PatchReport:
    data: PatchReport = json.loads((out / REPORT).read_text())
    return data

