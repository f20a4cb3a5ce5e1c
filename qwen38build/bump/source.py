"""``bump <source> <commit>``: move a ``[sources.*]`` tree to another commit, and say what it
means for the diff cut against it (FA2's), hunk by hunk, as ``bump vllm`` does per patch.

The new tree is obtained like any fixed-output source (a mirror, else the origin) and
hashed; the diff is dry-run against it at fuzz 0. Each hunk applies, applies at an offset
(re-cut), fails (with where its lines stand now), or the whole diff is already there
(upstream took it). Without ``--dry-run`` the recipe's commit (comments kept) and the lock's
tree hash move together; the diff is never touched.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from qwen38build.files import atomic_write
from qwen38build.inputs import lock as lockmod
from qwen38build.inputs.recipe import LoadedRecipe
from qwen38build.series.gnupatch import context_elsewhere, hunk_of, run_patch
from qwen38build.series.patchfile import PatchFile
from qwen38build.trees.obtain import TreeRequest, obtain


@dataclass
class SourceBump:
    name: str
    old_commit: str
    new_commit: str
    tree_sha256: str
    diff: str | None  # the diff cut against this source, if any
    hunks: list[str] = field(default_factory=list)  # one line per hunk that needs work
    applied: int = 0
    upstreamed: bool = False
    written: bool = False

    @property
    def ok(self) -> bool:
        return not self.hunks and not self.upstreamed

    def to_json(self) -> dict[str, object]:
        return {"source": self.name, "old": self.old_commit, "new": self.new_commit,
                "tree_sha256": self.tree_sha256, "diff": self.diff, "applied": self.applied,
                "hunks": self.hunks, "upstreamed": self.upstreamed, "written": self.written}

    def text(self) -> str:
        lines = [f"{self.name}: {self.old_commit[:12]} -> {self.new_commit[:12]} "
                 f"(tree {self.tree_sha256[:16]}…)"]
        if self.diff is None:
            lines.append("  no diff is cut against this source")
        elif self.upstreamed:
            lines.append(f"  {self.diff}: the new tree already carries it (GNU patch sees it "
                         "reversed): upstream took it; drop what it carries")
        else:
            lines.append(f"  {self.diff}: {self.applied} hunk(s) apply as they are, "
                         f"{len(self.hunks)} need work")
            lines += [f"    {h}" for h in self.hunks]
        if self.written:
            lines.append("  recipe.toml and lock/ moved to the new commit")
            if self.diff is not None:
                readme = str(Path(self.diff).parent / "README.md")
                lines.append(f"  next: name {self.new_commit} in {readme} (the provenance "
                             "rule checks it), then build")
        else:
            lines.append("  nothing written (--dry-run, or a hunk needs work)")
        return "\n".join(lines) + "\n"


def bump_source(loaded: LoadedRecipe, name: str, commit: str, *, dry_run: bool,
                offline: bool) -> SourceBump:
    """Try the diff cut against ``[sources.<name>]`` on ``commit``'s tree; move the recipe and
    lock there unless ``dry_run`` or a hunk needs work."""
    spec = loaded.recipe.sources[name]
    diff = loaded.root / loaded.recipe.fa2.diff if loaded.recipe.fa2.source == name else None
    request = TreeRequest(name, spec.repository, commit, tuple(spec.paths), spec.archive,
                          want=None)
    with tempfile.TemporaryDirectory(prefix="q38-bump-src.") as tmp:
        got = obtain(request, loaded.mirrors(), Path(tmp), offline=offline)
        result = SourceBump(name, spec.commit, commit, got.tree_sha256,
                            loaded.recipe.fa2.diff if diff is not None and diff.is_file()
                            else None)
        if result.diff is not None and diff is not None:
            _try_diff(result, diff, got.path)
        shutil.rmtree(got.path)
    if not dry_run and result.ok:
        _write(loaded, name, commit, got.tree_sha256)
        result.written = True
    return result


def _try_diff(result: SourceBump, diff: Path, tree: Path) -> None:
    pf = PatchFile.parse(diff, strict=False)
    applied = run_patch(diff, tree, dry_run=True)
    result.upstreamed = applied.reversed
    # GNU patch names only the hunks that did not apply cleanly; the rest did
    result.applied = sum(len(f.hunks) for f in pf.files) - sum(
        1 for h in applied.hunks if not h.applied or h.offset)
    for h in applied.hunks:
        if h.applied and not h.offset:
            continue
        if h.applied:
            result.hunks.append(f"{h.file} hunk #{h.number}: applies at offset {h.offset:+d} "
                                f"(line {h.line}): re-cut the diff")
        else:
            hunk = hunk_of(pf, h)
            found = context_elsewhere(hunk, tree / h.file) if hunk is not None else []
            where = (f"its lines stand at line {', '.join(map(str, found))}" if found
                     else "its lines are nowhere in the file (upstream changed them)")
            at = f" [{diff.name}:{hunk.patch_line}]" if hunk is not None else ""
            result.hunks.append(f"{h.file} hunk #{h.number}: FAILS; {where}: rebase it{at}")


def _write(loaded: LoadedRecipe, name: str, commit: str, tree_sha256: str) -> None:
    import tomlkit

    doc = tomlkit.parse(loaded.path.read_text(encoding="utf-8"))
    doc["sources"][name]["commit"] = commit
    trees = lockmod.read_trees(loaded.root)
    old = trees.get(name)
    spec = loaded.recipe.sources[name]
    trees[name] = lockmod.LockedTree(name, spec.repository, commit,
                                     tuple(spec.paths) if old is None else old.paths,
                                     tree_sha256)
    lockmod.write(loaded.root, list(lockmod.read(loaded.root).values()), list(trees.values()))
    atomic_write(loaded.path, tomlkit.dumps(doc).encode("utf-8"))
