"""gc: temporary roots of live sessions, indirect roots through ./result, dead owners' tmp."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from qwen38build.engine.plan import Plan, make_plan
from qwen38build.inputs import lock, recipe
from qwen38build.store import temproots
from qwen38build.store.gc import collect
from qwen38build.store.store import Store
from tests.conftest import ENVS, Project

REPO = Path(__file__).resolve().parent.parent


def _plan(p: Project) -> Plan:
    return make_plan(recipe.load(p.root / "recipe.toml"), lock.read(p.root))


def _build(p: Project, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    assert p.run("build", "--json", "-q", *extra) == 0
    build: str = json.loads(capsys.readouterr().out)["build"]
    return build


def _unroot(store: Store) -> None:
    for p in store.roots.glob("*.json"):
        p.unlink()


def test_a_live_sessions_temporary_roots_are_never_collected(
        project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    build = _build(project, capsys, "--no-link")
    store = Store(project.store)
    _unroot(store)
    with store.hold() as session:
        session.add([build])
        assert collect(store).removed == []  # the build and its whole closure are kept
        assert store.get(build) is not None
    assert build in collect(store).removed  # the session ended: nothing keeps it
    assert store.lookup(build) is None and not any(store.objects.iterdir())


def test_a_build_finishing_while_gc_decides_keeps_what_it_made(
        project: Project, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A build writes its root, then releases its temporary roots, without gc's lock. gc
    reads the live sessions, then the roots: a build that finishes between the two reads is
    seen by the second. (Read the other way round, it was seen by neither and collected:
    the concurrency test's double builds.)"""
    build = _build(project, capsys, "--no-link")
    store = Store(project.store)
    roots = {p.name: p.read_bytes() for p in store.roots.glob("*.json")}
    _unroot(store)
    builder = temproots.Session(store.root)  # another process's live session
    builder.add([build])
    real = temproots.live_sessions

    def finishing_meanwhile(root: Path) -> dict[str, set[str]]:
        for name, data in roots.items():  # the build's root appears, then its session ends
            (store.roots / name).write_bytes(data)
        builder.close()
        return real(root)

    monkeypatch.setattr(temproots, "live_sessions", finishing_meanwhile)
    assert collect(store).removed == []
    assert store.get(build) is not None


def test_result_link_is_an_indirect_root_and_a_dangling_one_is_dropped(
        project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    build = _build(project, capsys)
    store = Store(project.store)
    _unroot(store)
    assert collect(store).removed == []
    assert (project.root / "result" / "manifest.json").is_file()
    (project.root / "result").unlink()
    assert build in collect(store).removed
    assert not any(store.auto_roots.iterdir())


def test_a_noop_build_keeps_its_result_alive_across_gc(
        project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    first = _build(project, capsys)
    original = (project.root / "patches" / "knob.patch").read_bytes()
    project.patch("knob", "envs.py", ENVS, ENVS.replace("KNOB_9 = 9\n", "KNOB_9 = 99\n"))
    second = _build(project, capsys)
    (project.root / "patches" / "knob.patch").write_bytes(original)
    assert _build(project, capsys) == first  # answered by the fast path
    assert project.run("gc") == 0
    capsys.readouterr()
    assert os.readlink(project.root / "result").endswith(first)
    assert Store(project.store).get(first) is not None
    assert (project.root / "result" / "manifest.json").is_file()
    assert second  # the second build stays too: it is the recipe's last full build


HOLDER = """
import sys, time
from pathlib import Path
from qwen38build.store.store import Store
store = Store(Path(sys.argv[1]))
with store.hold() as session:
    work = store.work_dir(session, "scratch")
    (work / "big").write_bytes(b"x" * 1000)
    print(work, flush=True)
    time.sleep(60)
"""


def _holder(store: Path) -> tuple[subprocess.Popen[str], Path]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(store)], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, Path(proc.stdout.readline().strip())


def _kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def test_tmp_work_is_removed_only_once_its_owner_is_dead(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    proc, work = _holder(store.root)
    try:
        assert work.is_dir()
        assert collect(store).tmp_removed == []
        assert work.is_dir()  # its owner is alive
    finally:
        _kill(proc)
    assert collect(store).tmp_removed == [work.name]
    assert not work.exists() and not any((store.root / "temproots").iterdir())


def test_the_next_build_reclaims_a_killed_builds_tmp_and_locks(
        project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    store = Store(project.store)
    proc, work = _holder(store.root)
    _kill(proc)
    store.locks.mkdir(parents=True)
    (store.locks / f"{'a' * 64}.lock").touch()  # as a killed holder leaves it
    _build(project, capsys, "--no-link")
    assert not work.exists() and list(store.tmp.iterdir()) == []
    assert list(store.locks.iterdir()) == []
    assert list((store.root / "temproots").iterdir()) == []


@pytest.mark.parametrize("folder", ["roots", "gcroots/auto"])
def test_gc_removes_nothing_when_a_roots_folder_is_a_file(
        project: Project, capsys: pytest.CaptureFixture[str], folder: str) -> None:
    """Roots gc cannot read are not an empty set of roots: it stops, one line, store kept."""
    build = _build(project, capsys, "--no-link")
    store = Store(project.store)
    garbage = store.objects / ("e" * 64)
    garbage.mkdir()  # unrooted: a working gc would take it
    target = store.root / folder
    if target.is_dir():
        for p in target.iterdir():
            p.unlink()
        target.rmdir()
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("not a folder")
    assert project.run("gc") == 1
    err = capsys.readouterr().err
    assert f"{folder}: the store's roots are not a folder" in err and "Traceback" not in err
    assert garbage.is_dir() and store.get(build) is not None


def test_gc_reports_malformed_records_and_never_crashes(
        project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    build = _build(project, capsys)
    store = Store(project.store)
    store.auto_roots.mkdir(parents=True, exist_ok=True)
    (store.auto_roots / "dangling").symlink_to(project.tmp / "nowhere" / "result")
    store.meta_path("f" * 64).write_text("[]")
    assert project.run("gc") == 0
    captured = capsys.readouterr()
    assert any(line.startswith("removed") and line.endswith("f" * 64)
               for line in captured.out.splitlines())
    assert not (store.auto_roots / "dangling").is_symlink()
    assert store.get(build) is not None


@pytest.mark.parametrize(("text", "says"), [
    ("{nope", "bad.json: malformed root"),
    ('{"build": 7}', "bad.json: malformed root"),
    ('{"build": "../../etc"}', "is not a build hash"),
])
def test_a_corrupt_root_stops_gc_before_it_removes_anything(
        project: Project, capsys: pytest.CaptureFixture[str], text: str, says: str) -> None:
    """What a corrupt root kept cannot be told: gc exits 1 in one line and removes nothing,
    neither the entries only that root kept nor unrooted garbage."""
    build = _build(project, capsys, "--no-link")  # rooted by roots/ alone
    store = Store(project.store)
    garbage = store.objects / ("e" * 64)
    garbage.mkdir()
    [root] = list(store.roots.glob("*.json"))
    root.rename(store.roots / "bad.json")
    (store.roots / "bad.json").write_text(text)
    before = sorted(p.name for p in store.objects.iterdir())
    capsys.readouterr()
    assert project.run("gc") == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and "gc removed nothing" in err, err
    assert sorted(p.name for p in store.objects.iterdir()) == before
    assert garbage.is_dir() and store.get(build) is not None


def test_no_lock_files_are_left_after_failed_or_good_steps(
        project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    _build(project, capsys)
    server = (project.root / "patches" / "route-fix.patch")
    server.write_text(server.read_text().replace("+    return 33", "+    return 34").replace(
        "-    return 3\n", "-    return 300\n"))
    assert project.run("build") != 0
    capsys.readouterr()
    store = Store(project.store)
    assert list(store.locks.iterdir()) == []
    assert list(store.tmp.iterdir()) == []


def test_a_store_we_may_not_write_still_gets_its_result_link(
        project: Project, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A shared read-only cache takes no roots from us (we cannot collect it either)."""
    import errno

    from qwen38build.store import temproots

    build = _build(project, capsys, "--no-link")

    def refused(root: Path) -> None:
        raise PermissionError(errno.EROFS, "Read-only file system", str(root))

    monkeypatch.setattr(temproots, "Session", refused)
    assert Store(project.store).link_result(build, project.root / "result")
    assert os.readlink(project.root / "result").endswith(build)
    assert not Store(project.store).auto_roots.exists()


PAUSED_BUILD = """
import sys, time
from pathlib import Path
from qwen38build.steps import wheel
real = wheel.run
def paused(ctx):
    print("in-step", flush=True)
    while not Path(sys.argv[1]).exists():
        time.sleep(0.01)
    real(ctx)
wheel.run = paused
from qwen38build.cli import main
sys.exit(main(sys.argv[2:]))
"""


def test_gc_in_the_middle_of_another_processs_step_takes_nothing_it_uses(
        project: Project) -> None:
    """A build stopped inside its wheel step (its fetch and patch entries made but not yet
    rooted, its scratch and output dirs in tmp/) while `gc` runs in another process."""
    store = Store(project.store)
    go = project.tmp / "go"
    env = {**os.environ, "QWEN38BUILD_SOURCES": str(project.wheels)}
    build = subprocess.Popen(
        [sys.executable, "-c", PAUSED_BUILD, str(go), "--recipe",
         str(project.root / "recipe.toml"), "--store", str(store.root), "build", "--json"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert build.stdout is not None
    assert build.stdout.readline().strip() == "in-step"
    work = sorted(p.name for p in store.tmp.iterdir())
    assert work  # the step's scratch and output dirs
    gc = subprocess.run([sys.executable, "-m", "qwen38build", "--store", str(store.root), "gc"],
                        cwd=REPO, env=env, capture_output=True, text=True, check=False)
    assert gc.returncode == 0 and gc.stdout.strip() == "nothing to remove", gc.stdout
    assert sorted(p.name for p in store.tmp.iterdir()) == work
    go.touch()
    out, err = build.communicate()
    assert build.returncode == 0, err
    result = project.root / "result"
    assert os.readlink(result).endswith(json.loads(out)["build"])
    assert (result / "manifest.json").is_file()
    assert collect(store).removed == []  # now rooted by roots/ and ./result
    assert project.run("store", "verify") == 0


def _disk_bytes(store: Store, digest: str) -> int:
    folder = store.objects / digest
    files = [p for p in folder.rglob("*") if p.is_file() or p.is_symlink()]
    return sum(p.lstat().st_size for p in files) + store.meta_path(digest).stat().st_size


def test_gc_names_what_it_removes_with_sizes_and_a_total(
        project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    first = _build(project, capsys)
    project.patch("knob", "envs.py", ENVS, ENVS.replace("KNOB_9 = 9\n", "KNOB_9 = 99\n"))
    _build(project, capsys)
    store = Store(project.store)
    from qwen38build.engine.step import closure

    plan = {s.digest for s in closure(_plan(project).top)}
    assert first not in plan  # the first build's patch and wheel are what gc may take
    # --dry-run says what it would take and removes nothing.
    assert project.run("gc", "--dry-run") == 0
    dry = capsys.readouterr().out.splitlines()
    assert store.lookup(first) is not None
    record = json.loads(store.meta_path(first).read_text())["derivation"]
    line = next(x for x in dry if x.endswith(first))
    assert line.startswith(f"would remove {record['name']} ") and f" {record['kind']} " in line
    assert dry[-1].startswith("would free ") and dry[-1].endswith(" in 2 entries")
    # --json: each entry's kind, name and bytes on disk, and their total.
    sizes = {d: _disk_bytes(store, d) for d in os.listdir(store.objects)
             if not d.endswith(".json") and d not in plan}
    assert project.run("gc", "--json") == 0
    out = json.loads(capsys.readouterr().out)
    assert {e["path"]: e["bytes"] for e in out["removed"]} == sizes
    assert out["bytes"] == sum(sizes.values()) > 0 and out["dry_run"] is False
    assert {e["kind"] for e in out["removed"]} == {"patch", "wheel"}
    assert all(e["name"] for e in out["removed"])
    assert store.lookup(first) is None
    assert project.run("gc") == 0
    assert capsys.readouterr().out == "nothing to remove\n"
