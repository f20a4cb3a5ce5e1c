"""bump: a series group's overlay against the new pin.

A source group's overlay is read from its locked tree in the store (a tree not fetched yet
is not fetched for this: build the group first to have it checked).

An overlay adds files to the package; the build refuses one whose file the pinned wheel
already has. So each overlay file that the new wheel carries at the same path (identical to
ours, or not) is reported: upstream took the file in (drop it from the overlay, or keep
ours as a patch of the group on upstream's), and the bump is not ok until it is dealt with.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from qwen38build.digest import sha256_bytes, sha256_file
from qwen38build.inputs.groups import (
    locked_trees,
    overlay_folder,
    overlay_label,
    overlay_paths,
    source_overlay,
)
from qwen38build.inputs.recipe import Group, LoadedRecipe
from qwen38build.store.store import Store
from qwen38build.wheels.wheelzip import open_wheel


@dataclass(frozen=True)
class OverlayInUpstream:
    """An overlay file the new pin carries: ``overlay`` (``<dir>:overlay``), the package
    path, and whether upstream's bytes are ours."""

    overlay: str
    path: str
    identical: bool

    def line(self, version: str) -> str:
        same = "identical to ours" if self.identical else "with other bytes than ours"
        return (f"{self.overlay}: vllm/{self.path} is in vllm {version} now ({same}); drop "
                "it from the overlay" + ("" if self.identical else
                                         ", or carry our change as a patch of the group"))


def overlay_in_upstream(loaded: LoadedRecipe, new_wheel: Path, store: Store,
                        package: str = "vllm") -> list[OverlayInUpstream]:
    """Every overlay file of every group (built or not) that ``new_wheel`` has: a local
    overlay's, and a source group's where its locked tree is in ``store``."""
    files = {g.dir: _files(loaded, g, store) for g in loaded.recipe.series.groups}
    if not any(files.values()):
        return []  # no overlay to check: the new wheel's directory is not read at all
    z = open_wheel(new_wheel)
    names = set(z.namelist())
    out: list[OverlayInUpstream] = []
    for group in loaded.recipe.series.groups:
        for rel, path in files[group.dir].items():
            member = f"{package}/{rel}"
            if member in names:
                same = sha256_bytes(z.read(member)) == sha256_file(path)
                out.append(OverlayInUpstream(overlay_label(group.dir), rel, same))
    return out


def _files(loaded: LoadedRecipe, group: Group, store: Store) -> dict[str, Path]:
    """``group``'s overlay files by package path (none where its tree is not at hand)."""
    folder = overlay_folder(loaded, group)
    if folder is not None:
        return {rel: folder / rel for rel in overlay_paths(loaded, group)}
    sub = source_overlay(group)
    if group.source is None or sub is None or group.source not in locked_trees(loaded):
        return {}
    from qwen38build.engine.plan import source_step

    step = source_step(loaded, group.source)
    entry = store.get(step.digest) if step is not None else None
    if entry is None:
        return {}
    prefix = "" if sub == "." else f"{sub}/"
    return {name[len(prefix):]: entry.file(name) for name in sorted(entry.outputs)
            if name.startswith(prefix)}
