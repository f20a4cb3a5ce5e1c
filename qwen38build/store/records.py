"""The shapes of the JSON the store writes: typed records, owned by the store.

They are ``TypedDict``s on purpose: the records are JSON on disk and read on the no-op path,
where constructing models would cost more than the answer. Each is checked where its bytes
come in (``entry.well_formed`` for an entry's record, ``record.read_build`` for a build
record) and typed everywhere after: no module reads store JSON untyped.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict


class Derivation(TypedDict):
    """What a step's digest covers, plus its human name (which it does not)."""

    kind: str
    implementation: str
    name: str
    params: dict[str, object]
    inputs: list[list[str]]
    deps: list[list[str]]


class OutputRecord(TypedDict):
    """One output of an entry as sealed: its sha256 and size, and the stat it had then (a
    link output: its target instead)."""

    sha256: str
    size: int
    mode: NotRequired[int]
    mtime_ns: NotRequired[int]
    ino: NotRequired[int]
    ctime_ns: NotRequired[int]
    link: NotRequired[str]
    target_sha256: NotRequired[str]  # a link: the sha256 its target entry records for it


class EntryRecord(TypedDict):
    """``objects/<digest>.json``: the derivation, every output, the tree digest."""

    derivation: Derivation
    outputs: dict[str, OutputRecord]
    tree: str
    digest: NotRequired[str]


class BuildStep(TypedDict):
    """One step of a build record: its derivation and, when this store holds it, its
    outputs' sha256 and tree (None for a build input a substituted step did not need)."""

    digest: str
    derivation: Derivation
    tree: str | None
    outputs: dict[str, str] | None
    built_with: NotRequired[dict[str, dict[str, str]]]


class BuildRecord(TypedDict):
    """``builds/<hash>.json``: a build's closure, enough to reproduce it."""

    format: int
    build: str
    steps: list[BuildStep]
    waived: NotRequired[list[str]]
    groups: NotRequired[list[str]]  # the series groups applied (a build of the vllm part)


class NoopRecord(TypedDict):
    """``fastpath/<key>.json``: what the no-op checks, and the answer it gives."""

    root: str
    files: list[str]
    dirs: list[str]
    fp: str
    tools: list[list[str]]
    stamp: str
    build: str
    outputs: list[list[str]]
    waived: list[str]
    groups: NotRequired[list[str] | None]


class HistoryRecord(TypedDict):
    """``history/<name>.json``: the last derivation built under a step's name (for why)."""

    digest: str
    derivation: Derivation
