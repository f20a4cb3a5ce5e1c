"""Tiny real inputs for the engine tests: a wheel (a zip with a true RECORD), a project
directory with recipe.toml, lock/ and a patch series, all made in a few lines."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import textwrap
import zipfile
from pathlib import Path

VERSION = "0.0.1"
WHEEL = f"vllm-{VERSION}-cp38-abi3-manylinux_2_28_x86_64.whl"

FILES = {
    "vllm/__init__.py": "__version__ = '0.0.1'\n",
    "vllm/envs.py": "".join(f"KNOB_{i} = {i}\n" for i in range(30)),
    "vllm/server.py": "".join(f"def route_{i}():\n    return {i}\n\n" for i in range(20)),
    "vllm/_C.abi3.so": "\x7fELF not really a library\n",
}


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(dest: Path, files: dict[str, str] | None = None, version: str = VERSION) -> Path:
    """A real wheel: deflated members, dist-info with METADATA, WHEEL and a true RECORD."""
    files = dict(FILES if files is None else files)
    di = f"vllm-{version}.dist-info"
    files[f"{di}/METADATA"] = f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n\n"
    files[f"{di}/WHEEL"] = "Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: cp38-abi3-linux_x86_64\n"
    record = "".join(f"{n},{record_hash(c.encode())},{len(c.encode())}\n" for n, c in files.items())
    files[f"{di}/RECORD"] = record + f"{di}/RECORD,,\n"
    path = dest / f"vllm-{version}-cp38-abi3-manylinux_2_28_x86_64.whl"
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, content in files.items():
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 2, 3, 4, 6))
            info.external_attr = 0o100644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, content)
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def git_diff(old: str, new: str, rel: str, tmp: Path) -> str:
    """A real `git diff --no-index` of two versions of one package file, paths a/<rel>."""
    a, b = tmp / "a" / rel, tmp / "b" / rel
    for p, text in ((a, old), (b, new)):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    proc = subprocess.run(
        ["git", "diff", "--no-index", "--no-color", "--no-ext-diff", "-U3",
         f"a/{rel}", f"b/{rel}"], cwd=tmp, capture_output=True, text=True, check=False,
    )
    return proc.stdout.replace(f"a/a/{rel}", f"a/{rel}").replace(f"b/b/{rel}", f"b/{rel}")


def patch_text(topic: str, diff: str, *, kind: str = "fix", pin: str = VERSION) -> str:
    return (
        f"Why {topic} is right.\n\n"
        f"Kind: {kind}\nWhat: {topic} does a thing\nUpstream: none\n"
        f"Cut-against: {pin}\nRetires-when: upstream PR\n"
        f"--- exported from {'ab' * 20} ({topic}); regenerate with qwen38build export, "
        "do not edit ---\n" + diff
    )


def write_patch(project: Path, topic: str, rel: str, old: str, new: str, tmp: Path) -> Path:
    path = project / "patches" / f"{topic}.patch"
    path.write_text(patch_text(topic, git_diff(old, new, rel, tmp / topic)))
    return path


def make_project(root: Path, wheel: Path, topics: list[str]) -> Path:
    """A project dir: recipe.toml naming ``topics``, lock/ pinning ``wheel``, pthfa/ PIN."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "patches").mkdir(exist_ok=True)
    (root / "kvarn").mkdir(exist_ok=True)
    (root / "pthfa").mkdir(exist_ok=True)
    (root / "pthfa" / "PIN").write_text("v0.1.0\n")
    (root / "pthfa" / "MANIFEST").write_text("")
    series = "".join(f'    "{t}.patch",\n' for t in topics)
    (root / "recipe.toml").write_text(textwrap.dedent(f"""\
        [vllm]
        version = "{VERSION}"

        [series]
        retired = ["old-topic"]

        [[series.groups]]
        dir = "patches"
        patches = [
        {series}]

        [[series.groups]]
        dir = "kvarn"
        patches = []

        [fa2]
        repository = "https://example.invalid/flash-attention"
        diff = "fa2/fp8-kv.diff"

        [pthfa]
        tag = "v0.1.0"

        [cuda]
        archs = ["8.6", "sm_90"]

        [toolchain]
        python = "3.12"
        torch = "2.11.0"
        cuda = "13.0"
        """))
    lock = {
        "format": 1,
        "sources": [{
            "name": "vllm", "version": VERSION, "filename": wheel.name, "python_tag": "cp38",
            "abi_tag": "abi3", "platform_tag": "manylinux_2_28_x86_64",
            "sha256": sha256(wheel), "size": wheel.stat().st_size,
        }],
    }
    (root / "lock").mkdir(exist_ok=True)
    (root / "lock" / "sources.json").write_text(json.dumps(lock, indent=2))
    return root
