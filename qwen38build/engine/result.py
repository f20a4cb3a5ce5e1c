"""The build's answer: point ``./result`` at it and print its hash and each output.

Shared by the full build and the no-op fast path, so both answer in the same words; kept
free of heavy imports (the fast path runs it).
"""

from __future__ import annotations

import os
from pathlib import Path


def report_build(
    store_root: Path, build_hash: str, outputs: list[list[str]], root: Path, *, link: bool,
    as_json: bool, groups: list[str] | None = None,
) -> int | None:
    """Point ``result`` at the build (like Nix) and print its hash and each output.

    ``outputs`` holds [label, entry digest, file name] per output. The link is made under a
    temporary root on the build and registered as an indirect root, so gc keeps what it
    points at and never leaves it dangling. None (nothing linked or printed) if gc took the
    build first: the no-op fast path then runs the full build. ``groups``: the series
    groups applied (said as ``groups ...``), None when the build applies no series.
    """
    objects = Path(os.path.abspath(store_root / "objects"))
    if link:
        from qwen38build.store.store import Store

        if not Store(store_root).link_result(build_hash, root / "result"):
            return None
    paths = {label: str(objects / digest / name) for label, digest, name in outputs}
    if as_json:
        import json

        print(json.dumps({"build": build_hash, "result": str(objects / build_hash),
                          "outputs": paths, "store": str(store_root), **(
                              {"wheel": paths["wheel"]} if "wheel" in paths else {}),
                          **({"groups": groups} if groups is not None else {})},
                         indent=2, sort_keys=True))
    else:
        said = [] if groups is None else [f"groups {' '.join(groups)}"]
        print("\n".join([f"build {build_hash}", *said,
                         *(f"{k} {v}" for k, v in paths.items())]))
    return 0
