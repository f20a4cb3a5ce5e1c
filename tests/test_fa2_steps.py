"""FA2 in the build: pinned trees → the diff at fuzz 0 → a library per arch built by the
project's own fa2/build.py with the locked nvcc → the fa2fp8 wheel; and the fa2-upstream
rule. The trees come from a mirror folder, the nvcc is the fixtures' stand-in."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from qwen38build.inputs import lock as lockmod
from qwen38build.inputs.recipe import load
from qwen38build.pinning.sources import pin_trees
from tests.conftest import Project
from tests.test_source_trees import archive, git

KERNEL = "// split-KV decode\ntemplate <typename T> void load_k(const T* k);\n"
PATCHED = KERNEL.replace("const T* k", "const uint8_t* k_fp8, float descale")
DIFF = f"""The fp8-KV decode path (a test's diff).

diff --git a/csrc/flash_attn/src/kernel.h b/csrc/flash_attn/src/kernel.h
--- a/csrc/flash_attn/src/kernel.h
+++ b/csrc/flash_attn/src/kernel.h
@@ -1,2 +1,2 @@
 // split-KV decode
-{KERNEL.splitlines()[1]}
+{PATCHED.splitlines()[1]}
"""
# The builder: refuses an unpatched tree, then links one library with the nvcc it is given.
BUILDER = '''import argparse, pathlib, subprocess
a = argparse.ArgumentParser()
for o in ("--tree", "--cutlass", "--ours", "--nvcc", "--arch", "--out", "-j"):
    a.add_argument(o)
args = a.parse_args()
kernel = pathlib.Path(args.tree, "csrc/flash_attn/src/kernel.h").read_text()
assert "k_fp8" in kernel, "the tree is not patched"
assert pathlib.Path(args.cutlass, "include/cute/tensor.hpp").is_file()
sm = args.arch.replace(".", "")
pathlib.Path(args.out).mkdir()
subprocess.run([args.nvcc, "-shared", f"arch=compute_{sm},code=sm_{sm}",
                "-o", f"{args.out}/libfa2fp8_sm{sm}.so", "fa2/csrc/api.cu"], check=True)
'''


@pytest.fixture
def fa2(project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Project:
    mirror = tmp_path / "mirror"
    commits = {}
    for name, files in (("flash-attention", {"csrc/flash_attn/src/kernel.h": KERNEL,
                                             "LICENSE": "BSD\n"}),
                        ("cutlass", {"include/cute/tensor.hpp": "// cute\n"})):
        repo = tmp_path / "repos" / name
        for rel, text in files.items():
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            (repo / rel).write_text(text)
        git(repo, "init", "-q")
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", "x")
        commits[name] = git(repo, "rev-parse", "HEAD")
        archive(repo, commits[name], mirror, "tar.gz")
    recipe = project.root / "recipe.toml"
    text = recipe.read_text()
    text = text.replace("0123456789abcdef0123456789abcdef01234567", commits["flash-attention"])
    text = text.replace("89abcdef0123456789abcdef0123456789abcdef", commits["cutlass"])
    text = text.replace('outputs = ["vllm"]', 'outputs = ["vllm", "fa2"]')
    recipe.write_text(text + '\n[fetch]\nmirrors = ["../mirror"]\n')
    fa2 = project.root / "fa2"
    (fa2 / "csrc").mkdir(parents=True)
    (fa2 / "csrc" / "api.cu").write_text('extern "C" int fa2fp8_decode() { return 0; }\n')
    (fa2 / "build.py").write_text(BUILDER)
    (fa2 / "build.toml").write_text("[library]\nname = 'fa2fp8'\n")
    (fa2 / "fp8-kv.diff").write_text(DIFF)
    (fa2 / "README.md").write_text(
        f"Against github.com/vllm-project/flash-attention {commits['flash-attention']}.\n"
        "https://example.invalid/flash-attention\n")
    (fa2 / "python" / "fa2fp8").mkdir(parents=True)
    (fa2 / "python" / "fa2fp8" / "__init__.py").write_text('"""loader"""\n')
    loaded = load(recipe)
    lockmod.write(project.root, list(lockmod.read(project.root).values()), pin_trees(loaded))
    return project


def _build(p: Project, capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, str]:
    capsys.readouterr()
    assert p.run("build", "--no-link", "--json", *argv) == 0
    out: dict[str, str] = json.loads(capsys.readouterr().out)
    return out


def test_fa2_builds_per_arch_into_a_wheel_in_the_stack(
        fa2: Project, capsys: pytest.CaptureFixture[str]) -> None:
    out = _build(fa2, capsys, "--only", "fa2")
    wheel = next(Path(out["result"]).glob("fa2fp8-0.1.0-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    assert {"fa2fp8/__init__.py", "fa2fp8/lib/libfa2fp8_sm86.so",
            "fa2fp8/lib/libfa2fp8_sm90.so"} <= names
    log = (fa2.tmp / "nvcc.log").read_text()
    assert "arch=compute_86,code=sm_86" in log and "arch=compute_90,code=sm_90" in log
    # the builder ran with relative paths only: nothing of this machine reaches the compiler
    assert str(fa2.tmp) not in log
    # the default build links it into the stack beside the patched vLLM wheel
    stack = Path(_build(fa2, capsys)["result"])
    wheels = sorted(p.name for p in stack.iterdir() if p.suffix == ".whl")
    assert wheels[0] == wheel.name and wheels[1].startswith("vllm-0.0.1+q38.")
    assert (stack / wheel.name).resolve() == wheel.resolve()


def test_a_diff_that_no_longer_applies_fails_by_hunk_and_lint_says_where(
        fa2: Project, capsys: pytest.CaptureFixture[str]) -> None:
    diff = fa2.root / "fa2" / "fp8-kv.diff"
    diff.write_text(DIFF.replace(" // split-KV decode", " // split-KV decoder"))
    assert fa2.run("build", "--only", "fa2", "--no-link") == 1
    err = capsys.readouterr().err
    assert "fp8-kv.diff does not apply at fuzz 0" in err and "hunk #1" in err
    assert not list(fa2.store.glob("objects/*/fa2fp8-*.whl"))
    assert fa2.run("lint") == 2
    out = capsys.readouterr().out
    assert "fa2/fp8-kv.diff:6: [fa2-upstream] hunk #1 of csrc/flash_attn/src/kernel.h does " \
        "not apply at fuzz 0 to flash-attention" in out


def test_a_mirror_tree_with_other_bytes_is_refused(
        fa2: Project, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    tree = lockmod.read_trees(fa2.root)["flash-attention"]
    lockmod.write(fa2.root, list(lockmod.read(fa2.root).values()), [
        *(t for t in lockmod.read_trees(fa2.root).values() if t.name != tree.name),
        lockmod.LockedTree(tree.name, tree.repository, tree.commit, tree.paths, "0" * 64)])
    assert fa2.run("--offline", "build", "--only", "fa2", "--no-link") == 1
    err = capsys.readouterr().err
    assert f"source 'flash-attention' ({tree.commit[:12]})" in err
    assert "passed over" not in err and "tree " in err
    assert not list(fa2.store.glob("objects/*/csrc"))


def test_plan_names_fa2_declared_until_its_sources_are_locked(
        fa2: Project, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert fa2.run("plan", "--json") == 0
    kinds = [s["kind"] for s in json.loads(capsys.readouterr().out)["steps"]]
    assert kinds.count("fa2-lib") == 2 and "tree-patch" in kinds and "fa2-wheel" in kinds
    lockmod.write(fa2.root, list(lockmod.read(fa2.root).values()), [])
    assert fa2.run("plan", "--json") == 0
    plan = json.loads(capsys.readouterr().out)
    assert "fa2-lib" not in [s["kind"] for s in plan["steps"]]
    declared = {d["name"]: d["status"] for d in plan["declared"]}
    assert "source 'flash-attention' is not locked" in declared["fa2"]
    assert fa2.run("build", "--only", "fa2", "--no-link") == 2
    assert "fa2 is declared, not built" in capsys.readouterr().err


def test_bump_moves_the_source_and_tries_the_diff_hunk_by_hunk(
        fa2: Project, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    repo = tmp_path / "repos" / "flash-attention"
    kernel = repo / "csrc" / "flash_attn" / "src" / "kernel.h"

    def upstream(text: str, path: Path = kernel) -> str:
        path.write_text(text)
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", "upstream")
        commit = git(repo, "rev-parse", "HEAD")
        archive(repo, commit, tmp_path / "mirror", "tar.gz")
        return commit

    recipe = fa2.root / "recipe.toml"
    before = recipe.read_text(), (fa2.root / "lock" / "sources.json").read_text()
    changed = upstream(KERNEL.replace("const T* k", "const T* __restrict__ k"))
    capsys.readouterr()
    assert fa2.run("bump", "flash-attention", changed, "--dry-run") == 1
    out = capsys.readouterr().out
    assert "csrc/flash_attn/src/kernel.h hunk #1: FAILS" in out and "rebase it" in out
    moved = upstream("// header\n// more\n" + KERNEL)
    assert fa2.run("bump", "flash-attention", moved) == 1
    assert "hunk #1: applies at offset +2" in capsys.readouterr().out
    assert (recipe.read_text(), (fa2.root / "lock" / "sources.json").read_text()) == before
    kernel.write_text(KERNEL)
    tail = upstream("// another kernel\n", kernel.parent / "other.h")
    assert fa2.run("bump", "flash-attention", tail) == 0
    out = capsys.readouterr().out
    assert "1 hunk(s) apply as they are, 0 need work" in out
    assert f"next: name {tail} in fa2/README.md" in out
    assert fa2.run("build", "--only", "fa2", "--no-link") == 2  # the README names the old one
    readme = fa2.root / "fa2" / "README.md"
    readme.write_text(readme.read_text().replace(before[0].split('commit = "')[1][:40], tail))
    assert f'commit = "{tail}"' in recipe.read_text()
    assert "# The series, in apply order" in recipe.read_text()  # comments kept
    assert lockmod.read_trees(fa2.root)["flash-attention"].commit == tail
    assert fa2.run("build", "--only", "fa2", "--no-link") == 0
    assert fa2.run("bump", "nowhere", tail) == 2
    assert "the recipe pins vllm, flash-attention, cutlass" in capsys.readouterr().err


def test_a_cache_serves_fa2_and_a_kernels_machine_fetches_only_its_wheel(
        fa2: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Like the cubins: pushed once, then ``build --only fa2`` on a machine with an empty
    store, no mirror and no compiler takes the fa2fp8 wheel's entry from the cache and
    nothing else (no tree, no toolchain), running no step."""
    from qwen38build.cli import main
    from qwen38build.engine import executor
    from tests import cache_fixtures as cf
    from tests.test_substituter import make_key

    key, key_file = make_key(tmp_path / "keys")
    with cf.nginx(tmp_path / "cache", tmp_path / "nginx") as url:
        a = _build(fa2, capsys, "--only", "fa2")
        assert fa2.run("push", url, a["build"], "--key", str(key_file), "--json") == 0
        (tmp_path / "mirror").rename(tmp_path / "gone")
        monkeypatch.setenv("QWEN38BUILD_SOURCES", str(tmp_path / "nothing"))
        monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))

        def no_build(*args: object, **kwargs: object) -> None:
            raise AssertionError("a step ran on machine B")

        monkeypatch.setattr(executor, "_build", no_build)
        store_b = tmp_path / "store-b"
        capsys.readouterr()
        rc = main(["--recipe", str(fa2.root / "recipe.toml"), "--store", str(store_b),
                   "--substituter", url, "--trusted-public-key", str(key.public()),
                   "build", "--only", "fa2", "--json", "-q", "--no-link"])
        captured = capsys.readouterr()
        assert rc == 0, captured.err
        assert json.loads(captured.out)["build"] == a["build"]
        held = {json.loads(p.read_text())["derivation"]["kind"]
                for p in (store_b / "objects").glob("*.json")}
        assert held == {"fa2-wheel"}


def test_lock_pins_what_it_can_reach_and_leaves_the_rest_declared(
        fa2: Project, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A tree no mirror holds and no origin serves stays unpinned with a warning (KVarN's
    case): the lock is still written and checks clean, and plan shows FA2 as declared."""
    from qwen38build.pinning.sources import check_lock

    recipe = fa2.root / "recipe.toml"
    old = lockmod.read_trees(fa2.root)["flash-attention"].commit
    recipe.write_text(recipe.read_text().replace(old, "f" * 40))
    said: list[str] = []
    trees = pin_trees(load(recipe), say=said.append)
    assert [t.name for t in trees] == ["cutlass"]  # kept as locked: nothing re-fetched
    assert len(said) == 1 and said[0].startswith("warning: source flash-attention not pinned")
    assert "no mirror holds ffffffff" in said[0]
    lockmod.write(fa2.root, list(lockmod.read(fa2.root).values()), trees)
    check_lock(load(recipe))
    capsys.readouterr()
    assert fa2.run("plan", "--json") == 0
    declared = {d["name"]: d["status"] for d in json.loads(capsys.readouterr().out)["declared"]}
    assert "source 'flash-attention' is not locked" in declared["fa2"]


def test_lint_says_when_fa2_upstream_cannot_be_checked(
        fa2: Project, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """No mirror and no origin within reach (offline): the rule cannot run, and lint says
    so in a line instead of failing the other rules' verdict or passing in silence."""
    (tmp_path / "mirror").rename(tmp_path / "gone")
    capsys.readouterr()
    assert fa2.run("--offline", "lint") == 0
    err = capsys.readouterr().err
    assert "lint: fa2-upstream not checked: source 'flash-attention'" in err
    assert "offline mode forbids the origin" in err


def test_fa2_compiles_with_the_system_nvcc_when_asked(
        fa2: Project, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    """A GPU machine that cannot fetch the locked compiler wheels builds fa2 with its own
    nvcc (`--system-nvcc`, as the pthfa cubins): no toolchain step, that nvcc's identity in
    the digest, and a different nvcc a different build."""
    from tests.engine_fixtures import FAKE_NVCC

    bin_dir = tmp_path / "sysbin"
    bin_dir.mkdir()
    nvcc = bin_dir / "nvcc"
    log = tmp_path / "system-nvcc.log"
    nvcc.write_text(FAKE_NVCC.replace("@LOG@", str(log)).replace("@VERSION@", "release 13.0"))
    nvcc.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    first = _build(fa2, capsys, "--only", "fa2", "--system-nvcc")
    assert "arch=compute_90,code=sm_90" in log.read_text()
    assert fa2.run("plan", "--json", "--system-nvcc") == 0
    plan = json.loads(capsys.readouterr().out)
    kinds = [s["kind"] for s in plan["steps"]]
    assert "fa2-lib" in kinds and "toolchain" not in kinds, kinds
    # the plan's build hash is the build's (it was the locked toolchain's under the flag)
    assert plan["build"] == _build(fa2, capsys, "--system-nvcc")["build"]
    nvcc.write_text(nvcc.read_text().replace("release 13.0", "release 13.1"))
    assert _build(fa2, capsys, "--only", "fa2", "--system-nvcc")["build"] != first["build"]


def test_kernels_fa2_builds_the_asked_arch_only(
        fa2: Project, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`kernels --arch 9.0 --fa2` (what `nox -s gpu_tests` runs): pthfa's cubin and FA2's
    library for that arch alone, both wheels; --out copies them."""
    from tests.engine_fixtures import add_pthfa_sources

    add_pthfa_sources(fa2.root)
    out_dir = tmp_path / "artifacts"
    assert fa2.run("kernels", "--arch", "9.0", "--fa2", "--json", "-q", "--out",
                   str(out_dir)) == 0
    found = json.loads(capsys.readouterr().out)
    assert list(found["fa2"]["libs"]) == ["9.0"]
    with zipfile.ZipFile(found["fa2"]["wheel"]) as z:
        libs = sorted(n for n in z.namelist() if n.startswith("fa2fp8/lib/"))
    assert libs == ["fa2fp8/lib/libfa2fp8_sm90.so"]
    assert Path(found["fa2"]["wheel"]).name in {p.name for p in out_dir.iterdir()}


def test_kernels_fa2_without_its_sources_is_refused(
        project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.engine_fixtures import add_pthfa_sources

    add_pthfa_sources(project.root)
    assert project.run("kernels", "--arch", "9.0", "--fa2", "-q") == 2
    assert "fa2 is declared, not built" in capsys.readouterr().err
