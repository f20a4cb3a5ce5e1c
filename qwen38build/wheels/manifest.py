"""The shapes of what the patch and wheel steps record: which patch owns each file, and
the patched wheel's manifest (read by verify and apply). Typed records of JSON the store
holds; checked where they are read (``installed.read_manifest``)."""

from __future__ import annotations

from typing import NotRequired, TypedDict


class OwnedFile(TypedDict):
    """A file the series touches: its pristine and patched sha256 (None: absent) and the
    patches that change it, in series order."""

    pristine: str | None
    patched: str | None
    owners: list[str]


class HunkOffset(TypedDict):
    file: str
    hunk: int
    line: int
    offset: int


class PatchApplied(TypedDict):
    """One patch as the patch step applied it: the hunks GNU patch moved."""

    patch: str
    offsets: list[HunkOffset]


class PatchReport(TypedDict):
    """``patch.json``, the patch step's report."""

    package: str
    files: dict[str, OwnedFile]
    patches: list[PatchApplied]
    groups: NotRequired[list[str]]  # the series groups applied, in order


class Manifest(TypedDict):
    """``manifest.json`` beside the patched wheel: what it is, and every file's bytes."""

    name: str
    version: str
    local_version: str
    wheel: str
    package: str
    dist_info: str
    owned: dict[str, OwnedFile]
    patches: list[PatchApplied]
    record: dict[str, list[str | int]]  # member → [RECORD hash, size]
    groups: NotRequired[list[str]]  # the series groups built, in order
