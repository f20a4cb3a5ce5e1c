"""bump: a series group's overlay against the new pin.

An overlay adds files to the package; the build refuses one whose file the pinned wheel
already has. So each overlay file that the new wheel carries at the same path (identical to
ours, or not) is reported: upstream took the file in (drop it from the overlay, or keep
ours as a patch of the group on upstream's), and the bump is not ok until it is dealt with.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from qwen38build.digest import sha256_bytes, sha256_file
from qwen38build.inputs.groups import overlay_folder, overlay_label, overlay_paths
from qwen38build.inputs.recipe import LoadedRecipe
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


def overlay_in_upstream(loaded: LoadedRecipe, new_wheel: Path, package: str = "vllm"
                        ) -> list[OverlayInUpstream]:
    """Every overlay file of every group (built or not) that ``new_wheel`` has."""
    z = open_wheel(new_wheel)
    names = set(z.namelist())
    out: list[OverlayInUpstream] = []
    for group in loaded.recipe.series.groups:
        folder = overlay_folder(loaded, group)
        for rel in overlay_paths(loaded, group):
            member = f"{package}/{rel}"
            if member in names and folder is not None:
                same = sha256_bytes(z.read(member)) == sha256_file(folder / rel)
                out.append(OverlayInUpstream(overlay_label(group.dir), rel, same))
    return out
