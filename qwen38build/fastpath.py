"""The no-op build: answer "already built" from a fingerprint of the input files alone.

Validating the recipe (pydantic) and planning cost more than the whole no-op budget, so a
successful build stores ``fastpath/<fingerprint>.json`` naming its build hash. The
fingerprint covers the bytes of recipe.toml, the lock, every file of the series folders and
the engine's own step code; any change misses and takes the full path. Only stdlib here.
"""

from __future__ import annotations

import hashlib
import json
import os
import tomllib
from pathlib import Path
from typing import Any

from qwen38build import __version__

_ENGINE = Path(__file__).parent


def fingerprint(recipe_path: Path) -> str | None:
    """sha256 over everything a build reads; None when the recipe cannot even be parsed."""
    h = hashlib.sha256(f"qwen38build {__version__}\n".encode())
    try:
        raw = recipe_path.read_bytes()
        data = tomllib.loads(raw.decode())
    except (OSError, ValueError):
        return None
    h.update(raw)
    root = recipe_path.parent
    files = [root / "lock" / "sources.json"]
    try:
        for group in data["series"]["groups"]:
            folder = root / str(group["dir"])
            files.extend(sorted(folder.glob("*.patch")))
        # The build's lint reads the vendored pthfa files and the fa2 provenance too.
        files.extend(p for p in sorted((root / str(data["pthfa"].get("path", "pthfa"))).rglob("*"))
                     if p.is_file() and "__pycache__" not in p.parts)
        files.append(root / "fa2" / "README.md")
    except (KeyError, TypeError, AttributeError):
        return None
    for f in files:
        h.update(f"\0{f.relative_to(root)}\0".encode())
        try:
            h.update(f.read_bytes())
        except OSError:
            h.update(b"<missing>")
    for code in sorted(_ENGINE.rglob("*.py")):
        st = code.stat()
        h.update(f"\0{code.relative_to(_ENGINE)}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()


def lookup(store_root: Path, fp: str) -> dict[str, Any] | None:
    """The recorded build for this fingerprint, if its outputs are still intact by stat."""
    try:
        rec: dict[str, Any] = json.loads((store_root / "fastpath" / f"{fp}.json").read_bytes())
        meta = json.loads((store_root / "objects" / f"{rec['build']}.json").read_bytes())
    except (OSError, ValueError, KeyError):
        return None
    out = store_root / "objects" / rec["build"]
    for name, r in meta["outputs"].items():
        try:
            st = os.stat(out / name)
        except OSError:
            return None
        if st.st_size != r["size"] or st.st_mtime_ns != r["mtime_ns"]:
            return None
    return rec


def save(store_root: Path, fp: str, record: dict[str, Any]) -> None:
    d = store_root / "fastpath"
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{fp}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(record, sort_keys=True))
    os.replace(tmp, d / f"{fp}.json")
