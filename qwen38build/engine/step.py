"""The step (Nix: derivation): a frozen node of the build graph and its digest. Pure, no I/O.

A step's digest is sha256 over the canonical JSON of its kind, the implementation of that
kind (a hash of the source that decides its bytes; see qwen38build.steps), its parameters,
the sha256 of each input file and the digest of each step it depends on. Nothing else goes
in: no path of this machine, no time, no environment.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwen38build.digest import derivation_digest

if TYPE_CHECKING:
    from qwen38build.store.records import Derivation

__all__ = ["Step", "closure", "derivation_digest"]


@dataclass(frozen=True)
class Step:
    """One node of the graph. ``inputs`` maps a name to a file's sha256, in order."""

    kind: str
    implementation: str
    name: str
    params: Mapping[str, Any]
    inputs: tuple[tuple[str, str], ...] = ()
    deps: tuple[tuple[str, Step], ...] = ()
    # Where to read each input file on this machine: not part of the digest.
    input_paths: Mapping[str, Path] = field(default_factory=dict, compare=False)
    # What the step may use that cannot change its bytes (pip's target Python for a fetch,
    # whose bytes are checked against the sha256 in its params): not part of the digest.
    hints: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def derivation(self) -> Derivation:
        """Everything the digest covers, plus the human name (which it does not)."""
        return {
            "kind": self.kind,
            "implementation": self.implementation,
            "name": self.name,
            "params": dict(self.params),
            "inputs": [[k, v] for k, v in self.inputs],
            "deps": [[k, d.digest] for k, d in self.deps],
        }

    @cached_property
    def digest(self) -> str:
        return derivation_digest(self.derivation())

    @property
    def short(self) -> str:
        return self.digest[:12]

    def dep(self, name: str) -> Step:
        for k, d in self.deps:
            if k == name:
                return d
        raise KeyError(name)


def closure(top: Step) -> list[Step]:
    """``top`` and everything it depends on, dependencies first, each once."""
    order: list[Step] = []
    seen: set[str] = set()

    def visit(s: Step, path: tuple[str, ...]) -> None:
        if s.digest in seen:
            return
        if s.digest in path:
            raise ValueError("dependency cycle: " + " -> ".join((*path, s.name)))
        for _, d in s.deps:
            visit(d, (*path, s.digest))
        seen.add(s.digest)
        order.append(s)

    visit(top, ())
    return order


def walk(steps: list[Step]) -> Iterator[Step]:
    """Every step reachable from ``steps``, dependencies first, each once."""
    seen: set[str] = set()
    for top in steps:
        for s in closure(top):
            if s.digest not in seen:
                seen.add(s.digest)
                yield s
