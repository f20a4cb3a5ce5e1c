"""A vendored tree's sources, defined once (``inputs/tree.py``): what the lint requires its
MANIFEST to list is what a build reads, and what is ignored (byte code, results/, the tree's
own .gitignore) is neither required nor refused."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from qwen38build.errors import InputError
from qwen38build.inputs.tree import manifest_files, source_files


def _tree(root: Path, files: dict[str, str], listed: list[str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "MANIFEST").write_text("".join(
        f"{hashlib.sha256((root / rel).read_bytes()).hexdigest()}  {rel}\n" for rel in listed))


FILES = {".gitignore": "*.cubin\n/build/\n", "csrc/a.cu": "// a\n",
         "python/pthfa/__init__.py": "", "python/pthfa/k.cubin": "ELF",
         "python/pthfa/__pycache__/x.pyc": "", "results/r.md": "# measured\n",
         "build/out.o": "", "PIN": "v0.1.0\n"}


def test_the_lint_and_the_build_agree_on_what_a_source_is(tmp_path: Path) -> None:
    sources = [".gitignore", "csrc/a.cu", "python/pthfa/__init__.py"]
    _tree(tmp_path, FILES, sources)
    assert source_files(tmp_path) == sources
    assert [rel for rel, _ in manifest_files(tmp_path, "python/pthfa")] == ["__init__.py"]
    assert [rel for rel, _ in manifest_files(tmp_path, "csrc")] == ["a.cu"]


def test_a_source_the_manifest_misses_is_refused_by_the_build(tmp_path: Path) -> None:
    _tree(tmp_path, {**FILES, "python/pthfa/extra.py": "X = 1\n"},
          [".gitignore", "csrc/a.cu", "python/pthfa/__init__.py"])
    assert "python/pthfa/extra.py" in source_files(tmp_path)  # and the lint requires it
    with pytest.raises(InputError, match=r"extra\.py: not listed in"):
        manifest_files(tmp_path, "python/pthfa")
