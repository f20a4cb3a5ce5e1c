"""lock/ ↔ model: every external input pinned by sha256.

``lock/sources.json`` holds one entry per source (name, version, filename, tags, sha256,
size). The recipe says what is wanted; the lock says which bytes. A lock that no longer
matches the recipe is an error naming the entry (run ``qwen38build lock``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from qwen38build.errors import LockError

LOCK_DIR = "lock"
SOURCES = "sources.json"
FORMAT = 1


@dataclass(frozen=True)
class LockedWheel:
    name: str
    version: str
    filename: str
    python_tag: str
    abi_tag: str
    platform_tag: str
    sha256: str
    size: int


def lock_path(root: Path) -> Path:
    return root / LOCK_DIR / SOURCES


def read(root: Path) -> dict[str, LockedWheel]:
    """The lock's sources by name; LockError naming the file where it is wrong."""
    path = lock_path(root)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise LockError(
            f"{path}: no lock file.", hint="run `qwen38build lock` to pin the sources"
        ) from None
    except ValueError as exc:
        raise LockError(f"{path}: not valid JSON: {exc}.") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise LockError(f"{path}: format must be {FORMAT}.", hint="re-run `qwen38build lock`")
    out: dict[str, LockedWheel] = {}
    for i, raw in enumerate(data.get("sources", [])):
        try:
            entry = LockedWheel(**raw)
        except TypeError as exc:
            raise LockError(f"{path}: sources[{i}]: {exc}.") from exc
        out[entry.name] = entry
    return out


def write(root: Path, entries: list[LockedWheel]) -> Path:
    path = lock_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    body: dict[str, Any] = {
        "format": FORMAT,
        "sources": [asdict(e) for e in sorted(entries, key=lambda e: e.name)],
    }
    from qwen38build.store import atomic_write

    atomic_write(path, (json.dumps(body, indent=2, sort_keys=True) + "\n").encode())
    return path


def mismatch(
    entry: LockedWheel | None, *, name: str, version: str, python_tag: str, abi_tag: str,
    platform_tag: str,
) -> str | None:
    """Why the lock's entry does not serve the recipe's source, or None."""
    if entry is None:
        return f"no entry for {name!r}"
    want = {"version": version, "python_tag": python_tag, "abi_tag": abi_tag,
            "platform_tag": platform_tag}
    for key, value in want.items():
        have = getattr(entry, key)
        if have != value:
            return f"{name}.{key} is {have!r} in the lock but {value!r} in the recipe"
    return None
