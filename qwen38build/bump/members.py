"""The files a bump reads from a pristine wheel (the package files the series touches, the
METADATA), kept beside the store by the wheel's sha256, so that a second bump does not read
two 300 MB wheels' zip directories again.

A wheel's zip directory (5,444 members) is parsed and every member checked
(:func:`qwen38build.wheels.wheelzip.member_infos`) before anything of it is kept: the cache
is written only from a wheel that passed the check: its member names once, each file by the
sha256 of its bytes. A cached file whose bytes no longer hash to its name, or
an index that does not parse, is read from the wheel again. The key is the sha256 the lock
(or the store's fetch record) holds for the wheel, so another wheel never shares it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from qwen38build.files import atomic_write
from qwen38build.wheels import wheelzip
from qwen38build.workspace.workspace import PACKAGE

#: The store's folder of these caches, one folder per wheel sha256.
FOLDER = "bumpwheels"
_INDEX = "index.json"


def read_members(wheel: Path, rels: set[str], cache: Path | None = None
                 ) -> tuple[dict[str, bytes | None], set[str]]:
    """The package files ``rels`` of ``wheel`` (None where absent) and its package paths;
    from ``cache`` (a folder for this wheel) where it holds them, and kept there."""
    prefix = f"{PACKAGE}/"
    got, names = read(wheel, {prefix + rel for rel in rels}, cache)
    return ({rel: got[prefix + rel] for rel in rels},
            {n[len(prefix):] for n in names if n.startswith(prefix)})


def metadata(wheel: Path, cache: Path | None = None) -> bytes:
    """The bytes of the wheel's one ``*.dist-info/METADATA`` (InputError if not one)."""
    from qwen38build.errors import InputError

    names = read(wheel, set(), cache)[1]
    found = [n for n in names if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
    if len(found) != 1:
        raise InputError(f"{wheel.name}: holds {len(found)} dist-info METADATA files, not one.")
    data = read(wheel, set(found), cache)[0][found[0]]
    assert data is not None  # it is among the names
    return data


def read(wheel: Path, wanted: set[str], cache: Path | None = None
         ) -> tuple[dict[str, bytes | None], set[str]]:
    """The members ``wanted`` of ``wheel`` (None where absent) and every member name."""
    index = _index(cache) if cache is not None else None
    if cache is not None and index is not None:
        hit = _all_cached(cache, index, wanted)
        if hit is not None:
            return hit, index[0]
    names = set(wheelzip.member_infos(wheel))  # the one member check: unsafe is refused
    got = {n: (wheelzip.read(wheel, n) if n in names else None) for n in wanted}
    if cache is not None:
        _keep(cache, names, got, index[1] if index is not None else {})
    return got, names


def _all_cached(cache: Path, index: tuple[set[str], dict[str, str]], rels: set[str]
                ) -> dict[str, bytes | None] | None:
    """Every member of ``rels`` from the cache, or None when one is not there (or changed)."""
    names, files = index
    out: dict[str, bytes | None] = {}
    for rel in rels:
        if rel not in names:
            out[rel] = None
            continue
        data = _cached(cache, files.get(rel))
        if data is None:
            return None
        out[rel] = data
    return out


_READ: dict[tuple[Path, int, int], tuple[set[str], dict[str, str]] | None] = {}


def _index(cache: Path) -> tuple[set[str], dict[str, str]] | None:
    """The cache's index (member names, member → sha256), read once per process while the
    file stays as it was."""
    try:
        st = (cache / _INDEX).stat()
    except OSError:
        return None
    key = (cache, st.st_mtime_ns, st.st_size)
    if key not in _READ:
        _READ[key] = _read_index(cache)
    return _READ[key]


def _read_index(cache: Path) -> tuple[set[str], dict[str, str]] | None:
    try:
        data = json.loads((cache / _INDEX).read_bytes())
        names, files = data["names"], data["files"]
        if not (isinstance(names, list) and isinstance(files, dict)
                and all(isinstance(v, str) for v in files.values())):
            return None
        return {str(n) for n in names}, {str(k): str(v) for k, v in files.items()}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _cached(cache: Path, sha: str | None) -> bytes | None:
    if sha is None or len(sha) != 64 or not all(c in "0123456789abcdef" for c in sha):
        return None
    try:
        data = (cache / sha).read_bytes()
    except OSError:
        return None
    return data if hashlib.sha256(data).hexdigest() == sha else None


def _keep(cache: Path, names: set[str], got: dict[str, bytes | None],
          files: dict[str, str]) -> None:
    """Add ``got`` to the cache (best effort: a cache that cannot be written is skipped)."""
    files = dict(files)
    try:
        cache.mkdir(parents=True, exist_ok=True)
        for rel, data in got.items():
            if data is None:
                continue
            sha = hashlib.sha256(data).hexdigest()
            if not (cache / sha).is_file():
                atomic_write(cache / sha, data)
            files[rel] = sha
        index = {"names": sorted(names), "files": dict(sorted(files.items()))}
        atomic_write(cache / _INDEX, json.dumps(index).encode())
    except OSError:
        pass
