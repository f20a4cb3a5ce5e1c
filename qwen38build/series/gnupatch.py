"""GNU patch, the definition of "applies": ``patch -p1 --fuzz 0 --forward --batch``.

Runs it in a scrubbed environment and reads its report into per-hunk results, so a failure
can name the patch, the file, the hunk and its line, and whether the hunk's context is
elsewhere in the file.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from qwen38build.errors import PatchFailed
from qwen38build.proc import run
from qwen38build.series.diff import Hunk
from qwen38build.series.patchfile import PatchFile

_FILE_RE = re.compile(r"^(?:patching|checking) file '?(?P<path>.+?)'?$")
_OK_RE = re.compile(
    r"^Hunk #(?P<n>\d+) succeeded at (?P<line>\d+)(?: \(offset (?P<off>-?\d+) lines?\))?"
)
_FAIL_RE = re.compile(r"^Hunk #(?P<n>\d+) FAILED at (?P<line>\d+)")


def patch_program() -> str:
    prog = shutil.which("patch")
    if prog is None:
        raise PatchFailed(
            "GNU patch is not on PATH; the series is applied with it.",
            hint="install it (Debian: apt-get install patch)",
        )
    return prog


def scratch_parent() -> str | None:
    """Where scratch trees for GNU patch go: ``$TMPDIR`` when set, else ``/dev/shm`` where
    it is a writable directory, else the system default (None).

    A scratch tree is a few dozen small files made and removed within a second; on a busy
    disk removing one directory was measured at about 10 ms, in memory at 0.2 ms.
    """
    import os

    if os.environ.get("TMPDIR"):
        return None  # tempfile honours it
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None


@dataclass(frozen=True)
class HunkResult:
    file: str
    number: int  # 1-based, as GNU patch counts hunks within a file
    applied: bool
    line: int  # where it applied, or where it was tried
    offset: int = 0


@dataclass
class ApplyResult:
    ok: bool
    reversed: bool  # GNU patch detected the patch as already applied
    output: str
    hunks: list[HunkResult] = field(default_factory=list)
    # files GNU patch skipped whole ("Skipping patch": none of their hunks was tried)
    skipped: frozenset[str] = frozenset()

    @property
    def offsets(self) -> list[HunkResult]:
        return [h for h in self.hunks if h.applied and h.offset]

    @property
    def failed(self) -> list[HunkResult]:
        return [h for h in self.hunks if not h.applied]


def release() -> str:
    """The release of the GNU patch on PATH (``2.7.6``), from its ``--version``."""
    said = run([patch_program(), "--version"], what="GNU patch",
               hint="install it (Debian: apt-get install patch)").stdout
    first = (said.splitlines() or [""])[0]
    return first.rsplit(" ", 1)[-1] if first.startswith("GNU patch ") else first or "unknown"


def require_release(want: str) -> None:
    """PatchFailed unless the GNU patch on PATH is release ``want`` (the recipe's): the
    patch step's digest names that release, so another one must not make its bytes."""
    got = release()
    if got != want:
        raise PatchFailed(
            f"GNU patch {got} is on PATH, but the recipe's [toolchain] gnu_patch is {want}.",
            hint=f"put GNU patch {want} on PATH, or set gnu_patch = \"{got}\" in "
            "recipe.toml (a new release changes the patch step's digest)")


def run_patch(
    patch: Path, directory: Path, *, reverse: bool = False, dry_run: bool = False
) -> ApplyResult:
    """Apply (or reverse, or dry-run) one patch file inside ``directory``."""
    args = [
        patch_program(), "-p1", "--fuzz", "0", "--batch", "--no-backup-if-mismatch",
        "--reject-file=-", "-d", str(directory), "-i", str(patch.resolve()),
    ]
    args.append("--reverse" if reverse else "--forward")
    if dry_run:
        args.append("--dry-run")
    proc = run(args, what="GNU patch", hint="install it (Debian: apt-get install patch)")
    out = proc.stdout + proc.stderr
    return ApplyResult(
        ok=proc.ok,
        reversed="Reversed (or previously applied) patch detected" in out,
        output=out,
        hunks=parse_report(out),
        skipped=skipped_files(out),
    )


def parse_report(out: str) -> list[HunkResult]:
    """GNU patch's stdout → one result per hunk it mentions (exact hits print nothing)."""
    results: list[HunkResult] = []
    current = ""
    for line in out.splitlines():
        if m := _FILE_RE.match(line):
            current = m.group("path")
        elif m := _OK_RE.match(line):
            results.append(
                HunkResult(current, int(m.group("n")), True, int(m.group("line")),
                           int(m.group("off") or 0))
            )
        elif m := _FAIL_RE.match(line):
            results.append(HunkResult(current, int(m.group("n")), False, int(m.group("line"))))
    return results


def skipped_files(out: str) -> frozenset[str]:
    """The files of GNU patch's report that it skipped whole (a missing file, say)."""
    found: set[str] = set()
    current = ""
    for line in out.splitlines():
        if m := _FILE_RE.match(line):
            current = m.group("path")
        elif "Skipping patch" in line and current:
            found.add(current)
    return frozenset(found)


def context_elsewhere(hunk: Hunk, target: Path) -> list[int]:
    """1-based lines of ``target`` where the lines the hunk removes stand (exactly).

    At fuzz 0 GNU patch already tries every offset for the whole hunk, so a failed hunk's
    full context is nowhere; what helps is where the changed lines went.
    """
    want = [ln[1:] for ln in hunk.lines if ln[:1] == "-"] or hunk.old_lines
    if not want:
        return []
    try:
        have = target.read_text(encoding="utf-8", errors="surrogateescape").split("\n")
    except FileNotFoundError:
        return []
    n = len(want)
    return [i + 1 for i in range(len(have) - n + 1) if have[i : i + n] == want]


def describe_failure(pf: PatchFile, result: ApplyResult, tree: Path) -> PatchFailed:
    """A sentence per failed hunk: patch, file, hunk, line, and where its context is."""
    lines = []
    for h in result.failed:
        hunk = hunk_of(pf, h)
        where = ""
        if hunk is not None:
            found = context_elsewhere(hunk, tree / h.file)
            if found:
                where = "; the lines it changes stand at line " + ", ".join(
                    map(str, found)
                ) + " of the file, with other context around them"
            else:
                where = "; the lines it changes are nowhere in the file (upstream changed them)"
            where += f" [{pf.path.name}:{hunk.patch_line}]"
        lines.append(f"  {h.file}: hunk #{h.number} at line {h.line} FAILED{where}")
    if result.reversed:
        lines.append("  GNU patch says it looks already applied (reversed patch detected)")
    if not lines:
        lines.append("  " + (result.output.strip().splitlines() or ["no output"])[-1])
    return PatchFailed(
        f"patch {pf.path.name} does not apply at fuzz 0:\n" + "\n".join(lines),
        hint="re-cut the topic against the pinned tree (qwen38build workspace) and export it",
    )


def hunk_of(pf: PatchFile, h: HunkResult) -> Hunk | None:
    """The hunk of ``pf`` that GNU patch's report line ``h`` speaks of (file, number)."""
    for f in pf.files:
        if h.file in (f.new_path, f.old_path):
            return f.hunks[h.number - 1] if h.number <= len(f.hunks) else None
    return None
