"""Pack what the series' GPU tests need on a device machine that cannot build the trees.

    .venv/bin/python bench/series_gpu_pack.py DEST

Writes DEST/trees.zip (the .py files of the pristine 0.32.0 wheel under pristine/vllm and of
the wheel the engine builds from the recipe under patched/vllm) and DEST/repo (this checkout's
committed files, from ``git archive HEAD``). On the device: ``cd DEST/repo &&
bench/series_gpu.sh ../trees.zip``.
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.patches.conftest import built_wheels  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path)
    args = parser.parse_args()
    dest: Path = args.dest
    dest.mkdir(parents=True, exist_ok=True)
    patched, pristine, _ = built_wheels()
    with zipfile.ZipFile(dest / "trees.zip", "w", zipfile.ZIP_DEFLATED) as out:
        for label, wheel in (("pristine", pristine), ("patched", patched)):
            with zipfile.ZipFile(wheel) as zf:
                for name in zf.namelist():
                    if name.startswith("vllm/") and name.endswith(".py"):
                        out.writestr(f"{label}/{name}", zf.read(name))
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=REPO, check=True,
                             capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest / "repo", filter="data")
    size = (dest / "trees.zip").stat().st_size
    print(f"{dest / 'trees.zip'}: {size / 2**20:.1f} MiB; {dest / 'repo'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
