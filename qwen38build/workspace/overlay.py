"""A series group's overlay in the topic workspace: one commit that adds its files.

``create`` commits each group's local overlay (``[qwen38] <dir>:overlay``) before the group's
first patch, its files written into the package as the build copies them. Edits to them are
commits like any other (``fixup! [qwen38] kvarn:overlay`` folds into it). ``export`` writes
the overlay topic's files back into the group's overlay folder: the files the topic adds or
changes in the package, a file of the folder the topic no longer holds removed, and the
folder's MANIFEST rewritten (``inputs.tree``'s format, the one the build and lint read).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from qwen38build.errors import Qwen38BuildError
from qwen38build.files import atomic_write
from qwen38build.inputs.groups import overlay_folder, overlay_label
from qwen38build.inputs.recipe import LoadedRecipe, SeriesEntry
from qwen38build.inputs.tree import MANIFEST, manifest_files, manifest_text, source_files
from qwen38build.proc import run
from qwen38build.workspace.gitrepo import commit_tree, git, git_env


@dataclass(frozen=True)
class OverlayEntry:
    """A group's local overlay as a topic of the workspace: ``path`` is its folder."""

    group: str
    path: Path

    @property
    def row_name(self) -> str:
        return overlay_label(self.group)

    @property
    def topic(self) -> str:
        return self.row_name


def workspace_entries(loaded: LoadedRecipe) -> list[SeriesEntry | OverlayEntry]:
    """The workspace's topics in order: each group's local overlay, then its patches."""
    out: list[SeriesEntry | OverlayEntry] = []
    for group in loaded.recipe.series.groups:
        folder = overlay_folder(loaded, group)
        if folder is not None:
            out.append(OverlayEntry(group.dir, folder))
        out += loaded.series_entries([group.dir])
    return out


def message(entry: OverlayEntry, subject_prefix: str) -> str:
    return (f"{subject_prefix}{entry.row_name}\n\nThe files of the {entry.group} group's "
            "overlay, copied into the package before the group's patches. `qwen38build "
            "export` writes them back to the overlay folder, with its MANIFEST.\n")


def commit_overlay(repo: Path, entry: OverlayEntry, parent: str, package: str,
                   subject_prefix: str) -> str:
    """Write the overlay's files (as its MANIFEST vouches for them) into the package and
    commit them as a child of ``parent``."""
    rels = []
    for rel, path in manifest_files(entry.path, "."):
        dest = repo / package / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(path.read_bytes())
        rels.append(f"{package}/{rel}")
    if rels:
        git(repo, "add", "-A", "--", *rels)
    return commit_tree(repo, parent, message(entry, subject_prefix))


def export_overlay(repo: Path, entry: OverlayEntry, before: str, after: str, package: str,
                   *, check: bool) -> list[Path]:
    """Write the files the overlay topic adds or changes (tree ``before`` → ``after``) into
    its folder and rewrite its MANIFEST; the files written (with ``check``: that differ)."""
    listing = git(repo, "diff-tree", "-r", "--no-renames", "--name-status", "-z", before,
                  after, "--", f"{package}/").split("\0")
    wanted: dict[str, bytes] = {}
    for status, name in zip(listing[0::2], listing[1::2], strict=False):
        if status in ("A", "M"):
            wanted[name[len(package) + 1:]] = run(
                ["git", "cat-file", "blob", f"{after}:{name}"], what="git", cwd=repo,
                env=git_env(), binary=True, fail=Qwen38BuildError).raw
    folder = entry.path
    have = set(source_files(folder)) if folder.is_dir() else set()
    changed: list[Path] = []
    for rel in sorted(have - set(wanted)):
        changed.append(folder / rel)
        if not check:
            (folder / rel).unlink()
    for rel, data in sorted(wanted.items()):
        path = folder / rel
        if not path.is_file() or path.read_bytes() != data:
            changed.append(path)
            if not check:
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(path, data)
    from qwen38build.digest import sha256_bytes

    text = manifest_text({rel: sha256_bytes(data) for rel, data in wanted.items()})
    manifest = folder / MANIFEST
    if not manifest.is_file() or manifest.read_text(encoding="utf-8") != text:
        changed.append(manifest)
        if not check:
            atomic_write(manifest, text.encode("utf-8"))
    return changed
