"""A tiny project whose Python environment uv can lock and install with no network: a vLLM
wheel with Requires-Dist, tiny torch / CuPy / dependency wheels in a find-links folder, and
uv pointed at that folder only (its cache in the test's tmp)."""

from __future__ import annotations

import base64
import hashlib
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path

import pytest

from qwen38build.inputs.recipe import load
from qwen38build.store.store import Store
from qwen38build.wheels.venv import pthfa_step
from tests.conftest import ENVS, SERVER, Project
from tests.engine_fixtures import make_project, make_wheel, relist_pthfa

PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
# The pin's own requirements: the one that needs an extra and the one for another Python
# must not reach the lock (neither exists in the index).
PIN_REQUIRES = (
    "torch==2.11.0",
    "tinydep>=1",
    'bench-only-tool; extra == "bench"',
    'not-for-this-machine; platform_machine == "s390x"',
)


def dist_wheel(dest: Path, name: str, version: str, requires: Sequence[str] = (),
               files: dict[str, str] | None = None) -> Path:
    """A pure-Python wheel ``name==version`` with a true RECORD."""
    dist = name.replace("-", "_")
    di = f"{dist}-{version}.dist-info"
    members = {k: v.encode() for k, v in (files or {f"{dist}/__init__.py":
                                                    f"VERSION = {version!r}\n"}).items()}
    deps = "".join(f"Requires-Dist: {r}\n" for r in requires)
    members[f"{di}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{deps}\n".encode()
    members[f"{di}/WHEEL"] = b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = "".join(
        f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(c).digest()).rstrip(b'=').decode()},"
        f"{len(c)}\n" for n, c in members.items())
    members[f"{di}/RECORD"] = (record + f"{di}/RECORD,,\n").encode()
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for n, c in members.items():
            z.writestr(zipfile.ZipInfo(n, date_time=(2026, 1, 2, 3, 4, 6)), c)
    return path


def env_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                requires: Sequence[str] = PIN_REQUIRES, torch: str = "2.11.0") -> Project:
    """The conftest project's two patches over a vLLM wheel requiring ``requires``, the
    recipe's Python set to the running one, and an index folder uv alone reads."""
    wheels = tmp_path / "wheels"
    wheel = make_wheel(wheels, requires=requires)
    root = make_project(tmp_path / "proj", wheel, ["route-fix", "knob"])
    recipe = root / "recipe.toml"
    text = recipe.read_text().replace('python = "3.12"', f'python = "{PYTHON}"')
    recipe.write_text(text.replace('torch = "2.11.0"', f'torch = "{torch}"'))
    p = Project(root, tmp_path / "store", wheels, tmp_path)
    p.patch("route-fix", "server.py", SERVER, SERVER.replace("return 3\n", "return 33\n"))
    p.patch("knob", "envs.py", ENVS, ENVS.replace("KNOB_7 = 7\n", "KNOB_7 = 70\n"))
    index = tmp_path / "index"
    dist_wheel(index, "torch", "2.11.0", ["tinydep>=1"])
    dist_wheel(index, "torch", "2.13.0", ["tinydep>=1.1"])
    dist_wheel(index, "tinydep", "1.2.0")
    dist_wheel(index, "cupy-cuda13x", "14.2.0")
    monkeypatch.setenv("QWEN38BUILD_SOURCES", str(wheels))
    # uv's own configuration, as a user would write it: this folder is the only index.
    config = tmp_path / "uv.toml"
    config.write_text(f'no-index = true\nfind-links = ["{index}"]\n')
    monkeypatch.setenv("UV_CONFIG_FILE", str(config))
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    monkeypatch.chdir(root)
    return p


def add_pthfa_wheel(p: Project, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Put a built pthfa wheel into the store under the digest the recipe plans for it.

    No compiler runs: the kernels are planned against the project's stand-in toolchain, and
    the wheel (a tiny one) goes into the store as the kernels step would have put it.
    """
    src = p.root / "pthfa"
    (src / "csrc").mkdir(parents=True, exist_ok=True)
    (src / "csrc" / "decode.cu").write_text("// a kernel\n")
    (src / "python" / "pthfa").mkdir(parents=True, exist_ok=True)
    (src / "python" / "pthfa" / "__init__.py").write_text("")
    relist_pthfa(p.root)
    step = pthfa_step(load(p.root / "recipe.toml"))

    def fill(out: Path) -> None:
        dist_wheel(out, "pthfa", "0.1.0", files={"pthfa/__init__.py": "CUBINS = []\n"})

    entry = Store(p.store).add(step.digest, step.derivation(), fill)
    return entry.the_output(".whl")
