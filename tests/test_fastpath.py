"""The no-op fast path's key: every project file the build read, and nothing by hand.

For each file a build read (the collector's list, fa2 and pthfa files included), editing it
makes the no-op miss, and restoring it makes it hit again. A project reached through a
symlink hits, and a file that appears where the build only checked for one misses.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from qwen38build.engine import fastpath
from tests.conftest import Project

REPO = Path(__file__).resolve().parents[1]


def _record(store: Path) -> dict[str, object]:
    (path,) = (store / fastpath.DIR).glob("*.json")
    data: dict[str, object] = json.loads(path.read_text())
    return data


def _edited_misses(root: Path, store: Path, rel: str) -> None:
    """Editing ``rel`` (one byte appended) misses; putting the bytes back hits again.

    A file the build looked for and did not find misses when it appears."""
    recipe = root / "recipe.toml"
    path = root / rel
    before = path.read_bytes() if path.exists() else None
    try:
        path.write_bytes((before or b"") + b"\n")
        assert fastpath.lookup(store, recipe) is None, f"editing {rel} still hit"
    finally:
        if before is None:
            path.unlink()
        else:
            path.write_bytes(before)
    assert fastpath.lookup(store, recipe) is not None, f"restoring {rel} did not hit"


def test_every_file_the_build_read_is_in_the_key(project: Project) -> None:
    assert project.run("build", "--no-link") == 0
    rec = _record(project.store)
    files = rec["files"]
    assert isinstance(files, list)
    # What this project's build must have read, found by the collector, not listed by hand.
    assert {"recipe.toml", "lock/sources.json", "patches/route-fix.patch", "patches/knob.patch",
            "pthfa/PIN", "pthfa/MANIFEST"} <= set(files)
    assert all(not f.startswith(("qwen38build/", ".venv/")) for f in files)
    # a name opened inside a temporary tree (shutil.rmtree opens by dir_fd) is not a read
    # of the project: every file in the key is the project's, or one it looked for
    assert [f for f in files if not (project.root / f).exists()] == ["pthfa/.gitignore"]
    for rel in files:
        _edited_misses(project.root, project.store, rel)


def test_a_file_appearing_where_the_build_only_looked_misses(project: Project) -> None:
    """The FA2 diff is declared but absent; once it exists lint has a finding."""
    assert project.run("build", "--no-link") == 0
    assert fastpath.lookup(project.store, project.root / "recipe.toml") is not None
    (project.root / "fa2" / "fp8-kv.diff").write_text("diff\n")
    assert fastpath.lookup(project.store, project.root / "recipe.toml") is None
    assert project.run("build", "--no-link") == 2  # and the full path's lint says why


def test_a_project_reached_through_a_symlink_hits(project: Project, tmp_path: Path) -> None:
    assert project.run("build", "--no-link") == 0
    link = tmp_path / "link-to-project"
    link.symlink_to(project.root, target_is_directory=True)
    assert fastpath.lookup(project.store, link / "recipe.toml") is not None


@pytest.mark.e2e
@pytest.mark.slow
def test_real_project_every_read_file_misses(tmp_path: Path) -> None:
    """The project's own recipe: patches, lock, pthfa sources and manifest, all keyed."""
    root = tmp_path / "proj"
    for part in ("recipe.toml", "lock", "patches", "kvarn", "fa2", "pthfa", "PATCHES.md"):
        src = REPO / part
        if src.is_dir():
            shutil.copytree(src, root / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            root.mkdir(exist_ok=True)
            shutil.copy2(src, root / part)
    store = tmp_path / "store"
    # The wheel and the environment lock: the kernels' compile is not what this is about,
    # and lint reads every pthfa file (its manifest) whatever the outputs.
    recipe = (root / "recipe.toml").read_text()
    outputs = re.search(r'^outputs = \[.*\]$', recipe, re.MULTILINE)
    assert outputs is not None, "recipe.toml names its [build] outputs"
    (root / "recipe.toml").write_text(recipe.replace(outputs.group(0),
                                                     'outputs = ["vllm", "pylock"]'))
    from tests.patches.conftest import built_wheels

    # the pinned wheel, fetched once into the suite's store (whatever ran before this test)
    env_sources = str(built_wheels()[1].parent)
    proc = subprocess.run(
        [sys.executable, "-m", "qwen38build", "--store", str(store), "build", "--no-link", "-q"],
        cwd=root, capture_output=True, text=True, check=False,
        env={"PATH": "/usr/bin:/bin", "QWEN38BUILD_SOURCES": env_sources},
    )
    assert proc.returncode == 0, proc.stderr
    files = _record(store)["files"]
    assert isinstance(files, list)
    assert {"pthfa/csrc/decode.cu", "pthfa/MANIFEST", "pthfa/PIN", "lock/pylock.toml",
            "lock/pylock.inputs.json", "patches/speed-knobs-envs.patch"} <= set(files)
    # the vLLM tree the lint patches in a temporary folder is not the project (shutil.rmtree
    # opens its folders by dir_fd, and the audit event does not say so)
    strays = [f for f in files if not (root / f).exists()
              and f.split("/")[0] not in ("fa2", "pthfa", "kvarn")]
    assert strays == []
    for rel in files:
        _edited_misses(root, store, rel)
