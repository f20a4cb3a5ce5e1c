"""lock/ ↔ model: every external input pinned by sha256.

``lock/sources.json`` holds one entry per source (name, version, filename, tags, sha256,
size). The recipe says what is wanted; the lock says which bytes. A lock that no longer
matches the recipe is an error naming the entry (run ``qwen38build lock``).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from qwen38build.errors import LockError

if TYPE_CHECKING:
    from qwen38build.inputs.recipe import LoadedRecipe

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


@dataclass(frozen=True)
class LockedTree:
    """A ``[sources.*]`` tree pinned by the hash of its content (trees/treehash.py)."""

    name: str
    repository: str
    commit: str
    paths: tuple[str, ...]
    tree_sha256: str


def lock_path(root: Path) -> Path:
    return root / LOCK_DIR / SOURCES


_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_FIELDS = tuple(f.name for f in fields(LockedWheel))


def read(root: Path) -> dict[str, LockedWheel]:
    """The lock's sources by name; LockError naming the file and the place where it is wrong.

    Every field is checked before anything uses it (a file name reaches the store and pip):
    the file name is a plain wheel file name agreeing with its entry, sha256 is 64 lowercase
    hex digits, size a positive integer. Every problem is collected, the first is raised.
    """
    path = lock_path(root)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise LockError(
            f"{path}: no lock file.", hint="run `qwen38build lock` to pin the sources"
        ) from None
    except OSError as exc:
        raise LockError(f"{path}: cannot be read ({exc.strerror}).",
                        hint="make it a readable regular file, or re-run `qwen38build lock`",
                        ) from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise LockError(f"{path}: not valid JSON: {exc}.",
                        hint="re-run `qwen38build lock` to rewrite it") from None
    problems = _problems(data)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise LockError(f"{path}:{problems[0]}{more}.",
                        hint="re-run `qwen38build lock` to rewrite it")
    return {e["name"]: LockedWheel(**e) for e in data["sources"]}


def read_trees(root: Path) -> dict[str, LockedTree]:
    """The lock's source trees by name (none in a lock written before trees were)."""
    read(root)  # every problem of the file, the trees' included, is raised there
    data = json.loads(lock_path(root).read_bytes())
    return {t["name"]: LockedTree(t["name"], t["repository"], t["commit"], tuple(t["paths"]),
                                  t["tree_sha256"]) for t in data.get("trees", [])}


def _tree_problems(trees: object) -> list[str]:
    if not isinstance(trees, list):
        return [f"trees: must be a list, not {type(trees).__name__}"]
    problems: list[str] = []
    names: set[str] = set()
    want = ("commit", "name", "paths", "repository", "tree_sha256")
    for i, t in enumerate(trees):
        where = f"trees[{i}]"
        if not isinstance(t, dict):
            problems.append(f"{where}: must be an object, not {type(t).__name__}")
            continue
        problems += [f"{where}.{k}: unknown key" for k in sorted(set(t) - set(want))]
        problems += [f"{where}.{k}: missing" for k in want if k not in t]
        for k in ("name", "repository", "commit"):
            if k in t and (not isinstance(t[k], str) or not t[k]):
                problems.append(f"{where}.{k}: {t[k]!r} is not a plain non-empty string")
        if "tree_sha256" in t and not (isinstance(t["tree_sha256"], str)
                                       and _SHA256_RE.fullmatch(t["tree_sha256"])):
            problems.append(f"{where}.tree_sha256: {t['tree_sha256']!r} is not 64 lowercase "
                            "hex digits")
        if "paths" in t and not (isinstance(t["paths"], list)
                                 and all(isinstance(x, str) for x in t["paths"])):
            problems.append(f"{where}.paths: must be a list of strings")
        if isinstance(t.get("name"), str):
            if t["name"] in names:
                problems.append(f"{where}.name: {t['name']!r} is locked twice")
            names.add(t["name"])
    return problems


def _problems(data: object) -> list[str]:
    """Every problem of the parsed lock, each as ``PLACE: what is wrong``."""
    if not isinstance(data, dict):
        return [f"(top): must be a JSON object, not {type(data).__name__}"]
    problems = [f"{k}: unknown key" for k in sorted(set(data) - {"format", "sources", "trees"})]
    if "trees" in data:
        problems += _tree_problems(data["trees"])
    if data.get("format") != FORMAT or isinstance(data.get("format"), bool):
        problems.append(f"format: must be {FORMAT}, not {data.get('format')!r}")
    sources = data.get("sources")
    if not isinstance(sources, list):
        return [*problems, f"sources: must be a list, not {type(sources).__name__}"]
    names: set[str] = set()
    for i, entry in enumerate(sources):
        where = f"sources[{i}]"
        if not isinstance(entry, dict):
            problems.append(f"{where}: must be an object, not {type(entry).__name__}")
            continue
        problems += [f"{where}.{k}: unknown key" for k in sorted(set(entry) - set(_FIELDS))]
        problems += [f"{where}.{k}: missing" for k in _FIELDS if k not in entry]
        problems += [f"{where}.{p}" for p in _entry_problems(entry)]
        name = entry.get("name")
        if isinstance(name, str):
            if name in names:
                problems.append(f"{where}.name: {name!r} is locked twice")
            names.add(name)
    return problems


def _entry_problems(entry: dict[str, object]) -> list[str]:
    problems = []
    for key in _FIELDS:
        value = entry.get(key)
        if key not in entry:
            continue
        if key == "size":
            if type(value) is not int or value <= 0:
                problems.append(f"size: {value!r} is not a positive whole number of bytes")
        elif not isinstance(value, str) or not value or value != value.strip() \
                or not value.isprintable():
            problems.append(f"{key}: {value!r} is not a plain non-empty string")
    if problems or any(key not in entry for key in _FIELDS):
        return problems  # the missing keys are reported by the caller
    text: dict[str, str] = {k: str(v) for k, v in entry.items() if k != "size"}
    if not _SHA256_RE.fullmatch(text["sha256"]):
        problems.append(f"sha256: {text['sha256']!r} is not 64 lowercase hex digits")
    try:
        want_version: Version | None = Version(text["version"])
    except InvalidVersion:
        want_version = None
        problems.append(f"version: {text['version']!r} is not a PEP 440 version")
    filename = text["filename"]
    if "/" in filename or "\\" in filename or filename in (".", "..") \
            or filename.startswith("."):
        problems.append(f"filename: {filename!r} is not a plain file name")
        return problems
    try:
        name, version, _build, tags = parse_wheel_filename(filename)
    except (InvalidWheelFilename, InvalidVersion) as exc:
        problems.append(f"filename: {filename!r} is not a wheel file name ({exc})")
        return problems
    if name != canonicalize_name(text["name"]):
        problems.append(f"filename: {filename!r} is not a wheel of {text['name']!r}")
    if want_version is not None and version != want_version:
        problems.append(f"filename: {filename!r} is not version {text['version']!r}")
    want = f"{text['python_tag']}-{text['abi_tag']}-{text['platform_tag']}"
    if not filename.endswith(f"-{want}.whl") or not tags:
        problems.append(f"filename: {filename!r} does not carry the tags {want!r}")
    return problems


def write(root: Path, entries: list[LockedWheel], trees: list[LockedTree] | None = None) -> Path:
    """Write the lock: ``trees`` None keeps the trees the lock already holds."""
    path = lock_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    if trees is None:
        trees = list(read_trees(root).values()) if path.exists() else []
    body: dict[str, object] = {
        "format": FORMAT,
        "sources": [asdict(e) for e in sorted(entries, key=lambda e: e.name)],
    }
    if trees:
        body["trees"] = [{**asdict(t), "paths": list(t.paths)}
                         for t in sorted(trees, key=lambda t: t.name)]
    from qwen38build.files import atomic_write

    atomic_write(path, (json.dumps(body, indent=2, sort_keys=True) + "\n").encode())
    return path


def tree_mismatch(loaded: LoadedRecipe, name: str, locked: LockedTree | None) -> str | None:
    """Why the lock's tree does not serve the recipe's ``[sources.<name>]``, or None."""
    spec = loaded.recipe.sources[name]
    if locked is None:
        return f"source {name!r} is not locked"
    for key, want, have in (("repository", spec.repository, locked.repository),
                            ("commit", spec.commit, locked.commit),
                            ("paths", tuple(spec.paths), locked.paths)):
        if want != have:
            return f"sources.{name}.{key} is {have!r} in the lock but {want!r} in the recipe"
    return None


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


def locked_vllm(loaded: LoadedRecipe, locked: dict[str, LockedWheel]) -> LockedWheel:
    """The lock's entry for the recipe's vLLM pin; LockError naming the mismatch."""
    pin = loaded.recipe.vllm
    entry = locked.get(pin.name)
    why = mismatch(
        entry, name=pin.name, version=pin.version, python_tag=pin.python_tag,
        abi_tag=pin.abi_tag, platform_tag=pin.platform_tag,
    )
    if why is not None or entry is None:
        hint = "run `qwen38build lock` to re-pin"
        if entry is not None and moved_pin(loaded, entry):
            # The pin was edited by hand: moving it is bump's job (it tries every patch on
            # the new pin, re-locks, and says what to do next), not a bare re-lock.
            hint = (f"run `qwen38build bump vllm {pin.version}` to move the pin from "
                    f"{entry.version} (add --dry-run to see first what it means for each "
                    "patch)")
        raise LockError(
            f"{lock_path(loaded.root)}: the lock does not match {loaded.path.name}: {why}.",
            hint=hint,
        )
    return entry


def moved_pin(loaded: LoadedRecipe, entry: LockedWheel) -> bool:
    """True when the recipe's vLLM pin differs from the locked ``entry`` in its version
    alone (its tags agree): the pin was edited, and the lock still holds the old one."""
    pin = loaded.recipe.vllm
    return entry.version != pin.version and (
        entry.python_tag, entry.abi_tag, entry.platform_tag
    ) == (pin.python_tag, pin.abi_tag, pin.platform_tag)
