"""Tiny real inputs for the workspace and bump tests: wheels of two pins, a project whose
recipe has the real one's structure, and patch files cut with git."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from qwen38build import recipe
from qwen38build.recipe import LoadedRecipe
from qwen38build.store import Store

PIN = "0.1.0"
NEW = "0.2.0"
PLATFORM = "manylinux_2_28_x86_64"


def numbered(prefix: str, n: int = 30) -> str:
    """``n`` distinct lines: ``<prefix> line 1`` …"""
    return "".join(f"{prefix} line {i}\n" for i in range(1, n + 1))


def wheel_name(version: str) -> str:
    return f"vllm-{version}-cp38-abi3-{PLATFORM}.whl"


def make_wheel(dest: Path, version: str, files: dict[str, str | bytes]) -> Path:
    """A real wheel: ``files`` (package-relative) under vllm/, dist-info with a true RECORD."""
    members: dict[str, bytes] = {
        f"vllm/{rel}": (c.encode() if isinstance(c, str) else c) for rel, c in files.items()
    }
    di = f"vllm-{version}.dist-info"
    members[f"{di}/METADATA"] = f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n\n".encode()
    members[f"{di}/WHEEL"] = b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: cp38-abi3-linux_x86_64\n"
    record = "".join(
        f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(c).digest()).rstrip(b'=').decode()},"
        f"{len(c)}\n"
        for n, c in members.items()
    )
    members[f"{di}/RECORD"] = (record + f"{di}/RECORD,,\n").encode()
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / wheel_name(version)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, content in members.items():
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 2, 3, 4, 6))
            info.external_attr = 0o100644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, content)
    return path


def git_diff(rel: str, old: str | None, new: str | None, tmp: Path) -> str:
    """``git diff --no-index`` of two versions of a package file, paths ``a/<rel>``."""
    tmp.mkdir(parents=True, exist_ok=True)
    sides = []
    for side, text in (("a", old), ("b", new)):
        if text is None:
            sides.append("/dev/null")
            continue
        p = tmp / side / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        sides.append(f"{side}/{rel}")
    proc = subprocess.run(
        ["git", "diff", "--no-index", "--no-color", "--no-ext-diff", "-U3", *sides],
        cwd=tmp, capture_output=True, text=True, check=False,
        env={"PATH": "/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null"},
    )
    out = proc.stdout.replace(f"a/a/{rel}", f"a/{rel}").replace(f"b/b/{rel}", f"b/{rel}")
    return out.replace(f"a/b/{rel}", f"a/{rel}").replace(f"b/a/{rel}", f"b/{rel}")


def patch_text(topic: str, diff: str, *, pin: str = PIN) -> str:
    return (
        f"Why {topic} is right: a paragraph of prose.\n"
        "# a line that starts like a comment stays in the body\n\n"
        f"Kind: fix\nWhat: {topic} does a thing\nUpstream: none\n"
        f"Cut-against: {pin}\nRetires-when: upstream PR\n"
        f"--- exported from {'ab' * 20} ({topic}); regenerate with qwen38build export, "
        "do not edit ---\n" + diff
    )


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
        diff = "".join(
            git_diff(rel, old, new, self.tmp / "diffs" / topic / str(i))
            for i, (rel, old, new) in enumerate(sorted(diffs, key=lambda d: d[0]))
        )
        path = self.root / group / f"{topic}.patch"
        path.write_text(patch_text(topic, diff))
        return path


RECIPE = """\
# qwen38build recipe (test): every input of the patched vLLM stack, in one place.

[vllm]
version = "{pin}"   # the pin: `bump` moves it
python_tag = "cp38"
abi_tag = "abi3"
platform_tag = "{platform}"

[series]
# Topics retired from the tree.
retired = ["old-topic"]

# The series, in apply order: the patches/ group first, then kvarn/.
[[series.groups]]
dir = "patches"
patches = [
{patches}]

[[series.groups]]
dir = "kvarn"
patches = [
{kvarn}]

[fa2]
repository = "https://example.invalid/flash-attention"
diff = "fa2/fp8-kv.diff"

[pthfa]
tag = "v0.1.0"
path = "pthfa"

[cuda]
archs = ["8.0", "9.0"]

[toolchain]
python = "3.12"
torch = "2.11.0"
cuda = "13.0"
"""


def make_project(
    tmp: Path, wheel: Path, patches: list[str], kvarn: list[str] | None = None
) -> Project:
    """A project dir with recipe.toml naming the topics and lock/ pinning ``wheel``."""
    root = tmp / "proj"
    for d in ("patches", "kvarn", "pthfa", "fa2", "lock"):
        (root / d).mkdir(parents=True, exist_ok=True)

    def listing(topics: list[str]) -> str:
        return "".join(f'    "{t}.patch",\n' for t in topics)

    (root / "recipe.toml").write_text(
        RECIPE.format(pin=PIN, platform=PLATFORM, patches=listing(patches),
                      kvarn=listing(kvarn or []))
    )
    lock = {
        "format": 1,
        "sources": [{
            "name": "vllm", "version": PIN, "filename": wheel.name, "python_tag": "cp38",
            "abi_tag": "abi3", "platform_tag": PLATFORM,
            "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
            "size": wheel.stat().st_size,
        }],
    }
    (root / "lock" / "sources.json").write_text(json.dumps(lock, indent=2, sort_keys=True) + "\n")
    return Project(root, wheel.parent, tmp / "store", tmp)
