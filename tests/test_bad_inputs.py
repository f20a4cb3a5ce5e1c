"""The corpus of bad inputs: each is refused with one line, and nothing is touched.

Every case starts from a copy of one good project (two patches over a tiny wheel) and a
copy of a store that already holds its build, breaks one thing, and runs the CLI
in-process. Each asserts: the exit code; exactly one line on stderr, ``error: ...``,
naming the file and the place; the store tree unchanged (byte for byte, modes and links
included); the project and a sentinel folder outside it unchanged.

One allowance, owned by the ``store`` branch: a step that fails leaves its empty file
lock in ``locks/`` (issue 10, item 9); empty ``locks/*.lock`` files are left out of the
store's snapshot, nothing else is.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.engine_fixtures import (
    FILES,
    VERSION,
    add_pthfa_sources,
    make_project,
    make_wheel,
    patch_text,
    sha256,
    wheel_name,
    write_patch,
)

SERVER = FILES["vllm/server.py"]
ENVS = FILES["vllm/envs.py"]
REPO = Path(__file__).resolve().parent.parent


@dataclass
class Env:
    """One case's world: a project, a store holding its build, a sentinel outside both."""

    root: Path
    store: Path
    sentinel: Path
    wheels: Path
    tmp: Path
    build: str

    @property
    def recipe(self) -> Path:
        return self.root / "recipe.toml"

    @property
    def lock(self) -> Path:
        return self.root / "lock" / "sources.json"

    def edit(self, old: str, new: str, path: Path | None = None) -> None:
        p = path or self.recipe
        text = p.read_text()
        assert old in text, (old, p)
        p.write_text(text.replace(old, new, 1))

    def lock_entry(self, **fields: object) -> None:
        data = json.loads(self.lock.read_text())
        for k, v in fields.items():
            if v is DELETE:
                del data["sources"][0][k]
            else:
                data["sources"][0][k] = v
        self.lock.write_text(json.dumps(data))

    def lock_top(self, value: object) -> None:
        self.lock.write_text(json.dumps(value))

    def patch(self, body: str, name: str = "route-fix") -> Path:
        group = "patches" if name in ("route-fix", "knob") else "kvarn"
        if group == "kvarn":
            self.edit('dir = "kvarn"\npatches = [\n', f'dir = "kvarn"\npatches = [\n"{name}.patch",\n')
        path = self.root / group / f"{name}.patch"
        path.write_text(patch_text(name, body))
        return path

    def pin_wheel(self, path: Path) -> None:
        """Make the lock pin ``path`` (as the good wheel's file name) and serve it."""
        served = self.tmp / "served"
        served.mkdir(exist_ok=True)
        dest = served / wheel_name(VERSION)
        shutil.copyfile(path, dest)
        self.lock_entry(sha256=sha256(dest), size=dest.stat().st_size)
        os.environ["QWEN38BUILD_SOURCES"] = str(served)


DELETE = object()


@dataclass(frozen=True)
class Case:
    id: str
    setup: Callable[[Env], list[str]]
    code: int
    expect: tuple[str, ...]  # in the error line: the file, the place, what is wrong


CASES: list[Case] = []


def case(id: str, *expect: str, code: int = 2) -> Callable[[Callable[[Env], list[str]]], None]:
    def register(fn: Callable[[Env], list[str]]) -> None:
        CASES.append(Case(id, fn, code, expect))

    return register


def build(env: Env) -> list[str]:
    return ["build", "-q", "--no-link"]


# -- recipe ------------------------------------------------------------------------------

R = "recipe.toml"


def recipe_edit(id: str, old: str, new: str, *expect: str) -> None:
    def setup(env: Env) -> list[str]:
        env.edit(old, new)
        return build(env)

    CASES.append(Case(f"recipe-{id}", setup, 2, (R, *expect)))


recipe_edit("toml-syntax", "[cuda]", "[cuda", "not valid TOML")
recipe_edit("unknown-top-key", "[cuda]", "colour = 1\n[cuda]", "colour: unknown key")
recipe_edit("unknown-vllm-key", 'abi_tag = "abi3"', 'abi_tag = "abi3"\nsha = 1',
            "vllm.sha: unknown key")
recipe_edit("missing-vllm", "[vllm]", "[vllm_]", "vllm: required key is missing")
recipe_edit("version-not-pep440", f'version = "{VERSION}"', 'version = "one.two"',
            "vllm.version:", "not a PEP 440 version")
recipe_edit("version-int", f'version = "{VERSION}"', "version = 3", "vllm.version:")
recipe_edit("arch-banana", 'archs = ["8.6", "sm_90"]', 'archs = ["8.6", "banana"]',
            "cuda.archs.1:", "not a CUDA arch")
recipe_edit("arch-9", 'archs = ["8.6", "sm_90"]', 'archs = ["9"]', "cuda.archs.0:")
recipe_edit("arch-major-4", 'archs = ["8.6", "sm_90"]', 'archs = ["4.0"]', "cuda.archs.0:")
recipe_edit("archs-empty", 'archs = ["8.6", "sm_90"]', "archs = []", "cuda.archs:")
recipe_edit("archs-string", 'archs = ["8.6", "sm_90"]', 'archs = "9.0"', "cuda.archs:")
recipe_edit("group-dir-dotdot", 'dir = "patches"', 'dir = "../.."', "series.groups.0.dir:",
            "outside the project")
recipe_edit("group-dir-absolute", 'dir = "patches"', 'dir = "/etc"', "series.groups.0.dir:",
            "absolute")
recipe_edit("group-dir-empty", 'dir = "patches"', 'dir = ""', "series.groups.0.dir:")
recipe_edit("group-dir-nul", 'dir = "patches"', 'dir = "pat\\u0000ches"',
            "series.groups.0.dir:")
recipe_edit("group-dir-backslash", 'dir = "patches"', 'dir = "..\\\\..\\\\etc"',
            "series.groups.0.dir:")
recipe_edit("group-dir-missing", 'dir = "kvarn"', 'dir = "nowhere"', "series.groups.1.dir:",
            "does not exist")
recipe_edit("group-twice", 'dir = "kvarn"', 'dir = "patches"', "series.groups.1.dir:",
            "listed twice")
recipe_edit("pthfa-dotdot", 'path = "pthfa"', 'path = "../sentinel"', "pthfa.path:",
            "outside the project")
recipe_edit("pthfa-absolute", 'path = "pthfa"', 'path = "/tmp"', "pthfa.path:", "absolute")
recipe_edit("fa2-dotdot", 'diff = "fa2/fp8-kv.diff"', 'diff = "../../../etc/passwd"',
            "fa2.diff:", "outside the project")
recipe_edit("fa2-absolute", 'diff = "fa2/fp8-kv.diff"', 'diff = "/etc/passwd"', "fa2.diff:",
            "absolute")
recipe_edit("fa2-a-folder", 'diff = "fa2/fp8-kv.diff"', 'diff = "fa2"', "fa2.diff:",
            "not a regular file")
recipe_edit("entry-with-slash", '"route-fix.patch"', '"../route-fix.patch"',
            "series.groups.0.patches.0:")
recipe_edit("entry-not-dot-patch", '"route-fix.patch"', '"route-fix.diff"',
            "series.groups.0.patches.0:")
recipe_edit("entry-missing", '"route-fix.patch"', '"route-fix.patch",\n    "gone.patch"',
            "series.groups.0.patches.1:", "does not exist")
recipe_edit("entry-twice", '"route-fix.patch"', '"route-fix.patch",\n    "knob.patch"',
            "series.groups.0.patches.2:", "listed twice")


@case("recipe-retired-listed", R, "series.groups.0.patches.1:", "retired")
def _(env: Env) -> list[str]:
    (env.root / "patches" / "old-topic.patch").write_text("x\n")
    env.edit('"route-fix.patch"', '"route-fix.patch",\n    "old-topic.patch"')
    return build(env)


recipe_edit("toolchain-python", 'python = "3.12"', 'python = "three"', "toolchain.python:")
recipe_edit("source-commit-not-hex", 'commit = "0123456789abcdef0123456789abcdef01234567"',
            'commit = "xyz"', "sources.flash-attention.commit:")
recipe_edit("fa2-source-undeclared", 'source = "flash-attention"', 'source = "nowhere"',
            "fa2.source: 'nowhere' names no [sources.nowhere] table")
recipe_edit("groups-a-string", "[[series.groups]]\ndir = \"patches\"",
            "[[series.groups]]\ndir = [\"patches\"]", "series.groups.0.dir:")
recipe_edit("patches-a-string", 'patches = [\n    "route-fix.patch"',
            'patches = "x"\nthe_rest = [\n    "route-fix.patch"', "series.groups.0.patches:")


@case("recipe-missing", "nowhere.toml", "cannot read")
def _(env: Env) -> list[str]:
    return ["--recipe", str(env.root / "nowhere.toml"), "build"]


@case("recipe-a-folder", "cannot read")
def _(env: Env) -> list[str]:
    (env.root / "folder.toml").mkdir()
    return ["--recipe", str(env.root / "folder.toml"), "build"]


@case("recipe-not-utf8", R, "not valid TOML")
def _(env: Env) -> list[str]:
    env.recipe.write_bytes(b"\xff\xfe" + env.recipe.read_bytes())
    return build(env)


@case("recipe-dangling-link", "dangling.toml", "cannot read")
def _(env: Env) -> list[str]:
    (env.root / "dangling.toml").symlink_to(env.root / "gone.toml")
    return ["--recipe", str(env.root / "dangling.toml"), "build"]


@case("recipe-link-loop", "loop.toml", "cannot read")
def _(env: Env) -> list[str]:
    (env.root / "loop.toml").symlink_to(env.root / "loop2.toml")
    (env.root / "loop2.toml").symlink_to(env.root / "loop.toml")
    return ["--recipe", str(env.root / "loop.toml"), "build"]


@case("group-dir-link-out", R, "series.groups.0.dir:", "outside the project")
def _(env: Env) -> list[str]:
    (env.root / "out").symlink_to(env.sentinel)
    env.edit('dir = "patches"', 'dir = "out"')
    return build(env)


@case("group-dir-a-file", R, "series.groups.1.dir:", "not a folder")
def _(env: Env) -> list[str]:
    shutil.rmtree(env.root / "kvarn")
    (env.root / "kvarn").write_text("a file\n")
    return build(env)


@case("group-dir-link-loop", R, "series.groups.1.dir:", "cannot be read")
def _(env: Env) -> list[str]:
    shutil.rmtree(env.root / "kvarn")
    (env.root / "kvarn").symlink_to(env.root / "kvarn2")
    (env.root / "kvarn2").symlink_to(env.root / "kvarn")
    return build(env)


@case("pthfa-link-out", R, "pthfa.path:", "outside the project")
def _(env: Env) -> list[str]:
    shutil.rmtree(env.root / "pthfa")
    (env.root / "pthfa").symlink_to(env.sentinel)
    return build(env)


@case("pthfa-a-file", R, "pthfa.path:", "not a folder")
def _(env: Env) -> list[str]:
    shutil.rmtree(env.root / "pthfa")
    (env.root / "pthfa").write_text("x\n")
    return build(env)


@case("fa2-link-out", R, "fa2.diff:", "outside the project")
def _(env: Env) -> list[str]:
    (env.root / "fa2" / "fp8-kv.diff").symlink_to(env.sentinel / "secret")
    return build(env)


@case("fa2-dangling-link", R, "fa2.diff:", "dangling")
def _(env: Env) -> list[str]:
    (env.root / "fa2" / "fp8-kv.diff").symlink_to(env.root / "fa2" / "gone")
    return build(env)


def _entry(env: Env) -> Path:
    path = env.root / "patches" / "route-fix.patch"
    path.unlink()
    return path


@case("entry-a-folder", R, "series.groups.0.patches.0:", "not a regular file")
def _(env: Env) -> list[str]:
    _entry(env).mkdir()
    return build(env)


@case("entry-dangling-link", R, "series.groups.0.patches.0:", "dangling link")
def _(env: Env) -> list[str]:
    _entry(env).symlink_to(env.root / "gone.patch")
    return build(env)


@case("entry-link-out", R, "series.groups.0.patches.0:", "outside the project")
def _(env: Env) -> list[str]:
    (env.sentinel / "x.patch").write_text("x\n")
    _entry(env).symlink_to(env.sentinel / "x.patch")
    return build(env)


@case("entry-link-loop", R, "series.groups.0.patches.0:", "cannot be read")
def _(env: Env) -> list[str]:
    _entry(env).symlink_to(env.root / "patches" / "loop.patch")
    (env.root / "patches" / "loop.patch").symlink_to(env.root / "patches" / "route-fix.patch")
    env.edit('"route-fix.patch"', '"route-fix.patch",\n    "loop.patch"')
    return build(env)


@case("entry-a-fifo", R, "series.groups.0.patches.0:", "not a regular file")
def _(env: Env) -> list[str]:
    os.mkfifo(_entry(env))
    return build(env)


@case("entry-link-to-dev-null", R, "series.groups.0.patches.0:", "outside the project")
def _(env: Env) -> list[str]:
    _entry(env).symlink_to("/dev/null")
    return build(env)


@case("stray-patch-in-folder", R, "series.groups.0.patches:", "not in the series")
def _(env: Env) -> list[str]:
    (env.root / "patches" / "stray.patch").write_text("x\n")
    return build(env)


# lint: the same refusals as build, no traceback
for _id, _old, _new, _where in (
    ("missing", '"route-fix.patch"', '"route-fix.patch",\n    "gone.patch"',
     "series.groups.0.patches.1:"),
    ("dotdot", 'dir = "patches"', 'dir = "../.."', "series.groups.0.dir:"),
    ("fa2-out", 'diff = "fa2/fp8-kv.diff"', 'diff = "/etc/passwd"', "fa2.diff:"),
):
    def _lint(env: Env, old: str = _old, new: str = _new) -> list[str]:
        env.edit(old, new)
        return ["lint"]

    CASES.append(Case(f"lint-recipe-{_id}", _lint, 2, (R, _where)))


# -- lock ----------------------------------------------------------------------------------

L = "lock/sources.json"


def lock_case(id: str, place: str, **fields: object) -> None:
    def setup(env: Env) -> list[str]:
        env.lock_entry(**fields)
        return build(env)

    CASES.append(Case(f"lock-{id}", setup, 2, (L, place)))


lock_case("filename-absolute", "sources[0].filename", filename="/etc/passwd")
lock_case("filename-abs-wheel", "sources[0].filename", filename=f"/tmp/{wheel_name(VERSION)}")
lock_case("filename-dotdot", "sources[0].filename", filename=f"../{wheel_name(VERSION)}")
lock_case("filename-deep-dotdot", "sources[0].filename",
          filename=f"../../sentinel/{wheel_name(VERSION)}")
lock_case("filename-slash", "sources[0].filename", filename=f"a/{wheel_name(VERSION)}")
lock_case("filename-backslash", "sources[0].filename", filename=f"..\\{wheel_name(VERSION)}")
lock_case("filename-dot", "sources[0].filename", filename=".")
lock_case("filename-dotdot-only", "sources[0].filename", filename="..")
lock_case("filename-empty", "sources[0].filename", filename="")
lock_case("filename-hidden", "sources[0].filename", filename=f".{wheel_name(VERSION)}")
lock_case("filename-sdist", "sources[0].filename", filename="vllm-0.0.1.tar.gz")
lock_case("filename-other-project", "sources[0].filename",
          filename="torch-0.0.1-cp38-abi3-manylinux_2_28_x86_64.whl")
lock_case("filename-other-version", "sources[0].filename", filename=wheel_name("0.0.2"))
lock_case("filename-other-tags", "sources[0].filename",
          filename="vllm-0.0.1-cp311-cp311-win_amd64.whl")
lock_case("filename-nul", "sources[0].filename", filename=wheel_name(VERSION) + "\0")
lock_case("filename-newline", "sources[0].filename", filename=wheel_name(VERSION) + "\n")
lock_case("filename-int", "sources[0].filename", filename=7)
lock_case("sha256-short", "sources[0].sha256", sha256="abc123")
lock_case("sha256-upper", "sources[0].sha256", sha256="A" * 64)
lock_case("sha256-not-hex", "sources[0].sha256", sha256="g" * 64)
lock_case("sha256-long", "sources[0].sha256", sha256="a" * 65)
lock_case("sha256-int", "sources[0].sha256", sha256=12)
lock_case("sha256-glob", "sources[0].sha256", sha256="*")
lock_case("size-string", "sources[0].size", size="12")
lock_case("size-bool", "sources[0].size", size=True)
lock_case("size-zero", "sources[0].size", size=0)
lock_case("size-negative", "sources[0].size", size=-5)
lock_case("size-float", "sources[0].size", size=1.5)
lock_case("size-null", "sources[0].size", size=None)
lock_case("name-empty", "sources[0].name", name="")
lock_case("name-spaces", "sources[0].name", name=" vllm ")
lock_case("version-bad", "sources[0].version", version="not a version")
lock_case("tag-list", "sources[0].python_tag", python_tag=["cp38"])
lock_case("unknown-key", "sources[0].url", url="https://example.invalid/x.whl")
lock_case("missing-sha256", "sources[0].sha256", sha256=DELETE)
lock_case("missing-size", "sources[0].size", size=DELETE)
lock_case("stale-version", "vllm.version", version="0.0.2",
          filename=wheel_name("0.0.2"))
lock_case("stale-platform", "vllm.platform_tag", platform_tag="win_amd64",
          filename="vllm-0.0.1-cp38-abi3-win_amd64.whl")


def lock_top_case(id: str, value: object, *expect: str) -> None:
    def setup(env: Env) -> list[str]:
        env.lock_top(value)
        return build(env)

    CASES.append(Case(f"lock-{id}", setup, 2, (L, *expect)))


lock_top_case("a-list", [], "JSON object")
lock_top_case("a-string", "lock", "JSON object")
lock_top_case("null", None, "JSON object")
lock_top_case("format-2", {"format": 2, "sources": []}, "format")
lock_top_case("format-missing", {"sources": []}, "format")
lock_top_case("format-bool", {"format": True, "sources": []}, "format")
lock_top_case("unknown-top-key", {"format": 1, "sources": [], "extra": 1}, "extra")
lock_top_case("sources-object", {"format": 1, "sources": {}}, "sources")
lock_top_case("sources-missing", {"format": 1}, "sources")
lock_top_case("entry-a-string", {"format": 1, "sources": ["vllm"]}, "sources[0]")
lock_top_case("entry-null", {"format": 1, "sources": [None]}, "sources[0]")
lock_top_case("no-vllm", {"format": 1, "sources": []}, "no entry for 'vllm'")


@case("lock-twice", L, "sources[1].name", "twice")
def _(env: Env) -> list[str]:
    data = json.loads(env.lock.read_text())
    data["sources"].insert(1, dict(data["sources"][0]))
    env.lock_top(data)
    return build(env)


@case("lock-not-json", L, "not valid JSON")
def _(env: Env) -> list[str]:
    env.lock.write_text("{format: 1")
    return build(env)


@case("lock-not-utf8", L, "not valid JSON")
def _(env: Env) -> list[str]:
    env.lock.write_bytes(b"\xff\xfe{}")
    return build(env)


@case("lock-empty-file", L, "not valid JSON")
def _(env: Env) -> list[str]:
    env.lock.write_text("")
    return build(env)


@case("lock-missing", L, "no lock file")
def _(env: Env) -> list[str]:
    env.lock.unlink()
    return build(env)


@case("lock-a-folder", L, "cannot be read")
def _(env: Env) -> list[str]:
    env.lock.unlink()
    env.lock.mkdir()
    return build(env)


@case("lock-dangling-link", L, "no lock file")
def _(env: Env) -> list[str]:
    env.lock.unlink()
    env.lock.symlink_to(env.root / "gone.json")
    return build(env)


@case("lock-link-loop", L, "cannot be read")
def _(env: Env) -> list[str]:
    env.lock.unlink()
    env.lock.symlink_to(env.lock.with_name("other.json"))
    env.lock.with_name("other.json").symlink_to(env.lock)
    return build(env)


@case("lock-dir-a-file", L, "cannot be read")
def _(env: Env) -> list[str]:
    shutil.rmtree(env.root / "lock")
    (env.root / "lock").write_text("x\n")
    return build(env)


@case("lock-check-bad-size", L, "sources[0].size")
def _(env: Env) -> list[str]:
    env.lock_entry(size="big")
    return ["lock", "--check"]


@case("plan-bad-filename", L, "sources[0].filename")
def _(env: Env) -> list[str]:
    env.lock_entry(filename="/etc/passwd")
    return ["plan", "--json"]


@case("workspace-bad-filename", L, "sources[0].filename")
def _(env: Env) -> list[str]:
    env.lock_entry(filename="../../x.whl")
    return ["workspace", "create", str(env.tmp / "ws")]


# -- patch files and headers ----------------------------------------------------------------

P = "patches/route-fix.patch"
GOOD_HUNK = (
    "diff --git a/server.py b/server.py\n--- a/server.py\n+++ b/server.py\n"
    "@@ -1,2 +1,2 @@\n def route_0():\n-    return 0\n+    return 10\n"
)


def patch_case(id: str, body: str, *expect: str, name: str = "route-fix") -> None:
    def setup(env: Env) -> list[str]:
        env.patch(body, name)
        return build(env)

    CASES.append(Case(f"patch-{id}", setup, 2, (f"{name}.patch:", *expect)))


patch_case("symlink-new", "diff --git a/evil b/evil\nnew file mode 120000\nindex 0000000..1111111\n"
           "--- /dev/null\n+++ b/evil\n@@ -0,0 +1 @@\n+/etc/passwd\n\\ No newline at end of "
           "file\n", ":11:", "symbolic link")
patch_case("symlink-index-mode", "diff --git a/evil b/evil\nindex 0000000..1111111 120000\n"
           "--- a/evil\n+++ b/evil\n@@ -1 +1 @@\n-/x\n+/etc/shadow\n", ":11:", "symbolic link")
patch_case("symlink-deleted", "diff --git a/evil b/evil\ndeleted file mode 120000\n"
           "index 1111111..0000000\n--- a/evil\n+++ /dev/null\n@@ -1 +0,0 @@\n-/etc/passwd\n",
           ":11:", "symbolic link")
patch_case("gitlink", "diff --git a/sub b/sub\nnew file mode 160000\nindex 0000000..1111111\n"
           "--- /dev/null\n+++ b/sub\n@@ -0,0 +1 @@\n+Subproject commit " + "a" * 40 + "\n",
           ":11:", "gitlink")
patch_case("mode-change", "diff --git a/server.py b/server.py\nold mode 100644\nnew mode 100755\n",
           ":11:", "mode change")
patch_case("new-file-executable", "diff --git a/tool.sh b/tool.sh\nnew file mode 100755\n"
           "index 0000000..1111111\n--- /dev/null\n+++ b/tool.sh\n@@ -0,0 +1 @@\n+echo hi\n",
           ":11:", "new executable file", "100755")
patch_case("adds-record", "diff --git a/RECORD b/RECORD\nnew file mode 100644\n"
           "index 0000000..1111111\n--- /dev/null\n+++ b/RECORD\n@@ -0,0 +1 @@\n+x,,\n",
           ":14:", "'b/RECORD' is wheel metadata")
patch_case("adds-dist-info-file", "diff --git a/x.dist-info/METADATA b/x.dist-info/METADATA\n"
           "new file mode 100644\nindex 0000000..1111111\n--- /dev/null\n"
           "+++ b/x.dist-info/METADATA\n@@ -0,0 +1 @@\n+Name: x\n", ":14:", "wheel metadata")
patch_case("mode-change-with-hunk", "diff --git a/server.py b/server.py\nold mode 100644\n"
           "new mode 100755\n" + GOOD_HUNK.split("\n", 1)[1], ":11:", "mode change")
patch_case("mode-setuid", "diff --git a/x.py b/x.py\nnew file mode 104755\nindex 0000000..1111111\n"
           "--- /dev/null\n+++ b/x.py\n@@ -0,0 +1 @@\n+x = 1\n", ":11:", "mode 104755")
patch_case("mode-world-writable", "diff --git a/x.py b/x.py\nnew file mode 100666\n"
           "index 0000000..1111111\n--- /dev/null\n+++ b/x.py\n@@ -0,0 +1 @@\n+x = 1\n",
           ":11:", "mode 100666")
patch_case("git-binary", "diff --git a/k.so b/k.so\nnew file mode 100644\nindex 0000000..1111111\n"
           "GIT binary patch\nliteral 3\nKcmZ?wx\n\nliteral 0\nHcmV?d00001\n\n", ":10:", "binary")
patch_case("binary-files-differ", "diff --git a/k.so b/k.so\nindex 1111111..2222222 100644\n"
           "Binary files a/k.so and b/k.so differ\n", ":10:", "binary")
patch_case("binary-files-bare", "Binary files a/k.so and b/k.so differ\n", ":10:", "binary")
patch_case("path-dotdot", "diff --git a/../../x b/../../x\n--- a/../../x\n+++ b/../../x\n"
           "@@ -1 +1 @@\n-a\n+b\n", "leaves the vllm/ package")
patch_case("path-absolute", "--- /etc/passwd\n+++ /etc/passwd\n@@ -1 +1 @@\n-a\n+b\n",
           "no a/ or b/ prefix")
patch_case("path-backslash", "--- a/..\\..\\x\n+++ b/..\\..\\x\n@@ -1 +1 @@\n-a\n+b\n",
           "leaves the vllm/ package")
patch_case("path-empty", "--- a/\n+++ b/\n@@ -1 +1 @@\n-a\n+b\n", "leaves the vllm/ package")
patch_case("rename-out", "diff --git a/server.py b/server.py\nsimilarity index 100%\n"
           "rename from server.py\nrename to ../../../sentinel/server.py\n",
           ":13:", "leaves the vllm/ package")
patch_case("copy-out", "diff --git a/server.py b/x.py\nsimilarity index 100%\n"
           "copy from /etc/passwd\ncopy to x.py\n", ":12:", "leaves the vllm/ package")
patch_case("hunk-garbage", "--- a/server.py\n+++ b/server.py\n@@ garbage @@\n-a\n+b\n", ":12:")
patch_case("hunk-counts", "--- a/server.py\n+++ b/server.py\n@@ -1,5 +1,5 @@\n-a\n+b\n", ":12:")
patch_case("minus-without-plus", "--- a/server.py\n@@ -1 +1 @@\n-a\n+b\n", "'+++'")
patch_case("in-kvarn-group", "diff --git a/evil b/evil\nnew file mode 120000\n"
           "index 0000000..1111111\n--- /dev/null\n+++ b/evil\n@@ -0,0 +1 @@\n+/etc/passwd\n",
           "symbolic link", name="kv")


@case("patch-nul-byte", P, ":3:", "NUL")
def _(env: Env) -> list[str]:
    path = env.root / "patches" / "route-fix.patch"
    data = path.read_bytes().split(b"\n")
    data[2] = data[2] + b"\0"
    path.write_bytes(b"\n".join(data))
    return build(env)


@case("patch-not-utf8", P, "cannot read the patch file")
def _(env: Env) -> list[str]:
    path = env.root / "patches" / "route-fix.patch"
    path.write_bytes(b"\xff\xfe" + path.read_bytes())
    return build(env)


@case("patch-header-twice", P, ":")
def _(env: Env) -> list[str]:
    env.edit("Kind: fix\n", "Kind: fix\nKind: own\n", env.root / "patches" / "route-fix.patch")
    return build(env)


@case("lint-symlink-patch-exit-2", P, "symbolic link")
def _(env: Env) -> list[str]:
    env.patch("diff --git a/evil b/evil\nnew file mode 120000\nindex 0000000..1111111\n"
              "--- /dev/null\n+++ b/evil\n@@ -0,0 +1 @@\n+/etc/passwd\n")
    return build(env)


@case("workspace-symlink-patch", P, "symbolic link")
def _(env: Env) -> list[str]:
    env.patch("diff --git a/evil b/evil\nnew file mode 120000\nindex 0000000..1111111\n"
              "--- /dev/null\n+++ b/evil\n@@ -0,0 +1 @@\n+/etc/passwd\n")
    return ["workspace", "create", str(env.tmp / "ws")]


# -- the pinned wheel ------------------------------------------------------------------------

W = wheel_name(VERSION)


def zip_of(path: Path, members: dict[str, bytes], modes: dict[str, int] | None = None) -> Path:
    """A zip with exactly these members (names as given, even hostile ones)."""
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = (modes or {}).get(name, 0o100644) << 16
            z.writestr(info, data)
    return path


def good_members() -> dict[str, bytes]:
    di = f"vllm-{VERSION}.dist-info"
    members = {k: v.encode() for k, v in FILES.items()}
    members[f"{di}/METADATA"] = f"Name: vllm\nVersion: {VERSION}\n\n".encode()
    members[f"{di}/RECORD"] = b"".join(f"{n},,\n".encode() for n in members)
    return members


def wheel_case(id: str, extra: dict[str, bytes], *expect: str,
               modes: dict[str, int] | None = None, drop: tuple[str, ...] = ()) -> None:
    def setup(env: Env) -> list[str]:
        members = {k: v for k, v in good_members().items() if k not in drop}
        members.update(extra)
        env.pin_wheel(zip_of(env.tmp / "bad.whl", members, modes))
        return build(env)

    CASES.append(Case(f"wheel-{id}", setup, 2, (W, *expect)))


wheel_case("zip-slip", {"vllm/../../../x": b"owned"}, "'vllm/../../../x'", "outside")
wheel_case("zip-slip-sentinel", {"vllm/../../sentinel/x": b"owned"}, "outside")
wheel_case("absolute-member", {"/tmp/q38-x": b"owned"}, "outside")
wheel_case("backslash-member", {"vllm\\..\\..\\x": b"owned"}, "outside")
wheel_case("drive-member", {"C:/x": b"owned"}, "outside")
wheel_case("control-char-member", {"vllm/x\ny": b"owned"}, "outside")
wheel_case("symlink-member", {"vllm/evil": b"/etc/passwd"}, "'vllm/evil'",
           "not a regular file", modes={"vllm/evil": 0o120777})
wheel_case("device-member", {"vllm/dev": b""}, "not a regular file",
           modes={"vllm/dev": 0o020644})
wheel_case("dot-duplicate", {"vllm/./server.py": b"twice"}, "one file")
wheel_case("missing-record", {}, "RECORD", drop=(f"vllm-{VERSION}.dist-info/RECORD",))
wheel_case("bad-record-size", {f"vllm-{VERSION}.dist-info/RECORD": b"a,sha256=x,big\n"},
           "RECORD", "not a valid RECORD")
wheel_case("record-not-utf8", {f"vllm-{VERSION}.dist-info/RECORD": b"\xff\xfe\n"},
           "not a valid RECORD")
wheel_case("two-records", {"other-1.dist-info/RECORD": b""}, "RECORD members, not one")


@case("wheel-not-a-zip", W, "not a wheel")
def _(env: Env) -> list[str]:
    bad = env.tmp / "bad.whl"
    bad.write_bytes(b"this is not a zip file at all\n" * 10)
    env.pin_wheel(bad)
    return build(env)


@case("wheel-truncated", W, "not a wheel")
def _(env: Env) -> list[str]:
    good = zip_of(env.tmp / "good.whl", good_members())
    bad = env.tmp / "bad.whl"
    bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    env.pin_wheel(bad)
    return build(env)


@case("lock-size-wrong-entry-in-store", L, "size 12345", "bytes")
def _(env: Env) -> list[str]:
    env.lock_entry(size=12345)  # the store already holds the wheel of that sha256
    return build(env)


@case("wheel-empty-file", L, "sources[0].size")
def _(env: Env) -> list[str]:
    bad = env.tmp / "bad.whl"
    bad.write_bytes(b"")
    env.pin_wheel(bad)
    return build(env)


@case("wheel-zip-slip-workspace", W, "outside")
def _(env: Env) -> list[str]:
    members = good_members()
    members["vllm/../../../x.py"] = b"owned"
    env.pin_wheel(zip_of(env.tmp / "bad.whl", members))
    return ["workspace", "create", str(env.tmp / "ws")]


@case("wheel-symlink-workspace", W, "not a regular file")
def _(env: Env) -> list[str]:
    members = good_members()
    members["vllm/link.py"] = b"/etc/passwd"
    env.pin_wheel(zip_of(env.tmp / "bad.whl", members, {"vllm/link.py": 0o120777}))
    return ["workspace", "create", str(env.tmp / "ws")]


# -- store entries -----------------------------------------------------------------------------


def _record(env: Env) -> Path:
    return env.store / "builds" / f"{env.build}.json"


def _writable(path: Path) -> None:
    path.chmod(path.stat().st_mode | stat.S_IWUSR)


@case("store-record-not-json", "builds/", "unreadable build record", code=1)
def _(env: Env) -> list[str]:
    _writable(_record(env))
    _record(env).write_text("{")
    return ["reproduce", env.build]


@case("store-record-a-list", "builds/", "unreadable build record", code=1)
def _(env: Env) -> list[str]:
    _record(env).write_text("[]")
    return ["verify", str(env.tmp), "--build", env.build[:12]]


@case("store-record-a-folder", "builds/", "unreadable build record", code=1)
def _(env: Env) -> list[str]:
    _record(env).unlink()
    _record(env).mkdir()
    return ["reproduce", env.build[:10]]


@case("store-record-other-hash", "builds/", "unreadable build record", code=1)
def _(env: Env) -> list[str]:
    data = json.loads(_record(env).read_text())
    data["build"] = "0" * 64
    _record(env).write_text(json.dumps(data))
    return ["verify", str(env.tmp), "--build", env.build]


@case("store-record-no-patch-step", "builds/", "no valid patch and wheel steps", code=1)
def _(env: Env) -> list[str]:
    data = json.loads(_record(env).read_text())
    data["steps"] = [{"derivation": {"kind": "patch"}, "digest": "../../../etc"}]
    _record(env).write_text(json.dumps(data))
    return ["apply", str(env.tmp / "site"), "--build", env.build]


def _manifest(env: Env) -> Path:
    path = env.store / "objects" / env.build / "manifest.json"
    _writable(path.parent)
    _writable(path)
    return path


@case("store-manifest-not-json", "manifest.json", "changed after it was written", code=1)
def _(env: Env) -> list[str]:
    _manifest(env).write_text("nope")
    return ["verify", str(env.tmp), "--build", env.build]


@case("store-manifest-no-owned", "manifest.json", "changed after it was written", code=1)
def _(env: Env) -> list[str]:
    _manifest(env).write_text(json.dumps({"record": {}}))
    return ["verify", str(env.tmp), "--build", env.build]


# An edited manifest is caught by its recorded sha256 before its paths are read.
@case("store-manifest-path-out", "manifest.json", "changed after it was written", code=1)
def _(env: Env) -> list[str]:
    path = _manifest(env)
    data = json.loads(path.read_text())
    data["owned"]["../../sentinel/pwned"] = {"patched": "0" * 64, "pristine": None,
                                            "owners": ["route-fix"]}
    path.write_text(json.dumps(data))
    return ["apply", str(env.tmp / "site"), "--build", env.build]


@case("result-link-not-a-hash", "'not-a-hash'", "not a build hash")
def _(env: Env) -> list[str]:
    (env.root / "result").symlink_to(env.store / "objects" / "not-a-hash")
    return ["verify", str(env.tmp)]


# -- vendored trees: read one safe way wherever they are packed ---------------------------------


def _pthfa(env: Env) -> Path:
    add_pthfa_sources(env.root)
    return env.root / "pthfa"


@case("pthfa-package-link-to-host-file", "env.txt", "symbolic link")
def _(env: Env) -> list[str]:
    (_pthfa(env) / "python" / "pthfa" / "env.txt").symlink_to("/etc/passwd")
    return ["kernels", "--arch", "8.6", "-q"]


@case("pthfa-package-link-in-build", "environ.txt", "symbolic link")
def _(env: Env) -> list[str]:
    (_pthfa(env) / "python" / "pthfa" / "environ.txt").symlink_to("/proc/self/environ")
    return ["build", "-q", "--no-link", "--only", "pthfa"]


@case("pthfa-csrc-header-link", "host.cuh", "symbolic link")
def _(env: Env) -> list[str]:
    (_pthfa(env) / "csrc" / "host.cuh").symlink_to("/etc/hostname")
    return ["kernels", "--arch", "8.6", "-q"]


@case("pthfa-package-unlisted-file", "extra.py", "not listed in pthfa/MANIFEST")
def _(env: Env) -> list[str]:
    (_pthfa(env) / "python" / "pthfa" / "extra.py").write_text("SECRET = 1\n")
    return ["kernels", "--arch", "8.6", "-q"]


@case("pthfa-source-edited-after-manifest", "tiny.cu", "differ from pthfa/MANIFEST")
def _(env: Env) -> list[str]:
    (_pthfa(env) / "csrc" / "tiny.cu").write_text("// edited\n")
    return ["kernels", "--arch", "8.6", "-q"]


@case("kernels-out-a-file", "--out", "a file stands there")
def _(env: Env) -> list[str]:
    _pthfa(env)
    (env.tmp / "out-file").write_text("x\n")
    return ["kernels", "--arch", "8.6", "-q", "--out", str(env.tmp / "out-file")]


@case("kernels-system-nvcc-not-on-path", "--system-nvcc", "no nvcc is on PATH")
def _(env: Env) -> list[str]:
    _pthfa(env)
    empty = env.tmp / "empty-bin"
    empty.mkdir()
    os.environ["PATH"] = str(empty)  # the harness puts the environment back
    return ["kernels", "--system-nvcc", "--arch", "8.6", "-q"]


@case("build-system-nvcc-not-on-path", "QWEN38BUILD_NVCC=system", "no nvcc is on PATH")
def _(env: Env) -> list[str]:
    _pthfa(env)
    os.environ["PATH"] = str(env.tmp)  # no nvcc there
    os.environ["QWEN38BUILD_NVCC"] = "system"
    return ["build", "-q", "--no-link", "--only", "pthfa"]


@case("pthfa-package-fifo", "pipe.txt", "not a regular file")
def _(env: Env) -> list[str]:
    os.mkfifo(_pthfa(env) / "python" / "pthfa" / "pipe.txt")
    return ["kernels", "--arch", "8.6", "-q"]


# -- command-line arguments ---------------------------------------------------------------------


def args_case(id: str, argv: list[str], *expect: str, code: int = 2) -> None:
    CASES.append(Case(f"args-{id}", lambda env: list(argv), code, expect))


args_case("no-command", [], "command line:", "required")
args_case("unknown-command", ["frobnicate"], "command line:", "invalid choice")
args_case("unknown-flag", ["build", "--fast"], "command line:", "--fast")
args_case("kernels-arch-banana", ["kernels", "--arch", "banana"], "--arch 'banana'", "8.6, 9.0")
args_case("kernels-arch-9", ["kernels", "--arch", "9"], "--arch '9'", "cuda.archs")
args_case("kernels-arch-not-in-recipe", ["kernels", "--arch", "7.5"], "--arch '7.5'",
          "8.6, 9.0")
args_case("kernels-arch-sm75", ["kernels", "--arch", "sm_75"], "--arch 'sm_75'")
args_case("kernels-arch-empty", ["kernels", "--arch", ""], "--arch ''")
args_case("kernels-arch-shell", ["kernels", "--arch", "9.0;rm -rf /"], "--arch '9.0;rm -rf /'")
args_case("kernels-jobs-zero", ["kernels", "-j", "0"], "--jobs 0")
args_case("kernels-jobs-text", ["kernels", "-j", "many"], "command line:", "'many'")
args_case("reproduce-stars", ["reproduce", "******"], "'******'", "not a build hash")
args_case("reproduce-glob", ["reproduce", "8f64f?"], "'8f64f?'", "not a build hash")
args_case("reproduce-glob-long", ["reproduce", "8f64f2a1*"], "'8f64f2a1*'", "not a build hash")
args_case("reproduce-path", ["reproduce", "../x"], "'../x'", "not a build hash")
args_case("reproduce-abs-path", ["reproduce", "/etc/passwd"], "'/etc/passwd'")
args_case("reproduce-short", ["reproduce", "abc"], "'abc'", "8 to 64")
args_case("reproduce-upper", ["reproduce", "ABCDEF12"], "'ABCDEF12'")
args_case("reproduce-empty", ["reproduce", ""], "''", "not a build hash")
args_case("reproduce-too-long", ["reproduce", "a" * 65], "not a build hash")
args_case("reproduce-unknown", ["reproduce", "deadbeef"], "'deadbeef'", "no build")
args_case("verify-build-glob", ["verify", ".", "--build", "*"], "'*'", "not a build hash")
args_case("apply-build-path", ["apply", ".", "--build", "../../x"], "'../../x'")
args_case("bump-other-package", ["bump", "torch", "9.9"], "'torch'")
args_case("show-unknown-step", ["show", "nothing"], "step 'nothing'", "not in the plan")
args_case("why-unknown-step", ["why", "nothing"], "step 'nothing'")


@case("args-store-empty", "--store is empty")
def _(env: Env) -> list[str]:
    return ["--recipe", str(env.recipe), "--store", "", "build"]


@case("args-store-empty-plan", "--store is empty")
def _(env: Env) -> list[str]:
    return ["--recipe", str(env.recipe), "--store", "", "plan"]


@case("args-recipe-empty", "--recipe is empty")
def _(env: Env) -> list[str]:
    return ["--recipe", "", "--store", str(env.store), "build"]


@case("args-export-missing-folder", "does not exist")
def _(env: Env) -> list[str]:
    return ["export", str(env.tmp / "no-such-workspace")]


@case("args-export-not-a-workspace", "not a git workspace")
def _(env: Env) -> list[str]:
    (env.tmp / "plain").mkdir()
    return ["export", str(env.tmp / "plain")]


@case("args-verify-missing-path", "holds no vllm/ package")
def _(env: Env) -> list[str]:
    return ["verify", str(env.tmp / "nowhere"), "--build", env.build]


@case("args-verify-a-file", "holds no vllm/ package")
def _(env: Env) -> list[str]:
    (env.tmp / "file").write_text("x\n")
    return ["verify", str(env.tmp / "file"), "--build", env.build]


@case("args-apply-no-vllm", "expected one vllm-*.dist-info")
def _(env: Env) -> list[str]:
    (env.tmp / "empty-site").mkdir()
    return ["apply", str(env.tmp / "empty-site"), "--build", env.build]


@case("args-workspace-not-empty", "not empty")
def _(env: Env) -> list[str]:
    (env.tmp / "ws").mkdir()
    (env.tmp / "ws" / "x").write_text("x\n")
    return ["workspace", "create", str(env.tmp / "ws")]


# -- file-system conditions ---------------------------------------------------------------------


@case("fs-store-a-file", "store-file", "a file stands there")
def _(env: Env) -> list[str]:
    bogus = env.tmp / "store-file"
    bogus.write_text("not a store\n")
    env.store = bogus
    return ["--recipe", str(env.recipe), "--store", str(bogus), "build", "-q", "--no-link"]


@case("fs-store-under-a-file", "store-file", "a file stands there")
def _(env: Env) -> list[str]:
    bogus = env.tmp / "store-file"
    bogus.write_text("not a store\n")
    env.store = bogus
    return ["--recipe", str(env.recipe), "--store", str(bogus / "s"), "build", "-q",
            "--no-link"]


@case("fs-patches-link-loop", R, "series.groups.0.dir:")
def _(env: Env) -> list[str]:
    shutil.rmtree(env.root / "patches")
    (env.root / "patches").symlink_to(env.root / "patches")
    return build(env)


@case("fs-verify-tree-link-loop", "site/vllm/loop", "Too many levels of symbolic links")
def _(env: Env) -> list[str]:
    loop = env.tmp / "site" / "vllm" / "loop"
    loop.symlink_to(loop)
    return ["verify", str(env.tmp / "site"), "--build", env.build]


@case("fs-verify-tree-unreadable-dir-link", "site/vllm/sub", "Too many levels")
def _(env: Env) -> list[str]:
    sub = env.tmp / "site" / "vllm" / "sub"
    sub.symlink_to(sub / "deeper")
    return ["verify", str(env.tmp / "site"), "--build", env.build, "--full"]


@case("fs-recipe-folder-a-file", "cannot read")
def _(env: Env) -> list[str]:
    return ["--recipe", str(env.recipe / "recipe.toml"), "build"]


# -- machine settings: the cache configuration and the environment --------------------------------


def _config(env: Env, text: str) -> None:
    path = env.tmp / "config.toml"
    path.write_text(text)
    os.environ["QWEN38BUILD_CONFIG"] = str(path)  # the harness puts the environment back


@case("cache-config-timeout-true", "config.toml:cache.timeout", "True")
def _(env: Env) -> list[str]:
    _config(env, "[cache]\ntimeout = true\n")  # float(True) would be 1 s
    return ["build", "--rebuild", "-q", "--no-link"]


@case("cache-substituter-port-99999", "--substituter", "99999", "a port from 1 to 65535")
def _(env: Env) -> list[str]:
    return ["--substituter", "http://127.0.0.1:99999/q38", "build", "--rebuild", "-q",
            "--no-link"]


@case("cache-config-substituter-port-99999", "cache.substituters", "99999")
def _(env: Env) -> list[str]:
    _config(env, '[cache]\nsubstituters = ["https://cache.example.org:99999/q38"]\n')
    return ["build", "--rebuild", "-q", "--no-link"]


@case("env-offline-banana", "$QWEN38BUILD_OFFLINE", "'banana'", "neither yes nor no")
def _(env: Env) -> list[str]:
    os.environ["QWEN38BUILD_OFFLINE"] = "banana"  # never read as "online"
    return ["build", "-q", "--no-link"]  # the no-op included


def _key_pair(env: Env) -> tuple[Path, Path]:
    from qwen38build.cache.signing import SecretKey, write_key_pair

    sec, pub = env.tmp / "q38-test-1.sec", env.tmp / "q38-test-1.pub"
    write_key_pair(SecretKey.generate("q38-test-1"), sec, pub)
    return sec, pub


@case("push-key-a-public-key", "q38-test-1.pub", "a public key file")
def _(env: Env) -> list[str]:
    _, pub = _key_pair(env)  # NAME:BASE64 of 32 bytes, like the secret: signed nothing usable
    return ["push", "http://127.0.0.1:9/q38", "--key", str(pub)]


@case("push-key-world-readable", "q38-test-1.sec", "readable by others", "mode 644")
def _(env: Env) -> list[str]:
    sec, _ = _key_pair(env)
    sec.chmod(0o644)
    return ["push", "http://127.0.0.1:9/q38", "--key", str(sec)]


# -- inputs stay inside the project, links resolved ---------------------------------------------


def _other_checkout(env: Env) -> Path:
    other = env.tmp / "other-checkout"
    shutil.copytree(env.root, other, symlinks=True)
    return other


@case("recipe-a-link-to-another-checkout", "recipe.toml", "outside the folder it is named in")
def _(env: Env) -> list[str]:
    other = _other_checkout(env)
    env.recipe.unlink()
    env.recipe.symlink_to(other / "recipe.toml")
    return ["build", "-q", "--no-link"]


@case("lock-a-link-to-another-checkout", "lock:", "leads outside the project")
def _(env: Env) -> list[str]:
    other = _other_checkout(env)
    shutil.rmtree(env.root / "lock")
    (env.root / "lock").symlink_to(other / "lock")
    return ["build", "-q", "--no-link"]


@case("lock-sources-a-link-out", "lock/sources.json", "leads outside the project")
def _(env: Env) -> list[str]:
    other = _other_checkout(env)
    env.lock.unlink()
    env.lock.symlink_to(other / "lock" / "sources.json")
    return ["build", "-q", "--no-link"]


# -- the harness ---------------------------------------------------------------------------------


def snapshot(top: Path) -> dict[str, str]:
    """Every entry below ``top``: kind, mode and content (links by target), by path."""
    out: dict[str, str] = {}
    if not top.exists() and not top.is_symlink():
        return out
    if not top.is_dir() or top.is_symlink():
        st = top.lstat()
        return {".": f"{st.st_mode:o}:{_content(top)}"}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            rel = p.relative_to(top).as_posix()
            st = p.lstat()
            if rel.startswith("locks/") and stat.S_ISREG(st.st_mode) and st.st_size == 0:
                continue  # the store branch's: a failed step's empty file lock
            out[rel] = f"{st.st_mode:o}:{_content(p)}"
    return out


def _content(p: Path) -> str:
    if p.is_symlink():
        return "->" + os.readlink(p)
    if p.is_file():
        return hashlib.sha256(p.read_bytes()).hexdigest()
    return ""


@dataclass(frozen=True)
class Template:
    root: Path
    store: Path
    wheels: Path
    build: str


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Template:
    """One good project and a store that holds its build (copied for every case)."""
    base = tmp_path_factory.mktemp("template")
    wheels = base / "wheels"
    wheel = make_wheel(wheels)
    root = make_project(base / "proj", wheel, ["route-fix", "knob"])
    # The vLLM entry first, so each lock case's place reads sources[0] (the lock's order is
    # free: entries are found by name).
    lock_file = root / "lock" / "sources.json"
    data = json.loads(lock_file.read_text())
    data["sources"].sort(key=lambda e: e["name"] != "vllm")
    lock_file.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    write_patch(root, "patches", "route-fix", [("server.py", SERVER,
                SERVER.replace("return 3\n", "return 33\n"))], base / "diffs")
    write_patch(root, "patches", "knob", [("envs.py", ENVS,
                ENVS.replace("KNOB_7 = 7\n", "KNOB_7 = 70\n"))], base / "diffs")
    store = base / "store"
    from qwen38build.cli import main

    old = os.environ.get("QWEN38BUILD_SOURCES")
    os.environ["QWEN38BUILD_SOURCES"] = str(wheels)
    try:
        assert main(["--recipe", str(root / "recipe.toml"), "--store", str(store), "build",
                     "-q", "--no-link"]) == 0
    finally:
        if old is None:
            os.environ.pop("QWEN38BUILD_SOURCES", None)
        else:
            os.environ["QWEN38BUILD_SOURCES"] = old
    build = next((store / "builds").glob("*.json")).stem
    return Template(root, store, wheels, build)


def make_env(template: Template, tmp: Path) -> Env:
    root = tmp / "proj"
    shutil.copytree(template.root, root, symlinks=True)
    store = tmp / "store"
    shutil.copytree(template.store, store, symlinks=True)
    sentinel = tmp / "sentinel"
    sentinel.mkdir()
    (sentinel / "secret").write_text("do not touch\n")
    site = tmp / "site"
    (site / "vllm").mkdir(parents=True)
    (site / f"vllm-{VERSION}.dist-info").mkdir()
    (site / f"vllm-{VERSION}.dist-info" / "METADATA").write_text(f"Version: {VERSION}\n")
    (site / f"vllm-{VERSION}.dist-info" / "RECORD").write_text("")
    return Env(root, store, sentinel, template.wheels, tmp, template.build)


def test_the_corpus_is_large_and_distinct() -> None:
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))
    assert len(ids) >= 150, len(ids)


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_in_one_line_touching_nothing(
    c: Case, template: Template, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("QWEN38BUILD_SOURCES", str(template.wheels))
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # a bad lock must never reach pip anyway
    env = make_env(template, tmp_path)
    monkeypatch.chdir(env.root)
    saved = dict(os.environ)  # a case may set a variable for its run alone
    try:
        argv = c.setup(env)
        if not argv or argv[0] != "--recipe":
            argv = ["--recipe", str(env.recipe), "--store", str(env.store), *argv]
        before = (snapshot(env.store), snapshot(env.root), snapshot(env.sentinel))
        capsys.readouterr()
        from qwen38build.cli import main

        code = main(argv)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    _, err = capsys.readouterr()
    assert (code, err.count("\n")) == (c.code, 1), err
    assert "Traceback" not in err
    if "--json" in argv:  # the error as one JSON object instead
        err = json.loads(err)["message"]
    else:
        assert err.startswith("error: "), err
    for needle in c.expect:
        assert needle in err, (needle, err)
    assert (snapshot(env.store), snapshot(env.root), snapshot(env.sentinel)) == before
    assert not Path("/tmp/q38-x").exists()


FRESH = ["recipe-group-dir-dotdot", "recipe-entry-missing", "lock-filename-absolute",
         "lock-size-string", "patch-symlink-new", "patch-mode-change", "workspace-symlink-patch",
         "args-kernels-arch-banana", "args-reproduce-glob", "wheel-zip-slip"]


@pytest.mark.parametrize("c", [c for c in CASES if c.id in FRESH], ids=FRESH)
def test_bad_input_creates_no_store(
    c: Case, template: Template, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """With no store yet, bad input leaves none behind (no locks/, no tmp/), and makes no
    workspace folder either."""
    monkeypatch.setenv("QWEN38BUILD_SOURCES", str(template.wheels))
    env = make_env(template, tmp_path)
    env.store = tmp_path / "fresh-store"
    argv = c.setup(env)
    from qwen38build.cli import main

    code = main(["--recipe", str(env.recipe), "--store", str(env.store), *argv])
    if c.id == "wheel-zip-slip":  # the wheel is read only once fetched: no entry, no tmp
        assert code == 2
        assert not any((env.store / "objects").glob("*.json"))
        assert not any((env.store / "tmp").iterdir())
    else:
        assert (code, env.store.exists()) == (c.code, False)
    assert not (tmp_path / "ws").exists()
    assert capsys.readouterr().err.count("\n") == 1


# -- through a real process: no traceback, and the pipe ---------------------------------------


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PIP_NO_INDEX": "1"}
    return subprocess.run([sys.executable, "-m", "qwen38build", *argv], capture_output=True,
                          text=True, env=env, check=False, cwd=REPO)


@pytest.mark.parametrize("argv", [
    ["reproduce", "******"],
    ["kernels", "--arch", "banana"],
    ["--store", "", "build"],
    ["frobnicate"],
    ["export", "/nonexistent/q38-workspace"],
], ids=["glob-hash", "arch", "empty-store", "unknown-command", "export-missing"])
def test_a_real_process_prints_one_line_and_no_traceback(argv: list[str],
                                                         tmp_path: Path) -> None:
    proc = _cli("--store", str(tmp_path / "store"), *argv) if argv[0] != "--store" \
        else _cli(*argv)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: "), proc.stderr
    assert not (tmp_path / "store").exists()


def test_a_bad_lock_through_a_real_process(template: Template, tmp_path: Path) -> None:
    env = make_env(template, tmp_path)
    env.lock_entry(filename="/etc/passwd")
    proc = _cli("--recipe", str(env.recipe), "--store", str(env.store), "build")
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: {env.lock}:sources[0].filename: '/etc/passwd'")
    assert proc.stderr.count("\n") == 1


def test_a_closed_pipe_exits_quietly(template: Template, tmp_path: Path) -> None:
    env = make_env(template, tmp_path)
    with subprocess.Popen(
        [sys.executable, "-m", "qwen38build", "--recipe", str(env.recipe), "--store",
         str(env.store), "plan", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # the reader leaves before a byte is written (as `| head -0`)
        err = proc.stderr.read().decode()
        assert proc.wait() == 141
    assert err == ""


# -- a read-only store and a full disk, where the machine allows mounts ------------------------

_NS_SCRIPT = r"""
import io, json, os, subprocess, sys
spec = json.loads(sys.argv[1])
for cmd in spec["mounts"]:
    subprocess.run(cmd, check=True)
for cmd in spec.get("after", []):
    subprocess.run(cmd, check=False, stderr=subprocess.DEVNULL)
sys.path.insert(0, spec["tests"])
from test_bad_inputs import snapshot
from pathlib import Path
before = snapshot(Path(spec["store"]))
err = io.StringIO()
sys.stderr = err
from qwen38build.cli import main
code = main(spec["argv"])
sys.stderr = sys.__stderr__
after = snapshot(Path(spec["store"]))
print(json.dumps({"code": code, "err": err.getvalue(), "same": after == before,
                  "after": after, "planned": "qwen38build.engine.plan" in sys.modules}))
"""


def _in_namespace(spec: dict[str, object]) -> dict[str, object]:
    if shutil.which("unshare") is None:
        pytest.skip("no unshare here: cannot mount a read-only or a full file system")
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"unshare -rm is not allowed here: {probe.stderr.decode().strip()}")
    spec["tests"] = str(Path(__file__).parent)
    proc = subprocess.run(
        ["unshare", "-rm", sys.executable, "-c", _NS_SCRIPT, json.dumps(spec)],
        capture_output=True, text=True, check=False, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_a_read_only_store_is_one_line(template: Template, tmp_path: Path) -> None:
    env = make_env(template, tmp_path)
    env.edit("return 33", "return 34", env.root / "patches" / "route-fix.patch")  # new work
    store = str(env.store)
    os.environ["QWEN38BUILD_SOURCES"] = str(template.wheels)
    result = _in_namespace({
        "mounts": [["mount", "--bind", store, store],
                   ["mount", "-o", "remount,bind,ro", store]],
        "store": store,
        "argv": ["--recipe", str(env.recipe), "--store", store, "build", "-q", "--no-link",
                 "--rebuild"],
    })
    err = str(result["err"])
    assert result["code"] == 1 and err.count("\n") == 1, err
    assert "Read-only file system" in err and store in err, err
    assert result["same"]


def test_a_full_disk_is_one_line(template: Template, tmp_path: Path) -> None:
    env = make_env(template, tmp_path)
    store = tmp_path / "small"
    store.mkdir()
    os.environ["QWEN38BUILD_SOURCES"] = str(template.wheels)
    result = _in_namespace({
        "mounts": [["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(store)]],
        "after": [["dd", "if=/dev/zero", f"of={store}/fill", "bs=4k", "count=64"]],
        "store": str(store),
        "argv": ["--recipe", str(env.recipe), "--store", str(store), "build", "-q",
                 "--no-link"],
    })
    err = str(result["err"])
    assert result["code"] == 1 and err.count("\n") == 1, err
    assert "No space left on device" in err and str(store) in err, err
    after = result["after"]
    assert isinstance(after, dict)
    # Nothing half-written: besides the filler, only empty folders (and file locks) remain.
    assert {k for k, v in after.items() if v.split(":", 1)[1]} - {"gc.lock"} == {"fill"}, after


@pytest.mark.parametrize("body,finding", [
    ("diff --git a/evil b/evil\nnew file mode 120000\nindex 0000000..1111111\n--- /dev/null\n"
     "+++ b/evil\n@@ -0,0 +1 @@\n+/etc/passwd\n", ":11: [diff-hygiene] a symbolic link"),
    ("diff --git a/server.py b/server.py\nold mode 100644\nnew mode 100755\n",
     ":11: [diff-hygiene] a mode change"),
    ("diff --git a/k.so b/k.so\nindex 1111111..2222222 100644\n"
     "Binary files a/k.so and b/k.so differ\n", ":10: [diff-hygiene] k.so is a binary diff"),
], ids=["symlink", "mode-change", "binary"])
def test_lint_reports_unsafe_patch_files_as_findings(
    body: str, finding: str, template: Template, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """The build refuses these (exit 2); the lint names each as a finding with its line."""
    monkeypatch.setenv("QWEN38BUILD_SOURCES", str(template.wheels))
    env = make_env(template, tmp_path)
    env.patch(body)
    from qwen38build.cli import main

    assert main(["--recipe", str(env.recipe), "--store", str(env.store), "lint"]) == 2
    out = capsys.readouterr().out
    assert f"patches/route-fix.patch{finding}" in out, out


def test_the_fast_path_is_inside_the_boundary(template: Template, tmp_path: Path) -> None:
    """A no-op answered by the fast path that cannot write ./result (a read-only project)
    fails in one line too, and it was the fast path that answered (nothing was planned)."""
    env = make_env(template, tmp_path)
    os.environ["QWEN38BUILD_SOURCES"] = str(template.wheels)
    from qwen38build.cli import main

    argv = ["--recipe", str(env.recipe), "--store", str(env.store), "build", "-q"]
    assert main(argv) == 0  # leaves the fast path's record for this project
    root = str(env.root)
    result = _in_namespace({
        "mounts": [["mount", "--bind", root, root], ["mount", "-o", "remount,bind,ro", root]],
        "store": str(env.store),
        "argv": argv,
    })
    err = str(result["err"])
    assert result["code"] == 1 and err.count("\n") == 1, err
    assert "Read-only file system" in err and root in err, err
    assert result["same"] and result["planned"] is False
