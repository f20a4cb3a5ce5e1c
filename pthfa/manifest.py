#!/usr/bin/env python3
"""Regenerate or check pthfa/MANIFEST: ``sha256  relative/path`` per source file, sorted by path.

Covers every file under pthfa/ except PIN, MANIFEST and build outputs (cubins, PTX, Python
caches, results/). ``python3 pthfa/manifest.py`` rewrites it; ``--check`` exits 1 listing
differences.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
EXCLUDE_NAMES = {"PIN", "MANIFEST"}
EXCLUDE_SUFFIXES = {".cubin", ".ptx", ".pyc", ".whl"}


def source_files(root: Path = ROOT) -> list[Path]:
    out = []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if not p.is_file() or rel.as_posix() in EXCLUDE_NAMES:
            continue
        if (p.suffix in EXCLUDE_SUFFIXES or "__pycache__" in rel.parts
                or rel.parts[0] in ("build", "results")):
            continue
        out.append(p)
    return out


def render(root: Path = ROOT) -> str:
    files = sorted(source_files(root), key=lambda p: p.relative_to(root).as_posix())
    lines = [
        f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(root).as_posix()}"
        for p in files
    ]
    return "".join(line + "\n" for line in lines)


def check(root: Path = ROOT) -> list[str]:
    """Differences between MANIFEST and the tree (empty when they agree)."""
    want = render(root).splitlines()
    path = root / "MANIFEST"
    have = path.read_text().splitlines() if path.is_file() else []
    return [f"-{x}" for x in have if x not in want] + [f"+{x}" for x in want if x not in have]


def main(argv: list[str]) -> int:
    if "--check" in argv:
        diff = check()
        for line in diff:
            sys.stdout.write(line + "\n")
        return 1 if diff else 0
    (ROOT / "MANIFEST").write_text(render())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
