"""The series' groups as a build takes them: which are built, and each one's file overlay.

A group is built unless it is ``optional``; an optional group is built when the recipe
switches it on (``enabled = true``) or the command line asks (``build --with DIR``). A group
not built is listed by ``plan`` as declared, not built, with the reason. A group's overlay
is a folder of files copied into the package tree before the group's patches apply; it is
read one safe way (:func:`qwen38build.inputs.tree.manifest_files`: regular files only, each
as the folder's MANIFEST lists it), and each of its files is owned by the group's overlay
label (``<dir>:overlay``) in the build's manifest, so ``verify`` and ``apply`` name it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from qwen38build.errors import UsageError
from qwen38build.inputs.recipe import Group, LoadedRecipe
from qwen38build.inputs.tree import manifest_files, source_files

OVERLAY_SUFFIX = ":overlay"


def overlay_label(group: str) -> str:
    """The name a group's overlay goes by: an owner in the manifest, a workspace topic.
    A patch name never holds ':' (recipe.py), so no topic can take it."""
    return f"{group}{OVERLAY_SUFFIX}"


@dataclass(frozen=True)
class Overlay:
    """A group's overlay: ``folder`` (its MANIFEST at the top) and its files, each as a
    package-relative path and where it is read."""

    group: str
    folder: Path
    files: tuple[tuple[str, Path], ...]

    @property
    def label(self) -> str:
        return overlay_label(self.group)


def overlay_folder(loaded: LoadedRecipe, group: Group) -> Path | None:
    """Where ``group``'s overlay is read from, or None when it has none."""
    if group.overlay is None:
        return None
    return loaded.root / group.dir / group.overlay


def overlay_of(loaded: LoadedRecipe, group: Group) -> Overlay | None:
    """``group``'s overlay with its files checked against its MANIFEST (InputError on a
    link, an unlisted file or other bytes), or None when it has none."""
    folder = overlay_folder(loaded, group)
    if folder is None:
        return None
    return Overlay(group.dir, folder, tuple(manifest_files(folder, ".")))


def overlay_paths(loaded: LoadedRecipe, group: Group) -> list[str]:
    """The package-relative paths of ``group``'s overlay, unchecked (the folder's files as
    its MANIFEST must list them): what bump compares with a new pin."""
    folder = overlay_folder(loaded, group)
    return [] if folder is None or not folder.is_dir() else source_files(folder)


def built_groups(loaded: LoadedRecipe, with_: Sequence[str] = ()) -> list[Group]:
    """The groups a build applies, in series order: every group not optional, and each
    optional one that is enabled or named in ``with_`` (UsageError for a name that is no
    optional group of the recipe)."""
    groups = loaded.recipe.series.groups
    optional = {g.dir for g in groups if g.optional}
    for name in with_:
        if name not in optional:
            what = "is not optional (it is always built)" if any(
                g.dir == name for g in groups) else "is not a group of the series"
            raise UsageError(
                f"command line: --with {name!r} {what}.",
                hint="name an optional group of recipe.toml's [[series.groups]]: "
                + (", ".join(sorted(optional)) or "there is none"),
            )
    return [g for g in groups if not g.optional or g.enabled or g.dir in with_]


def not_built(loaded: LoadedRecipe, built: Sequence[Group]) -> list[tuple[str, str]]:
    """(group dir, why) for each optional group the build leaves out."""
    names = {g.dir for g in built}
    return [(g.dir, "optional, not requested (build --with " + g.dir + ", or set enabled = "
             "true in its [[series.groups]])")
            for g in loaded.recipe.series.groups if g.dir not in names]
