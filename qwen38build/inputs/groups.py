"""The series' groups as a build takes them: which are built, and each one's file overlay.

A group is built unless it is ``optional``; an optional group is built when the recipe
switches it on (``enabled = true``) or the command line asks (``build --with DIR``). A group
not built is listed by ``plan`` as declared, not built, with the reason. A group's overlay
is a folder of files copied into the package tree before the group's patches apply; it is
read one safe way (:func:`qwen38build.inputs.tree.manifest_files`: regular files only, each
as the folder's MANIFEST lists it), and each of its files is owned by the group's overlay
label (``<dir>:overlay``) in the build's manifest, so ``verify`` and ``apply`` name it.
A group with a ``source`` takes its overlay from that ``[sources.*]`` tree instead (pinned
by its hash in the lock); until the lock pins it, the group is not built.
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
    """Where ``group``'s local overlay is read from, or None when it has none here (none
    at all, or one in its source tree)."""
    if group.overlay is None or group.source is not None:
        return None
    return loaded.root / group.dir / group.overlay


def source_overlay(group: Group) -> str | None:
    """The folder of ``group``'s source tree that is its overlay (``.``: the whole tree),
    or None when the group has no source."""
    if group.source is None:
        return None
    return (group.overlay or ".").strip("/") or "."


def overlay_of(loaded: LoadedRecipe, group: Group) -> Overlay | None:
    """``group``'s local overlay with its files checked against its MANIFEST (InputError
    on a link, an unlisted file or other bytes), or None when it has none here."""
    folder = overlay_folder(loaded, group)
    if folder is None:
        return None
    return Overlay(group.dir, folder, tuple(manifest_files(folder, ".")))


def overlay_paths(loaded: LoadedRecipe, group: Group) -> list[str]:
    """The package-relative paths of ``group``'s local overlay, unchecked (the folder's
    files as its MANIFEST must list them): what bump compares with a new pin."""
    folder = overlay_folder(loaded, group)
    return [] if folder is None or not folder.is_dir() else source_files(folder)


def locked_trees(loaded: LoadedRecipe) -> set[str]:
    """The names of the ``[sources.*]`` trees the lock pins (none without a lock)."""
    from qwen38build.inputs import lock as lockmod

    if not lockmod.lock_path(loaded.root).is_file():
        return set()
    return set(lockmod.read_trees(loaded.root))


def built_groups(loaded: LoadedRecipe, with_: Sequence[str] = ()) -> list[Group]:
    """The groups a build applies, in series order: every group not optional, and each
    optional one that is enabled or named in ``with_``, leaving out those whose source the
    lock does not pin. UsageError for a name in ``with_`` that is no optional group of
    the recipe, or whose source is not locked."""
    groups = loaded.recipe.series.groups
    optional = {g.dir: g for g in groups if g.optional}
    trees = locked_trees(loaded) if any(g.source for g in groups) else set()
    for name in with_:
        if name not in optional:
            what = "is not optional (it is always built)" if any(
                g.dir == name for g in groups) else "is not a group of the series"
            raise UsageError(
                f"command line: --with {name!r} {what}.",
                hint="name an optional group of recipe.toml's [[series.groups]]: "
                + (", ".join(sorted(optional)) or "there is none"),
            )
        source = optional[name].source
        if source is not None and source not in trees:
            raise UsageError(
                f"command line: --with {name!r}: its source {source!r} is not locked "
                "(lock/sources.json pins no such tree), so the group cannot be built.",
                hint="put the tree's archive in a mirror folder ([fetch] mirrors or "
                "$QWEN38BUILD_SOURCES) and run `qwen38build lock`; or build without it",
            )
    return [g for g in groups if (not g.optional or g.enabled or g.dir in with_)
            and (g.source is None or g.source in trees)]


def not_built(loaded: LoadedRecipe, built: Sequence[Group]) -> list[tuple[str, str]]:
    """(group dir, why) for each group the build leaves out."""
    names = {g.dir for g in built}
    out = []
    for g in loaded.recipe.series.groups:
        if g.dir in names:
            continue
        if g.source is not None and g.source not in locked_trees(loaded):
            out.append((g.dir, f"its source {g.source!r} is not locked (lock/sources.json); "
                        "the stack builds without it"))
        else:
            out.append((g.dir, f"optional, not requested (build --with {g.dir}, or set "
                        "enabled = true in its [[series.groups]])"))
    return out
