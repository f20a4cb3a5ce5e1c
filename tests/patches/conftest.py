"""Fixtures for the patch behaviour tests.

``pristine_vllm`` and ``patched_vllm`` are two directories, each holding the files of the
``vllm/`` package (pass ``patched_vllm / "entrypoints/..."``): the pristine 0.32.0 wheel's
files, and the same files with the series below applied in order with
``patch -p1 --fuzz 0 --forward --batch``. Only the members the series touches and the extra
modules the tests load are extracted.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PATCHES_DIR = REPO / "patches"
VLLM_VERSION = "0.32.0"
WHEEL_NAME = f"vllm-{VLLM_VERSION}-cp38-abi3-manylinux_2_28_x86_64.whl"

# The tranche of the series these tests cover, in apply order (the ledger's table order).
SERIES = [
    "speed-knobs-envs",
    "engine-completion-log",
    "engine-stall-sentinel",
    "topk-honour-flashinfer-sampler-switch",
    "bench-probe-errors",
    "serve-model-path-match",
    "tokenize-v1-route",
    "marlin-int8-asym-zp",
    "compile-key-runtime-knobs",
    "auth-deny-default",
    "bench-sse-keepalive",
    "api-root-health",
    "vllm-pr61050-lru-running-prefix",
    "kv-cache-seat-budget",
    "dflash-context-capacity",
    "continuous-stream-usage",
]

# Package files the tests load beyond those the series touches (relative to vllm/).
EXTRA_MEMBERS: list[str] = [
    "entrypoints/openai/models/protocol.py",
    "scalar_type.py",
]

_TARGET_RE = re.compile(r"^\+\+\+ b/(\S+)$", re.MULTILINE)


def _series_files() -> list[Path]:
    files = [PATCHES_DIR / f"{topic}.patch" for topic in SERIES]
    missing = [f.name for f in files if not f.exists()]
    if missing:
        pytest.fail(f"series patches missing from {PATCHES_DIR}: {missing}")
    return files


def _find_wheel() -> Path:
    env = os.environ.get("QWEN38_VLLM_WHEEL")
    if env:
        return Path(env)
    cache = Path.home() / ".cache" / "qwen38build" / "test-wheels"
    wheel = cache / WHEEL_NAME
    if not wheel.exists():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                "--python-version", "3.12", "--platform", "manylinux_2_28_x86_64",
                f"vllm=={VLLM_VERSION}", "-d", str(cache),
            ],
            check=True,
        )
    return wheel


def _members() -> set[str]:
    members = set(EXTRA_MEMBERS)
    for patch in _series_files():
        members.update(_TARGET_RE.findall(patch.read_text()))
    return members


@pytest.fixture(scope="session")
def _vllm_trees(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    wheel = _find_wheel()
    root = tmp_path_factory.mktemp("vllm-trees")
    pristine = root / "pristine"
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        for member in sorted(_members()):
            name = f"vllm/{member}"
            if name in names:
                zf.extract(name, pristine)
    pristine = pristine / "vllm"
    pristine.mkdir(parents=True, exist_ok=True)
    patched = root / "patched" / "vllm"
    shutil.copytree(pristine, patched)
    for patch in _series_files():
        proc = subprocess.run(
            ["patch", "-p1", "--fuzz", "0", "--forward", "--batch", "-i", str(patch)],
            cwd=patched, capture_output=True, text=True, check=False,
        )
        if proc.returncode != 0:
            pytest.fail(f"{patch.name} does not apply at fuzz 0:\n{proc.stdout}{proc.stderr}")
    return pristine, patched


@pytest.fixture(scope="session")
def pristine_vllm(_vllm_trees: tuple[Path, Path]) -> Path:
    return _vllm_trees[0]


@pytest.fixture(scope="session")
def patched_vllm(_vllm_trees: tuple[Path, Path]) -> Path:
    return _vllm_trees[1]
