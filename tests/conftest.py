"""Shared fixtures: a tiny real project (wheel, recipe, lock, series) and its store.

The suite never touches the user's store, HOME or caches: before any test runs, ``HOME`` is
a fresh folder, and the store the end-to-end tests share (the real vLLM wheel, downloaded
once) and pip's and uv's caches live under the checkout's ``.cache/`` (ignored by git).
Every other test makes its own store.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.engine_fixtures import FILES, make_project, make_wheel, write_patch

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache"
os.environ["HOME"] = tempfile.mkdtemp(prefix="q38-test-home.")
os.environ["QWEN38BUILD_STORE"] = str(CACHE / "store")  # the lint session's too
os.environ["PIP_CACHE_DIR"] = str(CACHE / "pip")
os.environ["UV_CACHE_DIR"] = str(CACHE / "uv")
os.environ.pop("XDG_CACHE_HOME", None)
os.environ.pop("XDG_CONFIG_HOME", None)



@dataclass
class Project:
    root: Path
    store: Path
    wheels: Path
    tmp: Path

    def run(self, *argv: str) -> int:
        from qwen38build.cli import main

        return main(["--recipe", str(self.root / "recipe.toml"), "--store", str(self.store),
                     *argv])

    def patch(self, topic: str, rel: str, old: str, new: str) -> Path:
        return write_patch(self.root, "patches", topic, [(rel, old, new)], self.tmp / "diffs")


SERVER = FILES["vllm/server.py"]
ENVS = FILES["vllm/envs.py"]


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Project:
    """Two patches (one on server.py, one on envs.py) over a tiny wheel; wheel reachable
    through QWEN38BUILD_SOURCES so no index is needed."""
    wheels = tmp_path / "wheels"
    wheel = make_wheel(wheels)
    root = make_project(tmp_path / "proj", wheel, ["route-fix", "knob"])
    p = Project(root, tmp_path / "store", wheels, tmp_path)
    p.patch("route-fix", "server.py", SERVER, SERVER.replace("return 3\n", "return 33\n"))
    p.patch("knob", "envs.py", ENVS, ENVS.replace("KNOB_7 = 7\n", "KNOB_7 = 70\n"))
    monkeypatch.setenv("QWEN38BUILD_SOURCES", str(wheels))
    monkeypatch.chdir(root)
    return p


@pytest.fixture
def make() -> Callable[..., Path]:
    return make_wheel
