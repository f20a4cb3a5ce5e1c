"""The build end to end on a tiny project: cache hits, incremental rebuilds, failures that
lose nothing, determinism across stores, time zones and umasks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from qwen38build.engine.executor import realise
from qwen38build.engine.plan import make_plan
from qwen38build.engine.report import Reporter
from qwen38build.errors import FetchError, PatchFailed
from qwen38build.inputs import lock, recipe
from qwen38build.store.store import Store
from tests.conftest import ENVS as ENVS_TEXT
from tests.conftest import SERVER, Project
from tests.engine_fixtures import record_hash

REPO = Path(__file__).resolve().parents[1]


def _plan(p: Project):  # type: ignore[no-untyped-def]
    loaded = recipe.load(p.root / "recipe.toml")
    return make_plan(loaded, lock.read(p.root))


def _built(p: Project) -> dict[str, bool]:
    outcomes = realise([_plan(p).top], Store(p.store), Reporter(quiet=True))
    return {o.step.kind: o.built for o in outcomes.values()}


def test_build_writes_a_labelled_wheel_and_links_result(project: Project, capsys) -> None:  # type: ignore[no-untyped-def]
    assert project.run("build", "--json") == 0
    out = json.loads(capsys.readouterr().out)
    wheel = Path(out["wheel"])
    assert wheel.name == f"vllm-0.0.1+q38.{out['build'][:8]}-cp38-abi3-manylinux_2_28_x86_64.whl"
    assert (project.root / "result").resolve() == wheel.parent
    with zipfile.ZipFile(wheel) as z:
        assert b"return 33" in z.read("vllm/server.py")
        assert b"KNOB_7 = 70" in z.read("vllm/envs.py")
        di = f"vllm-0.0.1+q38.{out['build'][:8]}.dist-info"
        assert f"Version: 0.0.1+q38.{out['build'][:8]}".encode() in z.read(f"{di}/METADATA")
        rows = [r.split(",") for r in z.read(f"{di}/RECORD").decode().splitlines()]
        for name, h, _size in rows:
            if name.endswith("/RECORD"):
                continue
            assert record_hash(z.read(name)) == h, name
        assert {r[0] for r in rows} == set(z.namelist())
        # untouched members are copied raw: still deflated, byte-identical to the pristine
        assert z.getinfo("vllm/__init__.py").compress_type == zipfile.ZIP_DEFLATED


def test_second_build_is_all_cache_hits(project: Project) -> None:
    assert set(_built(project).values()) == {True}
    assert _built(project) == {"fetch": False, "patch": False, "wheel": False}


def test_editing_one_patch_reruns_only_what_depends_on_it(project: Project) -> None:
    _built(project)
    project.patch("route-fix", "server.py", SERVER, SERVER.replace("return 4\n", "return 44\n"))
    assert _built(project) == {"fetch": False, "patch": True, "wheel": True}


def test_changing_one_input_changes_exactly_the_digests_downstream(project: Project) -> None:
    before = _plan(project).targets
    project.patch("knob", "envs.py", "A = 1\n", "A = 2\n")
    after = _plan(project).targets
    assert before["fetch"].digest == after["fetch"].digest
    assert before["patch"].digest != after["patch"].digest
    assert before["wheel"].digest != after["wheel"].digest
    assert _plan(project).targets["wheel"].digest == after["wheel"].digest  # stable


def test_digest_does_not_depend_on_where_the_project_lives(project: Project, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "elsewhere"
    shutil.copytree(project.root, copy)
    a = _plan(project).build_hash
    b = make_plan(recipe.load(copy / "recipe.toml"), lock.read(copy)).build_hash
    assert a == b


def test_failing_hunk_names_patch_file_hunk_and_stores_nothing(project: Project, capsys) -> None:  # type: ignore[no-untyped-def]
    old = SERVER.replace("return 3\n", "return 33\n")  # context the pristine file lacks
    project.patch("route-fix", "server.py", old, old.replace("return 4\n", "return 44\n"))
    assert project.run("build") == 1
    err = capsys.readouterr().err
    assert "patch route-fix.patch does not apply at fuzz 0" in err
    assert "server.py: hunk #1 at line" in err and "FAILED" in err
    assert "the lines it changes stand at line 14 of the file, with other context" in err
    store = Store(project.store)
    plan = _plan(project)
    assert store.lookup(plan.targets["patch"].digest) is None
    assert store.lookup(plan.top.digest) is None
    assert not any(store.tmp.iterdir())


def test_failure_says_when_the_context_stands_elsewhere(project: Project) -> None:
    # the hunk expects "route_3" body lines that were moved: its context is found elsewhere
    moved = SERVER.replace("def route_3():\n    return 3\n\n", "") + "def route_3():\n    return 3\n\n"
    from tests.engine_fixtures import FILES, make_project, make_wheel, sha256

    files = dict(FILES)
    files["vllm/server.py"] = moved
    wheel = make_wheel(project.tmp / "moved", files)
    make_project(project.root, wheel, ["route-fix", "knob"])
    project.patch("route-fix", "server.py", SERVER, SERVER.replace("    return 3\n", "    return 300\n"))
    os.environ["QWEN38BUILD_SOURCES"] = str(wheel.parent)
    assert sha256(wheel)
    with pytest.raises(PatchFailed) as info:
        _built(project)
    text = str(info.value)
    assert "the lines it changes stand at line 59 of the file, with other context" in text


def test_sha_mismatch_from_pip_deletes_the_download(project: Project, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    lock_file = project.root / "lock" / "sources.json"
    data = json.loads(lock_file.read_text())
    next(e for e in data["sources"] if e["name"] == "vllm")["sha256"] = "0" * 64
    lock_file.write_text(json.dumps(data))
    monkeypatch.delenv("QWEN38BUILD_SOURCES")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(project.wheels))
    with pytest.raises(FetchError) as info:
        _built(project)
    assert "does not match the lock's " + "0" * 64 in str(info.value)
    assert not Store(project.store).objects.exists() or not any(Store(project.store).entries())


def test_lock_that_disagrees_with_recipe_is_bad_input(project: Project, capsys) -> None:  # type: ignore[no-untyped-def]
    text = (project.root / "recipe.toml").read_text().replace('version = "0.0.1"', 'version = "0.0.2"')
    (project.root / "recipe.toml").write_text(text)
    assert project.run("lock", "--check") == 2
    err = capsys.readouterr().err
    assert "vllm.version is '0.0.1' in the lock but '0.0.2' in the recipe" in err
    assert "qwen38build bump vllm 0.0.2" in err  # a moved pin is bump's to carry
    assert project.run("build") == 2
    assert not project.store.exists()


def _cli(p: Project, *argv: str, env: dict[str, str] | None = None,
         umask: str = "022") -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "QWEN38BUILD_SOURCES": str(p.wheels), **(env or {})}
    cmd = " ".join(["umask", umask, ";", "exec", sys.executable, "-m", "qwen38build",
                    "--recipe", str(p.root / "recipe.toml"), *argv])
    return subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, env=full_env,
                          cwd=REPO, check=False)


def test_two_stores_time_zones_and_umasks_give_identical_bytes(project: Project) -> None:
    a = _cli(project, "--store", str(project.tmp / "s1"), "build", "--json", "--no-link",
             env={"TZ": "Asia/Tokyo"}, umask="077")
    b = _cli(project, "--store", str(project.tmp / "s2"), "build", "--json", "--no-link",
             env={"TZ": "America/Los_Angeles", "SOURCE_DATE_EPOCH": "12345"}, umask="002")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    wa, wb = Path(json.loads(a.stdout)["wheel"]), Path(json.loads(b.stdout)["wheel"])
    assert wa.read_bytes() == wb.read_bytes()
    assert (wa.parent / "manifest.json").read_bytes() == (wb.parent / "manifest.json").read_bytes()


def test_two_builds_at_once_build_each_step_once(project: Project) -> None:
    full_env = {**os.environ, "QWEN38BUILD_SOURCES": str(project.wheels)}
    args = [sys.executable, "-m", "qwen38build", "--recipe", str(project.root / "recipe.toml"),
            "--store", str(project.store), "build", "--no-link", "--rebuild"]
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=full_env, cwd=REPO) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert outs[0][0] == outs[1][0]
    built = sum(err.count(" built in ") for _, err in outs)
    assert built == 3  # fetch, patch, wheel: each once, by whichever build got the lock


KILL_SCRIPT = """
import os, signal, sys
from qwen38build.wheels import wheelzip
real = wheelzip.PatchedWheel._emit
def dying(self, out, members, default):
    out.write_bytes(b"half a wheel")
    os.kill(os.getpid(), signal.SIGKILL)
wheelzip.PatchedWheel._emit = dying
from qwen38build.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_build_killed_mid_step_leaves_the_store_consistent(project: Project) -> None:
    full_env = {**os.environ, "QWEN38BUILD_SOURCES": str(project.wheels)}
    proc = subprocess.run(
        [sys.executable, "-c", KILL_SCRIPT, "--recipe", str(project.root / "recipe.toml"),
         "--store", str(project.store), "build", "--no-link"],
        capture_output=True, text=True, env=full_env, cwd=REPO, check=False,
    )
    assert proc.returncode == -9
    store = Store(project.store)
    assert store.lookup(_plan(project).top.digest) is None  # no half entry
    assert _built(project) == {"fetch": False, "patch": False, "wheel": True}
    assert store.get(_plan(project).top.digest) is not None


def test_a_tampered_store_entry_is_rebuilt_not_used(project: Project, capsys) -> None:  # type: ignore[no-untyped-def]
    _built(project)
    store = Store(project.store)
    entry = store.get(_plan(project).targets["patch"].digest)
    assert entry is not None
    target = entry.path / "tree" / "server.py"
    os.chmod(target.parent, 0o755)
    os.chmod(target, 0o644)
    target.write_text("tampered\n")
    assert project.run("store", "verify") == 1
    assert f"changed: {entry.digest}/tree/server.py" in capsys.readouterr().out
    assert _built(project)["patch"] is True
    assert project.run("store", "verify") == 0


def test_recipe_errors_exit_2_and_name_key_paths(project: Project, capsys) -> None:  # type: ignore[no-untyped-def]
    text = (project.root / "recipe.toml").read_text()
    text = text.replace('archs = ["8.6", "sm_90"]', 'archs = ["8.6", "banana"]\ncolour = 1')
    (project.root / "recipe.toml").write_text(text)
    assert project.run("build") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1  # one line: the first problem and how many more
    assert "recipe.toml:cuda.archs.1: 'banana' is not a CUDA arch" in err
    assert "(and 1 more problem; --json lists all)" in err
    assert project.run("build", "--json") == 2
    problems = json.loads(capsys.readouterr().err)["problems"]
    assert "cuda.colour: unknown key; remove it or check its spelling" in problems
    assert not project.store.exists()


NOOP_PROBE = """
import sys
from qwen38build.cli import main
code = main(sys.argv[1:])
print("heavy:", sorted(m for m in ("pydantic", "argparse", "rich", "qwen38build.inputs.recipe")
                       if m in sys.modules))
raise SystemExit(code)
"""


def _noop(p: Project) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", NOOP_PROBE, "--recipe", str(p.root / "recipe.toml"),
         "--store", str(p.store), "build", "--no-link"],
        capture_output=True, text=True, cwd=REPO, check=False,
        env={**os.environ, "QWEN38BUILD_SOURCES": str(p.wheels)},
    )


def test_noop_build_answers_without_loading_the_recipe(project: Project) -> None:
    first = _noop(project)
    assert first.returncode == 0 and "pydantic" in first.stdout  # the full path ran
    again = _noop(project)
    assert again.returncode == 0
    assert "heavy: []" in again.stdout
    assert again.stdout.splitlines()[0] == first.stdout.splitlines()[0]  # same build hash


@pytest.mark.parametrize("change", ["patch", "new-file", "pthfa", "lock"])
def test_noop_fast_path_misses_when_an_input_changes(project: Project, change: str) -> None:
    _noop(project)
    if change == "patch":
        project.patch("knob", "envs.py", ENVS_TEXT, ENVS_TEXT.replace("KNOB_9 = 9\n", "KNOB_9 = 99\n"))
    elif change == "new-file":
        (project.root / "patches" / "stray.patch").write_text("x\n")
    elif change == "pthfa":
        (project.root / "pthfa" / "PIN").write_text("v0.2.0\n")
    else:
        lock_file = project.root / "lock" / "sources.json"
        lock_file.write_text(lock_file.read_text().replace('"size"', '"size" ', 1))
    result = _noop(project)
    assert "pydantic" in result.stdout  # the full path ran: validation and lint saw the change


def test_a_patch_path_leaving_the_package_is_refused_and_named(project: Project, capsys) -> None:  # type: ignore[no-untyped-def]
    path = project.root / "patches" / "knob.patch"
    path.write_text(path.read_text().replace("a/envs.py", "a/../envs.py").replace(
        "b/envs.py", "b/../envs.py"))
    assert project.run("build") != 0
    err = capsys.readouterr().err
    assert "patches/knob.patch" in err and "leaves the vllm/ package" in err
    assert Store(project.store).lookup(_plan(project).targets["patch"].digest) is None


def test_a_wheel_member_outside_its_directory_is_refused(project: Project, capsys) -> None:  # type: ignore[no-untyped-def]
    from tests.engine_fixtures import FILES, make_project, make_wheel

    evil = make_wheel(project.tmp / "evil", {**FILES, "../outside.py": "x = 1\n"})
    make_project(project.root, evil, ["route-fix", "knob"])
    os.environ["QWEN38BUILD_SOURCES"] = str(evil.parent)
    assert project.run("build") == 2
    assert "wheel member '../outside.py' would be written outside its directory" in (
        capsys.readouterr().err)
    assert Store(project.store).lookup(_plan(project).top.digest) is None
    assert not (project.store / "outside.py").exists()


def test_a_patched_file_keeps_its_pristine_executable_bit(
        project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    """Mode bits, explicitly (series/diff.py): a patched member keeps its pristine wheel
    member's mode, executable or not; a mode change or a new executable file is refused at
    parse time (the bad-input corpus: patch-mode-change, patch-new-file-executable)."""
    import hashlib

    wheel = next(project.wheels.glob("vllm-*.whl"))
    rewritten = project.tmp / "x.whl"
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(rewritten, "w") as dst:
        for info in src.infolist():
            if info.filename == "vllm/server.py":
                info.external_attr = 0o100755 << 16
            dst.writestr(info, src.read(info.filename))
    rewritten.replace(wheel)
    lock_file = project.root / "lock" / "sources.json"
    data = json.loads(lock_file.read_text())
    entry = next(e for e in data["sources"] if e["name"] == "vllm")
    entry.update(sha256=hashlib.sha256(wheel.read_bytes()).hexdigest(),
                 size=wheel.stat().st_size)
    lock_file.write_text(json.dumps(data))
    assert project.run("build", "--json", "-q", "--no-link") == 0
    out = json.loads(capsys.readouterr().out)
    with zipfile.ZipFile(out["wheel"]) as z:
        modes = {i.filename: (i.external_attr >> 16) & 0o777 for i in z.infolist()}
        assert b"return 33" in z.read("vllm/server.py")  # patched
        assert b"KNOB_7 = 70" in z.read("vllm/envs.py")
    assert modes["vllm/server.py"] == 0o755 and modes["vllm/envs.py"] == 0o644
