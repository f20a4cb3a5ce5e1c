"""Digests: canonical JSON, sha256 of bytes, files and trees, hash while copying.

Kept free of third-party imports and of typing: the no-op build path imports this module.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, BinaryIO

CHUNK = 1 << 20  # 1 MiB: streaming keeps memory flat whatever the file's size


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no whitespace, UTF-8: the one spelling whose hash is a digest."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_json(value: Any) -> str:
    return sha256_bytes(canonical_json(value))


def derivation_digest(drv: Any) -> str:
    """The digest of a derivation: sha256 of its canonical JSON, the human name left out.

    The one definition of what a digest covers: a step computes its own with it (see
    engine/step.py), a cache record's derivation and a stack's own record are checked
    against their digest with it.
    """
    return sha256_json({k: v for k, v in drv.items() if k != "name"})


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def copy_hashing(src: BinaryIO, dst: BinaryIO, *, limit: int | None = None) -> tuple[str, int]:
    """Copy ``src`` to ``dst`` (at most ``limit`` bytes); return (sha256, bytes copied)."""
    h = hashlib.sha256()
    total = 0
    while True:
        want = CHUNK if limit is None else min(CHUNK, limit - total)
        if want <= 0:
            break
        chunk = src.read(want)
        if not chunk:
            break
        h.update(chunk)
        dst.write(chunk)
        total += len(chunk)
    return h.hexdigest(), total


def tree_manifest(root: Path) -> dict[str, str]:
    """sha256 of every regular file below ``root``, by POSIX relative path."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath) / name
            out[p.relative_to(root).as_posix()] = sha256_file(p)
    return out


def tree_digest(manifest: dict[str, str]) -> str:
    """One digest for a whole tree: sha256 of its manifest's canonical JSON."""
    return sha256_json(manifest)
