"""The bump report: per patch and per hunk, what the new pin means, as Markdown or JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

from qwen38build.bump.overlay import OverlayInUpstream
from qwen38build.inputs import lock as lockmod
from qwen38build.pinning import pylock as envlock
from qwen38build.pinning.envmove import EnvMove
from qwen38build.series import upstreamed
from qwen38build.workspace.workspace import BRANCH

# -- the report -------------------------------------------------------------------------


Outcome = Literal["clean", "offset", "conflict", "upstreamed", "likely-upstreamed", "deleted",
                  "depends-on-failed"]
APPLIED: frozenset[str] = frozenset({"clean", "offset"})
FAILED: frozenset[str] = frozenset({"conflict", "deleted", "depends-on-failed",
                                    "likely-upstreamed"})
RETIRABLE: frozenset[str] = frozenset({"upstreamed", "likely-upstreamed"})


@dataclass(frozen=True)
class HunkOffset:
    file: str
    hunk: int  # 1-based within the file, as GNU patch counts
    line: int  # where it applied
    offset: int


@dataclass(frozen=True)
class HunkFailure:
    """A hunk that does not apply, and why as far as can be told."""

    file: str
    hunk: int  # 1-based within the file
    patch_line: int  # line of its @@ header in the patch file
    note: str
    upstream_diff: str = ""  # old → new pristine, around the hunk
    depends_on: tuple[str, ...] = ()  # earlier failed patches whose lines it stands on
    evidence: str = ""  # why it looks upstreamed in other words (empty: it does not)
    similarity: float | None = None  # difflib ratio of its change to upstream's
    side_by_side: str = ""  # ours | upstream, where there is evidence
    moved_to: str = ""  # "path:line" of a file new upstream that holds its lines now


@dataclass(frozen=True)
class PatchReport:
    patch: str  # the row name
    file: str  # the patch file, relative to the project root
    outcome: Outcome
    offsets: tuple[HunkOffset, ...] = ()
    failures: tuple[HunkFailure, ...] = ()
    deleted: tuple[str, ...] = ()
    moved_to: dict[str, list[str]] = field(default_factory=dict)
    depends_on: tuple[str, ...] = ()

    def summary(self) -> str:
        if self.outcome == "clean":
            return ""
        if self.outcome == "offset":
            return ", ".join(f"{o.file} #{o.hunk} {o.offset:+d}" for o in self.offsets)
        if self.outcome == "upstreamed":
            return "reverse-applies to the new tree: retire candidate"
        if self.outcome == "likely-upstreamed":
            return "; ".join(
                f"{h.file} #{h.hunk}: {h.evidence} (similarity {h.similarity:.2f})"
                for h in self.failures
            ) + ": retire candidate"
        if self.outcome == "deleted":
            parts = []
            for f in self.deleted:
                moved = self.moved_to.get(f)
                parts.append(f"{f} gone" + (f" (moved to {', '.join(moved)}?)" if moved else ""))
            return "; ".join(parts)
        if self.outcome == "depends-on-failed":
            return "stands on " + ", ".join(self.depends_on)
        return "; ".join(
            f"{h.file} hunk #{h.hunk} (line {h.patch_line})" for h in self.failures
        )


@dataclass(frozen=True)
class RebaseResult:
    """Where the workspace's carry onto the new pin stands."""

    repo: str
    branch: str
    done: tuple[str, ...]  # topics carried, in order
    empty: tuple[str, ...]  # topics whose change is already upstream (empty commits)
    stopped_at: str | None = None  # the topic whose cherry-pick conflicts
    conflict_files: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()  # topics not carried: retired by --retire

    @property
    def ok(self) -> bool:
        return self.stopped_at is None


@dataclass(frozen=True)
class EnvReport:
    """The environment lock re-made for the new pin: what moved, or why it could not be."""

    move: EnvMove | None
    torch: tuple[str, str] | None = None  # recipe [toolchain] torch, old → new
    error: str = ""
    offline: bool = False  # not re-locked: offline, and re-locking asks the index
    cached: bool = False  # the lock a bump made earlier from the same inputs (the store's)

    def to_json(self) -> dict[str, object]:
        return {
            "moved": None if self.move is None else self.move.to_json(),
            "recipe_torch": None if self.torch is None else {"from": self.torch[0],
                                                              "to": self.torch[1]},
            "error": self.error or None,
            "offline": self.offline,
            "cached": self.cached,
        }

    def summary(self) -> str:
        """One line: what moved, or why the lock was not re-made."""
        head = f"Python environment ({lockmod.LOCK_DIR}/{envlock.PYLOCK}): "
        if self.offline or self.error:
            return head + self.lines()[-1]
        m = self.move
        moved = [] if m is None else [f"{n} {a} → {b}" for n, a, b in m.changed[:2]]
        if m is not None:
            rest = len(m.changed) - len(moved)
            moved += [f"{rest} more changed"] if rest else []
            moved += [f"{len(m.added)} added"] if m.added else []
            moved += [f"{len(m.removed)} removed"] if m.removed else []
        return head + (", ".join(moved) or "nothing moved") + (
            f"; recipe torch {self.torch[0]} → {self.torch[1]}" if self.torch else "") + (
            " (locked by an earlier bump from the same inputs)" if self.cached else "")

    def lines(self) -> list[str]:
        out = ["", f"### Python environment ({lockmod.LOCK_DIR}/{envlock.PYLOCK})", ""]
        if self.offline:
            return [*out, "Not re-locked: offline (--offline or QWEN38BUILD_OFFLINE=1), and "
                    "re-locking asks the index; bump again online, or run `qwen38build "
                    "lock` after the bump, to re-lock it."]
        if self.error:
            return [*out, f"Not re-locked: {self.error}"]
        if self.cached:
            out.append("- the lock an earlier bump made from the same inputs (pin, its "
                       "sha256, Python, platform, torch, CUDA, uv and its configuration), "
                       "kept in the store; `qwen38build lock` re-locks afresh")
        if self.torch is not None:
            out.append(f"- recipe [toolchain] torch {self.torch[0]} → {self.torch[1]} "
                       "(what the new pin requires)")
        return out + (self.move.lines() if self.move is not None else [])


@dataclass
class BumpReport:
    old_version: str
    new_version: str
    wheel: lockmod.LockedWheel
    patches: list[PatchReport]
    dry_run: bool
    seconds: float = 0.0
    rebase: RebaseResult | None = None
    retired: tuple[str, ...] = ()  # rows moved to series.retired by --retire
    environment: EnvReport | None = None  # None: the project has no environment lock
    # Series group overlay files the new pin carries (bump.overlay): none may stay.
    overlays: list[OverlayInUpstream] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every patch applies (clean or with offsets) or was retired, and no
        overlay file is one the new pin carries."""
        return not self.overlays and all(
            p.outcome in APPLIED or p.patch in self.retired for p in self.patches)

    def to_json(self) -> dict[str, object]:
        return {
            "from": self.old_version,
            "to": self.new_version,
            "ok": self.ok,
            "dry_run": self.dry_run,
            "seconds": round(self.seconds, 3),
            "wheel": asdict(self.wheel),
            "patches": [asdict(p) for p in self.patches],
            "retired": list(self.retired),
            "rebase": None if self.rebase is None else {
                **asdict(self.rebase), "ok": self.rebase.ok,
            },
            "environment": None if self.environment is None else self.environment.to_json(),
            "overlays": [asdict(o) for o in self.overlays],
        }

    def counts(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for p in self.patches:
            found[p.outcome] = found.get(p.outcome, 0) + 1
        return found

    def headline(self) -> str:
        return (f"vllm {self.old_version} → {self.new_version}: "
                + ", ".join(f"{n} {k}" for k, n in self.counts().items())
                + (" (dry run: recipe and lock untouched)" if self.dry_run else
                   f" (recipe.toml and lock/ now pin {self.new_version}; `build` needs every "
                   "patch to apply)" if not self.ok else
                   f" (recipe.toml and lock/ now pin {self.new_version})"))

    def upstream_refs(self) -> dict[str, str]:
        """Each distinct upstream diff once, named U1, U2, ... in order of first use."""
        refs: dict[str, str] = {}
        for p in self.patches:
            for h in p.failures:
                if h.upstream_diff and h.upstream_diff not in refs:
                    refs[h.upstream_diff] = f"U{len(refs) + 1}"
        return refs

    def to_markdown(self) -> str:
        """The whole report: the table with what to do next, each failing hunk, and each
        upstream diff once (linked from the hunks that need it)."""
        refs = self.upstream_refs()
        out = [self.headline(), "", "| # | patch | outcome | detail | next |",
               "|---|---|---|---|---|"]
        for i, p in enumerate(self.patches, 1):
            detail = p.summary().replace("|", "\\|")
            step = next_step(p, refs).replace("|", "\\|")
            out.append(f"| {i} | {p.patch} | {p.outcome} | {detail} | {step} |")
        for p in self.patches:
            shown = [h for h in p.failures
                     if p.outcome in ("conflict", "depends-on-failed", "likely-upstreamed")]
            if not shown:
                continue
            out += ["", f"### {p.patch} ({p.outcome})"]
            for h in shown:
                out += ["", f"- {h.file} hunk #{h.hunk} ({p.file}:{h.patch_line}): {h.note}"]
                if h.similarity is not None and not h.side_by_side:
                    out[-1] += (f" (similarity to upstream's change {h.similarity:.2f}, "
                                f"below {upstreamed.THRESHOLD})")
                if h.side_by_side:
                    out += ["", f"similarity {h.similarity:.2f} (threshold "
                            f"{upstreamed.THRESHOLD}):", "", "```", h.side_by_side, "```"]
                if h.upstream_diff:
                    ref = refs[h.upstream_diff]
                    out += ["", f"upstream's change here: [{ref}](#{ref.lower()})"]
        out += self._closing()
        if self.environment is not None:
            out += self.environment.lines()
        if refs:
            out += ["", "## Upstream diffs (old pin → new pin, around the failing hunks)"]
            for diff, ref in refs.items():
                first = diff.split("\n", 1)[0].removeprefix("--- a/").removeprefix("--- ")
                out += ["", f'<a id="{ref.lower()}"></a>', "", f"### {ref}: {first}", "",
                        "```diff", diff.rstrip("\n"), "```"]
        return "\n".join(out) + "\n"

    def to_screen(self, report_path: str | None = None) -> str:
        """What a terminal shows: the counts per outcome with what each asks, one line per
        patch of what to do next, and where the whole report (every diff) is."""
        refs = self.upstream_refs()
        counts = self.counts()
        out = [self.headline(), "", f"{'outcome':<18} {'patches':>7}  what to do"]
        out += [f"{k:<18} {n:>7}  {NEXT[k]}" for k, n in counts.items()]
        if any(p.failures for p in self.patches):
            out += ["", "(#H@L: the file's hunk H, at line L of the patch file; (U1): the "
                    "upstream diff U1 in the report)"]
        out.append("")
        width = max((len(p.patch) for p in self.patches), default=0)
        owidth = max((len(p.outcome) for p in self.patches), default=0)
        for i, p in enumerate(self.patches, 1):
            out.append(f"{i:>3} {p.patch:<{width}}  {p.outcome:<{owidth}}  "
                       f"{next_step(p, refs)}")
        if self.environment is not None:
            out += ["", self.environment.summary()]
        out += self._closing()
        if report_path is not None:
            lines = self.to_markdown().count("\n")
            out += ["", f"Full report ({lines} lines: every failing hunk, each upstream diff "
                    f"once): {report_path}"]
        return "\n".join(out) + "\n"

    def _closing(self) -> list[str]:
        """Overlay files upstream carries, retirement, the workspace's carry, and the next
        command."""
        out: list[str] = []
        if self.overlays:
            out += ["", "Overlay files the new pin carries (the build refuses an overlay "
                    "file the wheel has):"]
            out += [f"- {o.line(self.new_version)}" for o in self.overlays]
        retire = [p.patch for p in self.patches if p.outcome in RETIRABLE]
        if self.retired:
            out += ["", f"Retired: {', '.join(self.retired)} (series.retired, files deleted, "
                    "prose in PATCHES.md)."]
        elif retire:
            out += ["", f"Retire candidates: {', '.join(retire)}. `qwen38build bump vllm "
                    f"{self.new_version} --retire` (with `--rebase DIR` to carry the "
                    "workspace) moves them to series.retired, deletes their files and keeps "
                    "their prose in PATCHES.md's retired section."]
        if self.rebase is not None:
            out += ["", *carry_lines(self.rebase, self.new_version)]
        elif not self.ok:
            out += ["", f"Next: `qwen38build bump vllm {self.new_version} --rebase DIR` "
                    "carries the series as commits onto the new pin in a git workspace, "
                    "stopping at each conflict to resolve; then `qwen38build export DIR`."]
        elif self.dry_run:
            out += ["", f"Next: `qwen38build bump vllm {self.new_version}` moves the pin "
                    "(every patch applies)."]
        return out


#: What each outcome asks of the maintainer, for the summary table.
NEXT: dict[str, str] = {
    "clean": "nothing",
    "offset": "re-cut at the new offsets (export from a carried workspace)",
    "conflict": "rebase the hunks named, against upstream's change",
    "upstreamed": "retire: it reverse-applies to the new pin",
    "likely-upstreamed": "retire, with the evidence shown (check it first)",
    "deleted": "carry the hunks to where the file went",
    "depends-on-failed": "fix the patch it stands on first, then rebase it",
}


def next_step(p: PatchReport, refs: dict[str, str], most: int = 2) -> str:
    """One line: what to do next about ``p`` (refs name the upstream diffs); at most
    ``most`` places are named, the rest counted (the report names them all)."""
    def places(items: list[str]) -> str:
        more = len(items) - most
        return ", ".join(items[:most]) + (f", {more} more files in the report" if more > 0 else "")

    if p.outcome == "clean":
        return "nothing"
    if p.outcome == "offset":
        by_file: dict[str, list[str]] = {}
        for o in p.offsets:
            by_file.setdefault(o.file, []).append(f"#{o.hunk} {o.offset:+d}")
        return "re-cut at offset: " + places([f"{f} {' '.join(h)}" for f, h in by_file.items()])
    if p.outcome == "upstreamed":
        return "retire (`--retire`): it reverse-applies to the new pin"
    if p.outcome == "likely-upstreamed":
        return "retire with evidence (`--retire`): " + p.summary().removesuffix(
            ": retire candidate")
    if p.outcome == "deleted":
        return "carry its hunks: " + p.summary()
    if p.outcome == "depends-on-failed":
        return f"fix {', '.join(p.depends_on)} first, then rebase it on that"
    files: dict[str, tuple[list[str], list[str]]] = {}
    moved: dict[str, set[str]] = {}
    for h in p.failures:
        hunks, used = files.setdefault(h.file, ([], []))
        hunks.append(f"#{h.hunk}@{h.patch_line}")
        if h.upstream_diff in refs and refs[h.upstream_diff] not in used:
            used.append(refs[h.upstream_diff])
        moved.setdefault(h.file, set()).add(h.moved_to.rsplit(":", 1)[0])

    def where(f: str) -> str:  # every failing hunk of f found in one file new upstream
        (to,) = moved[f] if len(moved[f]) == 1 else ("",)
        return f" → moved upstream to {to}" if to else ""

    return ("rebase this hunk: " if len(p.failures) == 1 else "rebase these hunks: ") + places(
        [f"{f} {' '.join(hunks[:4])}" + (f" +{len(hunks) - 4}" if len(hunks) > 4 else "")
         + (f" ({' '.join(used[:3])})" if used else "") + where(f)
         for f, (hunks, used) in files.items()])


def carry_lines(r: RebaseResult, new_version: str) -> list[str]:
    """What the carry's state asks of the user: export when every topic is carried, else
    the stopped topic, its conflicts and the ways on (the first stop and every later one,
    through ``workspace continue``, say the same)."""
    out = []
    if r.ok:
        out.append(f"Workspace {r.repo}: branch {r.branch} carries every topic; "
                   f"`qwen38build export {r.repo}` writes the patch files.")
    else:
        out.append(
            f"Workspace {r.repo}: branch {r.branch} stopped at topic {r.stopped_at} "
            f"({len(r.done)} carried before it), conflicts in "
            f"{', '.join(r.conflict_files)}. In {r.repo}: resolve them, `git add`, "
            f"`qwen38build workspace continue {r.repo}` (git's `cherry-pick --continue`: "
            "it goes on with the topics after it, stops at the next conflict and says "
            f"this again), or `qwen38build workspace continue {r.repo} --skip` to leave "
            f"{r.stopped_at} for later (its commit stays on branch {BRANCH}, and export "
            f"names it); then `qwen38build export {r.repo}` writes every finished topic and "
            "names the unfinished ones. A topic the new pin carries (its upstream diff in the "
            "report makes the same change): skip it, then `qwen38build retire TOPIC --why "
            "'...'`.")
    out.append(f"Export starts each exported patch's `Cut-against:` header with "
               f"{new_version}, the pin its hunks are now cut on; the rest of the header "
               "(what upstream has) is yours to update.")
    if r.empty:
        out.append(f"Empty after the carry (upstream has them): {', '.join(r.empty)}.")
    if r.skipped:
        out.append(f"Not carried (retired): {', '.join(r.skipped)}.")
    return out
