"""Find the binary (cubin, else PTX) that a device's kernels are loaded from."""

from __future__ import annotations

import os
from pathlib import Path


def cubin_dir() -> Path:
    """Where the cubins are: $PTHFA_CUBIN_DIR, else the package's ``cubins/``."""
    env = os.environ.get("PTHFA_CUBIN_DIR")
    return Path(env) if env else Path(__file__).resolve().parent / "cubins"


def find_cubin(major: int, minor: int, directory: Path | None = None) -> Path:
    """The binary for compute capability major.minor.

    Exact ``sm_XY.cubin`` first; else the newest ``sm_X*`` cubin of the same major with a lower
    minor (cubins run on later minors of their major); else the newest ``compute_*.ptx`` not
    newer than the device (the driver compiles it). FileNotFoundError names what was looked for.
    """
    d = directory or cubin_dir()
    exact = d / f"sm_{major}{minor}.cubin"
    if exact.is_file():
        return exact
    for m in range(minor - 1, -1, -1):
        p = d / f"sm_{major}{m}.cubin"
        if p.is_file():
            return p
    ptx = []
    for p in d.glob("compute_*.ptx") if d.is_dir() else []:
        try:
            sm = int(p.stem.split("_", 1)[1])
        except ValueError:
            continue
        if sm <= major * 10 + minor:
            ptx.append((sm, p))
    if ptx:
        return max(ptx)[1]
    have = sorted(p.name for p in d.iterdir()) if d.is_dir() else []
    raise FileNotFoundError(
        f"no pthfa cubin for compute capability {major}.{minor} in {d} (looked for "
        f"sm_{major}{minor}.cubin, sm_{major}x.cubin, compute_*.ptx; found {have}); build it "
        f"with `qwen38build kernels --arch {major}.{minor}`"
    )
