"""wheel: the patched, installable wheel, written from the pristine one by raw copy.

The local version label is ``<pin>+q38.<first 8 hex of this step's digest>``: it names the
exact inputs, and the same inputs give the same bytes. Before the entry is committed the
written wheel is read back: every patched member's bytes and the RECORD are checked.
``manifest.json`` beside it lists every file of the package with its sha256 and, for the
files the series owns, the patches that own them: ``verify`` and ``apply`` read it.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from qwen38build.engine.executor import Context
from qwen38build.errors import CheckFailed
from qwen38build.steps import patch as patch_step
from qwen38build.wheels import record
from qwen38build.wheels.installed import MANIFEST
from qwen38build.wheels.manifest import Manifest
from qwen38build.wheels.wheelzip import PatchedWheel

KIND = "wheel"
# The patch step's modules (it imports that step), and what writes the wheel.
IMPLEMENTATION = (
    *patch_step.IMPLEMENTATION,
    "qwen38build.steps.patch",
    "qwen38build.wheels.installed",
)
LABEL = "q38"
# `apply` writes the patched files from the patch step's tree: needed beside the wheel.
RUNTIME = ("patched",)


def local_version(version: str, digest: str) -> str:
    return f"{version}+{LABEL}.{digest[:8]}"


def run(ctx: Context) -> None:
    p = ctx.step.params
    name, version, package = str(p["name"]), str(p["version"]), str(p["package"])
    pristine = ctx.dep_entry("wheel").the_output(".whl")
    applied = ctx.dep_entry("patched")  # read by recorded names only, like every dep
    report = patch_step.read_report(applied.file(patch_step.REPORT).parent)
    new_version = local_version(version, ctx.step.digest)
    tags = pristine.name[len(f"{name}-{version}-") : -len(".whl")]
    out_name = f"{name}-{new_version}-{tags}.whl"
    dist_info, new_dist_info = f"{name}-{version}.dist-info", f"{name}-{new_version}.dist-info"

    replace: dict[str, bytes] = {}
    delete: set[str] = set()
    for rel, rec in report["files"].items():
        member = f"{package}/{rel}"
        if rec["patched"] is None:
            if rec["pristine"] is not None:
                delete.add(member)
        else:
            replace[member] = applied.file(f"{patch_step.TREE}/{rel}").read_bytes()

    ctx.report(f"writing {out_name}")
    pw = PatchedWheel(pristine, dist_info, new_dist_info)
    metadata = _relabel(pw.read(f"{dist_info}/METADATA"), version, new_version)
    record = pw.write(
        ctx.out / out_name, replace=replace, delete=delete,
        dist_info_files={"METADATA": metadata},
    )
    _check(ctx.out / out_name, replace, record)
    manifest: Manifest = {
        "name": name,
        "version": version,
        "local_version": new_version,
        "wheel": out_name,
        "package": package,
        "dist_info": new_dist_info,
        "owned": report["files"],
        "patches": report["patches"],
        "groups": report.get("groups", []),
        "record": {k: list(v) for k, v in sorted(record.items())},
    }
    (ctx.out / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))


def _relabel(metadata: bytes, old: str, new: str) -> bytes:
    lines = metadata.split(b"\n")
    for i, line in enumerate(lines):
        if line == f"Version: {old}".encode():
            lines[i] = f"Version: {new}".encode()
            return b"\n".join(lines)
        if not line:
            break
    raise CheckFailed(f"the pristine METADATA has no 'Version: {old}' line; refusing to relabel.")


def _check(wheel: Path, replace: dict[str, bytes], rows: dict[str, tuple[str, int]]) -> None:
    """Read the written wheel back: patched members intact, RECORD covering every member."""
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if not n.endswith("/RECORD")]
        missing = sorted(set(names) ^ set(rows))
        if missing:
            raise CheckFailed(f"{wheel.name}: RECORD and members disagree on {missing[:5]}.")
        for member, data in replace.items():
            if record.hash_of(z.read(member)) != record.hash_of(data):
                raise CheckFailed(f"{wheel.name}: member {member} was not written as patched.")

