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
from qwen38build.errors import InputError
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
    # (series index, label, files by package path): each group's overlay, copied in before
    # its group's first patch (a source group's read from its tree's entry).
    overlays = [(int(at), str(label), _overlay_files(ctx, str(label), rels, folder))
                for at, label, rels, folder in ctx.step.params.get("overlays", [])]
    pristine: dict[str, str | None] = {}
    touched = [rel for pf in patches for rel in pf.touched_paths]
    added = [rel for _, _, rels in overlays for rel in rels]
    wanted = {f"{package}/{rel}": rel for rel in (*touched, *added)}
    # The one extraction routine: every member name checked, nothing written outside work/.
    written = set(extract(wheel, ctx.scratch, wanted))
    for _, label, rels in overlays:
        there = [rel for rel in rels if f"{package}/{rel}" in written]
        if there:
            raise InputError(
                f"the overlay {label} adds {package}/{there[0]}, which the pinned wheel "
                f"already has{f' (and {len(there) - 1} more)' if len(there) > 1 else ''}; an "
                "overlay adds files, a patch changes the package's own.",
                hint="drop the file from the overlay (upstream carries it now) or change the "
                "package's file with a patch of the group")
    for rel in (*added, *touched):
        if rel not in pristine:
            member = f"{package}/{rel}"
            pristine[rel] = sha256_file(work / rel) if member in written else None
    owners: dict[str, list[str]] = {rel: [] for rel in pristine}
    report: list[PatchApplied] = []
    for k, (name, pf) in enumerate(zip(series, patches, strict=True)):
        _copy_overlays(ctx, [o for o in overlays if o[0] == k], work, owners)
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
    _copy_overlays(ctx, [o for o in overlays if o[0] >= len(series)], work, owners)
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
        json.dumps({"package": package, "files": files, "patches": report,
                    "groups": [str(g) for g in ctx.step.params.get("groups", [])]},
                   indent=1, sort_keys=True)
    )
    if not tree.exists():
        tree.mkdir()


def _overlay_files(ctx: Context, label: str, rels: list[str] | None, folder: str | None
                   ) -> dict[str, Path]:
    """An overlay's files by package path: a local one's inputs, or the files below
    ``folder`` of the source tree the step depends on by ``label``."""
    if rels is not None:
        return {str(rel): ctx.input_path(f"{label}/{rel}") for rel in rels}
    tree = ctx.dep_entry(label)
    prefix = "" if folder in (None, ".") else f"{folder}/"
    found = {name[len(prefix):]: tree.file(name) for name in sorted(tree.outputs)
             if name.startswith(prefix)}
    if not found:
        raise InputError(f"the overlay {label}: the source tree holds no file below "
                         f"{folder}/.", hint="fix the group's overlay key (a folder of its "
                         "source tree), or the source's paths")
    links = [rel for rel, path in found.items() if path.is_symlink()]
    if links:  # never followed into the package: a link could name any file of the host
        raise InputError(f"the overlay {label}: {prefix}{links[0]} in the source tree is a "
                         "symbolic link; an overlay holds regular files only.",
                         hint="leave the link out of the source's paths")
    return found


def _copy_overlays(ctx: Context, overlays: list[tuple[int, str, dict[str, Path]]],
                   work: Path, owners: dict[str, list[str]]) -> None:
    """Write each overlay's files into the package tree, owned by the overlay's label."""
    for _, label, files in overlays:
        ctx.report(f"copying {label} ({len(files)} files)")
        for rel, src in files.items():
            dest = work / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(src.read_bytes())
            owners[rel].append(label)


def read_report(out: Path) -> PatchReport:
    data: PatchReport = json.loads((out / REPORT).read_text())
    return data

