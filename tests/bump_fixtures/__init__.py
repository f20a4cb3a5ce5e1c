"""Tiny real inputs for the workspace and bump tests: wheels of two pins, a project whose
recipe has the real one's structure, and patch files cut with git."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from qwen38build.inputs import recipe
from qwen38build.inputs.recipe import LoadedRecipe
from qwen38build.store.store import Store
from tests import engine_fixtures
from tests.engine_fixtures import write_patch

PIN = "0.1.0"
NEW = "0.2.0"


def numbered(prefix: str, n: int = 30) -> str:
    """``n`` distinct lines: ``<prefix> line 1`` …"""
    return "".join(f"{prefix} line {i}\n" for i in range(1, n + 1))


def make_wheel(dest: Path, version: str, files: dict[str, str | bytes]) -> Path:
    """A real wheel of ``version``: ``files`` (package-relative) under vllm/."""
    return engine_fixtures.make_wheel(dest, {f"vllm/{k}": v for k, v in files.items()}, version)


@dataclass
class Project:
    root: Path
    wheels: Path
    store_root: Path
    tmp: Path

    def loaded(self) -> LoadedRecipe:
        return recipe.load(self.root / "recipe.toml")

    @property
    def store(self) -> Store:
        return Store(self.store_root)

    def patch(self, group: str, topic: str, diffs: Sequence[tuple[str, str | None, str | None]]) -> Path:
        """Write ``<group>/<topic>.patch`` from (file, old text, new text) triples.

        The files' diffs are in path order, as git writes them, so that an export of an
        unedited topic gives the same bytes.
        """
        return write_patch(self.root, group, topic, diffs, self.tmp / "diffs", pin=PIN)


def make_project(
    tmp: Path, wheel: Path, patches: list[str], kvarn: list[str] | None = None
) -> Project:
    """A project dir with recipe.toml naming the topics and lock/ pinning ``wheel``."""
    root = engine_fixtures.make_project(tmp / "proj", wheel, patches, kvarn, pin=PIN,
                                        archs=("8.0", "9.0"))
    return Project(root, wheel.parent, tmp / "store", tmp)
