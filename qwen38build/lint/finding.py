"""A finding of the ledger's rules, and the context every rule reads (the recipe, its lines)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from qwen38build.inputs.recipe import LoadedRecipe

EXPORT_HINT = "fix the commit in the pinned vLLM checkout and regenerate the file with " \
    "qwen38build export; the patch files are not edited by hand"




@dataclass(frozen=True)
class Finding:
    """One broken rule: where (``file`` relative to the recipe root, 1-based ``line``), which
    rule, what is wrong (a sentence) and what to do (``hint``)."""

    file: Path
    line: int
    rule: str
    message: str
    hint: str

    def __str__(self) -> str:
        return f"{self.file.as_posix()}:{self.line}: [{self.rule}] {self.message}"


class Context:
    """The recipe, its root and the text of recipe.toml (for line numbers)."""

    def __init__(self, loaded: LoadedRecipe) -> None:
        self.loaded = loaded
        self.recipe = loaded.recipe
        self.root = loaded.root
        try:
            self.recipe_lines = loaded.path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            self.recipe_lines = []

    def rel(self, path: Path) -> Path:
        try:
            return path.resolve().relative_to(self.root)
        except ValueError:
            return path

    def finding(self, path: Path, line: int, rule: str, message: str, hint: str) -> Finding:
        return Finding(self.rel(path), max(line, 1), rule, message, hint)

    def recipe_line(self, needle: str, after: int = 0) -> int:
        """The 1-based line of recipe.toml holding ``needle`` at or after line ``after``."""
        for i in range(max(after - 1, 0), len(self.recipe_lines)):
            if needle in self.recipe_lines[i]:
                return i + 1
        return 1
