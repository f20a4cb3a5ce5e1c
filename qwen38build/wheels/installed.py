"""verify and apply: an installed tree against the exact bytes of a build.

The build's manifest knows the sha256 of every file the series owns and the RECORD of
every other file. Verifying hashes the owned files and checks every other file by name and
size (``full=True`` hashes them all); each difference is named with the patches that own it.
Exact where the old reverse dry-run was not: two patches on one file are one final hash.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from qwen38build.digest import sha256_file
from qwen38build.errors import InputError
from qwen38build.wheels import record as wheelrecord

# verify is a hot command: typing and dataclasses (inspect) would be a third of its time.
TYPE_CHECKING = False
if TYPE_CHECKING:

    from qwen38build.wheels.manifest import Manifest, OwnedFile


class Problem:
    """One difference: ``path`` relative to the package's parent (e.g. vllm/envs.py),
    ``kind`` one of drifted, missing, extra, not-deleted, and the patches that own it."""

    __slots__ = ("kind", "owners", "path")

    def __init__(self, path: str, kind: str, owners: tuple[str, ...] = ()) -> None:
        self.path, self.kind, self.owners = path, kind, owners

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Problem) and self.as_json() == other.as_json()

    def __hash__(self) -> int:
        return hash((self.path, self.kind, self.owners))

    def as_json(self) -> dict[str, object]:
        return {"path": self.path, "kind": self.kind, "owners": list(self.owners)}

    def __str__(self) -> str:
        owned = f" (owned by {', '.join(self.owners)})" if self.owners else ""
        return f"{self.kind}: {self.path}{owned}"


MANIFEST = "manifest.json"


def read_manifest(out: Path) -> Manifest:
    """The manifest the wheel step wrote beside the wheel."""
    path = out / MANIFEST
    try:
        data: Manifest = json.loads(path.read_bytes())
        if not isinstance(data, dict) or not isinstance(data.get("owned"), dict) \
                or not isinstance(data.get("record"), dict):
            raise ValueError("not a manifest object with 'owned' and 'record'")
    except (OSError, ValueError) as exc:
        from qwen38build.errors import StoreError

        raise StoreError(f"{path}: unreadable build manifest: {exc}.",
                         hint="run `qwen38build store verify`, then rebuild") from None
    return data  # its shape checked above, its bytes by the entry's record


def owned_paths(manifest: Manifest) -> dict[str, OwnedFile]:
    """The manifest's owned files, each package path past the one member check: a
    manifest is read from the store, and its paths are about to be read or written."""
    from qwen38build.wheels.wheelzip import safe_member

    package = str(manifest["package"])
    safe_member(package)
    owned = manifest["owned"]
    for rel in owned:
        safe_member(f"{package}/{rel}")
    return owned


def find_package(path: Path, package: str) -> Path:
    """``path`` itself if it is the package dir, else ``path/<package>``."""
    if (path / package).is_dir():
        return path / package
    if path.name == package and path.is_dir():
        return path
    raise InputError(
        f"{path}: holds no {package}/ package.",
        hint="give a site-packages directory or the package directory itself",
    )


def verify_tree(path: Path, manifest: Manifest, *, full: bool = False) -> list[Problem]:
    package = str(manifest["package"])
    owned = owned_paths(manifest)
    pkg = find_package(path, package)
    record = {
        k: v for k, v in manifest["record"].items() if k.startswith(package + "/")
    }
    problems: list[Problem] = []
    for rel, rec in sorted(owned.items()):
        p = pkg / rel
        owners = tuple(rec["owners"])
        name = f"{package}/{rel}"
        if rec["patched"] is None:
            if p.exists():
                problems.append(Problem(name, "not-deleted", owners))
        elif not p.is_file():
            problems.append(Problem(name, "missing", owners))
        elif sha256_file(p) != rec["patched"]:
            problems.append(Problem(name, "drifted", owners))
    present = _sizes(str(pkg), package)
    owned_names = {f"{package}/{r}" for r in owned}
    for name in sorted(set(record) - set(present) - owned_names):
        problems.append(Problem(name, "missing"))
    for name in sorted(set(present) - set(record) - owned_names):
        problems.append(Problem(name, "extra"))
    for name in sorted((set(record) & set(present)) - owned_names):
        rec_hash, size = record[name]
        if present[name] != int(size) or (
            full and wheelrecord.hash_from_hex(sha256_file(pkg.parent / name)) != rec_hash
        ):
            problems.append(Problem(name, "drifted"))
    return problems


def _sizes(top: str, prefix: str) -> dict[str, int]:
    """Every file below ``top`` (byte code left out) by ``prefix/relative path``: its size.

    os.scandir, not pathlib: a vLLM tree is 5,000 files and this is verify's hot loop.
    """
    out: dict[str, int] = {}
    stack = [(top, prefix)]
    while stack:
        directory, rel = stack.pop()
        with os.scandir(directory) as it:
            for entry in it:
                name = f"{rel}/{entry.name}"
                if entry.is_dir(follow_symlinks=False):
                    if entry.name != "__pycache__":
                        stack.append((entry.path, name))
                elif not entry.name.endswith(".pyc"):
                    try:
                        out[name] = entry.stat().st_size
                    except OSError as exc:  # a link loop, a dangling link: name it here
                        from qwen38build.errors import from_os_error

                        raise from_os_error(exc, "reading the installed tree") from None
    return out


def verify_dist_info(site: Path, manifest: Manifest) -> list[Problem]:
    """The installed vLLM's dist-info against the build: its METADATA must name this build's
    version, or the pin itself (a tree ``apply`` wrote into, whose dist-info stays the
    pristine one); where it is the build's own dist-info, every file the wheel's RECORD
    lists for it (METADATA, WHEEL, entry points, ...) must hold those bytes."""
    name, dist = str(manifest["name"]), str(manifest["dist_info"])
    try:
        version, found = installed_version(site, name)
    except InputError:
        return [Problem(f"{dist}/", "missing")]
    if version not in (manifest["local_version"], manifest["version"]):
        return [Problem(f"{found.name}/METADATA", f"another-build ({version})")]
    if found.name != dist:
        return []  # the pin's own dist-info: an applied tree, its files are pip's
    return _against_record(site, {m: str(v[0]) for m, v in manifest["record"].items()
                                  if m.startswith(dist + "/")})


def verify_wheel_files(site: Path, wheel: Path) -> list[Problem]:
    """Every member an installed wheel's RECORD lists (pthfa's, with its cubins) against
    the bytes the wheel in the store holds; files the installer adds are not the wheel's."""
    from qwen38build.wheels.wheelzip import member_infos, read_record

    dists = {n.split("/", 1)[0] for n in member_infos(wheel) if n.endswith(".dist-info/RECORD")}
    return _against_record(site, {m: h for d in sorted(dists)
                                  for m, (h, _size) in read_record(wheel, d).items()})


def _against_record(site: Path, hashes: dict[str, str]) -> list[Problem]:
    """Each member (RECORD hash by site-relative path) missing from ``site`` or drifted."""
    problems = []
    for member, want in sorted(hashes.items()):
        f = site / member
        if not f.is_file():
            problems.append(Problem(member, "missing"))
        elif wheelrecord.hash_from_hex(sha256_file(f)) != want:
            problems.append(Problem(member, "drifted"))
    return problems


def installed_version(site: Path, name: str) -> tuple[str, Path]:
    """The version of ``name`` installed in ``site``, from its dist-info METADATA."""
    found = sorted(site.glob(f"{name}-*.dist-info"))
    if len(found) != 1:
        raise InputError(
            f"{site}: expected one {name}-*.dist-info, found {len(found)}.",
            hint="give the site-packages directory of a venv with vLLM installed",
        )
    for line in (found[0] / "METADATA").read_text().splitlines():
        if line.startswith("Version: "):
            return line[len("Version: "):].strip(), found[0]
    raise InputError(f"{found[0]}/METADATA: no Version line.")


def apply_tree(site: Path, manifest: Manifest, built_tree: Path) -> list[str]:
    """Write the build's files into an installed vLLM of the same pin; returns what changed.

    Only bytes whose sha256 is the manifest's reach the tree: each file is copied to a
    temp file of a random name while hashed, and only when every one matches are they
    renamed into place. A stored file edited after its build is refused, nothing written.
    """
    package, version = str(manifest["package"]), str(manifest["version"])
    have, dist_info = installed_version(site, str(manifest["name"]))
    if have.split("+", 1)[0] != version:
        raise InputError(
            f"{site}: vLLM {have} is installed, but this build is of {version}; refused.",
            hint=f"install vllm=={version} first, or build the recipe for {have}",
        )
    pkg = find_package(site, package)
    changed: list[str] = []
    updates: dict[str, tuple[str, int] | None] = {}
    staged: list[tuple[Path, Path]] = []
    try:
        for rel, rec in sorted(owned_paths(manifest).items()):
            target = pkg / rel
            name = f"{package}/{rel}"
            if rec["patched"] is None:
                if target.exists():
                    changed.append(name)
                    updates[name] = None
                continue
            if target.is_file() and sha256_file(target) == rec["patched"]:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = _staged_copy(built_tree / rel, target, rec["patched"])
            staged.append((tmp, target))
            changed.append(name)
            updates[name] = (wheelrecord.hash_from_hex(rec["patched"]), tmp.stat().st_size)
        for tmp, target in staged:
            os.replace(tmp, target)
        staged.clear()
    finally:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
    for name, new in updates.items():
        if new is None:
            (pkg.parent / name).unlink(missing_ok=True)
    if updates:
        _update_record(dist_info / "RECORD", updates)
    return changed


def _staged_copy(src: Path, target: Path, sha256: str) -> Path:
    """Copy ``src`` beside ``target`` under a random name, refusing other bytes."""
    from qwen38build.digest import copy_hashing
    from qwen38build.errors import StoreError

    tmp = target.with_name(f".{target.name}.{os.getpid()}.{os.urandom(6).hex()}.q38tmp")
    try:
        with src.open("rb") as fi, open(tmp, "xb") as fo:
            got, _ = copy_hashing(fi, fo)
        os.chmod(tmp, 0o644)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if got != sha256:
        tmp.unlink()
        raise StoreError(
            f"{src}: its sha256 {got[:12]} is not the build manifest's {sha256[:12]}; the "
            "stored file was changed after its build. Nothing was written.",
            hint="run `qwen38build build --rebuild` to rebuild it, then apply again",
        )
    return tmp


def _update_record(path: Path, updates: dict[str, tuple[str, int] | None]) -> None:
    """Keep the installed RECORD true for the files apply wrote (pip reads it)."""
    from qwen38build.files import atomic_write

    atomic_write(path, wheelrecord.update(path.read_bytes(), updates))

