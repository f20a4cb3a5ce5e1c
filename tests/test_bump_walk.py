"""What the walk of the real 0.32.0 → 0.33.0 bump found misleading, each held: the stopped
carry names the workspace for `export` and says what `--continue` and `--skip` do, and a
hunk whose lines upstream moved into a new file says which file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from qwen38build.bump import bump
from qwen38build.bump.report import next_step
from tests.bump_fixtures import NEW, PIN, Project, make_project, make_wheel, numbered
from tests.test_bump import SERIES, two_pins

A = numbered("a")  # "a line 1" ... as the other bump tests write their files


def test_a_stopped_carry_names_the_workspace_to_export_and_what_continue_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = two_pins(tmp_path, monkeypatch, SERIES)
    ws = tmp_path / "ws"
    report = bump.bump(p.loaded(), p.store, NEW, rebase=ws, dry_run=False)
    text = report.to_screen()
    assert f"`qwen38build export {ws}`" in text  # before: `qwen38build export`, no folder
    assert "stopped at topic conflict-c (3 carried before it)" in text
    assert f"`qwen38build workspace continue {ws} --skip` to leave conflict-c for later" in text
    assert "stops at the next conflict and says this again" in text
    # the walk: export kept `Cut-against: 0.0.1` and the lint refused every exported topic;
    # now export starts the header with the pin the hunks are cut on
    assert f"`Cut-against:` header with {NEW}" in text
    from qwen38build.series.patchfile import PatchFile
    from qwen38build.workspace.workspace import export_topics

    done = export_topics(p.loaded(), ws)
    assert done.changed and "conflict-c" in done.unfinished
    for path in done.changed:
        assert PatchFile.parse(path).headers["Cut-against"].startswith(NEW), path


def moved_pins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Project:
    """a.py's lines 5 to 30 move, as they are, into a new file, planning.py; the patch
    changes line 10 of a.py."""
    lines = A.splitlines(keepends=True)
    kept = "".join([*lines[:4], "from vllm.planning import *\n", *lines[30:]])
    moved = "# split out of a.py\n" + "".join(lines[4:30])
    wheels = tmp_path / "wheels"
    old = make_wheel(wheels, PIN, {"__init__.py": "", "a.py": A})
    make_wheel(wheels, NEW, {"__init__.py": "", "a.py": kept, "planning.py": moved})
    p = make_project(tmp_path, old, ["edit-a"])
    monkeypatch.setenv("QWEN38BUILD_SOURCES", str(wheels))
    p.patch("patches", "edit-a", [("a.py", A, A.replace("a line 10\n", "a line 10 ours\n"))])
    return p


def test_a_hunk_whose_lines_moved_to_a_new_file_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = moved_pins(tmp_path, monkeypatch)
    report = bump.bump(p.loaded(), p.store, NEW)
    (got,) = report.patches
    assert got.outcome == "conflict"
    (h,) = got.failures
    # "a line 7" is line 4 of planning.py (a comment line, then a.py's lines 5 on)
    assert h.moved_to == "planning.py:4"
    assert f"its lines are now in planning.py:4, a file new in {NEW}" in h.note
    step = next_step(got, report.upstream_refs())
    assert step.endswith("→ moved upstream to planning.py")


def test_a_hunk_whose_lines_are_gone_is_not_said_to_have_moved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = two_pins(tmp_path, monkeypatch, ["conflict-c"])
    (got,) = bump.bump(p.loaded(), p.store, NEW).patches
    assert got.outcome == "conflict"
    assert [h.moved_to for h in got.failures] == [""]
    assert "moved upstream" not in next_step(got, {})


def test_a_real_bump_that_leaves_conflicts_says_it_moved_the_pin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The walk: `bump vllm X --rebase DIR` re-pinned recipe and lock, then ended with
    "some patches do not carry over" and exit 1, and nothing on screen said the pin moved."""
    p = two_pins(tmp_path, monkeypatch, ["conflict-c"])
    report = bump.bump(p.loaded(), p.store, NEW, dry_run=False)
    assert f'version = "{NEW}"' in (p.root / "recipe.toml").read_text()
    assert report.headline().endswith(
        f"(recipe.toml and lock/ now pin {NEW}; `build` needs every patch to apply)")
    dry = bump.bump(p.loaded(), p.store, NEW)  # now from NEW to NEW: nothing moves
    assert "dry run: recipe and lock untouched" in dry.headline()


def test_every_stop_of_the_carry_shows_the_base_of_its_conflicts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The walk: the first stop showed diff3 conflicts (with the base), but the stops that
    `git cherry-pick --continue` reached showed two sides only: the style was given to the
    first git command alone."""
    import subprocess

    p = two_pins(tmp_path, monkeypatch, ["conflict-c", "base-f"])
    ws = tmp_path / "ws"
    r = bump.bump(p.loaded(), p.store, NEW, rebase=ws).rebase
    assert r is not None and r.stopped_at == "conflict-c"
    assert "|||||||" in (ws / "vllm" / "c.py").read_text()
    (ws / "vllm" / "c.py").write_text(numbered("c").replace("c line 10\n", "c line 10 both\n"))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GIT_EDITOR": "true"}
    subprocess.run(["git", "add", "vllm/c.py"], cwd=ws, check=True, env=env)
    cont = subprocess.run(["git", "cherry-pick", "--continue"], cwd=ws, env=env, check=False,
                          capture_output=True, text=True)
    assert cont.returncode != 0 and "f.py" in cont.stdout + cont.stderr  # the next stop
    assert "|||||||" in (ws / "vllm" / "f.py").read_text()


def test_workspace_continue_says_at_every_stop_what_the_first_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The walk: only the carry's first stop printed the tool's guidance; the stops that
    `git cherry-pick --continue` reached showed git's own text. `workspace continue` goes on
    and says at the next stop which topic, which files and what to do; refuses while files
    are in conflict or where no carry is stopped; `--skip` leaves a topic for export to name."""
    import subprocess

    from qwen38build.cli import main

    p = two_pins(tmp_path, monkeypatch, ["conflict-c", "base-f"])
    ws = tmp_path / "ws"
    r = bump.bump(p.loaded(), p.store, NEW, rebase=ws).rebase
    assert r is not None and r.stopped_at == "conflict-c"
    recipe = ["--recipe", str(p.root / "recipe.toml")]
    capsys.readouterr()
    # still in conflict: refused, nothing run
    assert main([*recipe, "workspace", "continue", str(ws)]) == 2
    assert "still in conflict: vllm/c.py" in capsys.readouterr().err
    (ws / "vllm" / "c.py").write_text(numbered("c").replace("c line 10\n", "c line 10 both\n"))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    subprocess.run(["git", "add", "vllm/c.py"], cwd=ws, check=True, env=env)
    assert main([*recipe, "workspace", "continue", str(ws)]) == 1
    out = capsys.readouterr().out
    assert "stopped at topic base-f" in out and "conflicts in vllm/f.py" in out
    assert f"`qwen38build workspace continue {ws}`" in out
    subject = subprocess.run(["git", "log", "-1", "--format=%s", "HEAD"], cwd=ws, env=env,
                             check=True, capture_output=True, text=True).stdout.strip()
    assert subject == "[qwen38] conflict-c"  # the topic's own message, no editor
    assert main([*recipe, "workspace", "continue", str(ws), "--skip"]) == 0
    assert "carries every topic" in capsys.readouterr().out
    assert main([*recipe, "workspace", "continue", str(ws)]) == 2
    assert "no carry is stopped here" in capsys.readouterr().err


def test_a_skipped_topic_the_new_pin_carries_can_be_retired_and_export_says_how(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The walk of 0.33.0: vllm-pr61050-lru-running-prefix stopped the carry as a conflict
    whose upstream diff makes the same change (0.33.0's LRU ranks a running request's
    chunks tail first), so it was skipped; then `export` said only "finish them in the
    workspace", with no way back to the skipped commit, and nothing retires a topic the
    labels did not call upstreamed (`bump --retire` takes likely-upstreamed ones only)."""
    import subprocess

    from qwen38build.cli import main
    from qwen38build.inputs import recipe

    p = two_pins(tmp_path, monkeypatch, ["clean-a", "conflict-c", "offset-b"])
    (p.root / "PATCHES.md").write_text("# Ledger\n\n<!-- table:begin -->\n"
                                       "<!-- table:end -->\n")
    ws = tmp_path / "ws"
    report = bump.bump(p.loaded(), p.store, NEW, rebase=ws, dry_run=False)
    screen = report.to_screen()
    assert "its commit stays on branch qwen38, and export names it" in screen
    assert "`qwen38build retire TOPIC --why '...'`" in screen
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GIT_EDITOR": "true"}
    old = subprocess.run(["git", "rev-parse", "CHERRY_PICK_HEAD"], cwd=ws, env=env,
                         check=True, capture_output=True, text=True).stdout.strip()
    subprocess.run(["git", "cherry-pick", "--skip"], cwd=ws, env=env, check=True,
                   capture_output=True)
    common = ["--recipe", str(p.root / "recipe.toml"), "--store", str(p.store_root)]
    capsys.readouterr()
    assert main([*common, "export", str(ws)]) == 1
    err = capsys.readouterr().err
    assert "no commit in" in err and "conflict-c" in err
    assert f"`git -C {ws} cherry-pick {old[:12]}` carries conflict-c's commit again" in err
    assert "`qwen38build retire TOPIC --why '...'`" in err
    why = "upstream's diff U1 makes the same change"
    (p.root / "tests" / "patches").mkdir(parents=True)
    (p.root / "tests" / "patches" / "test_conflict_c.py").write_text("")
    assert main([*common, "retire", "conflict-c", "--why", why]) == 0
    out = capsys.readouterr().out
    assert "deleted patches/conflict-c.patch" in out and f"Retired at {NEW}" in out
    assert "behaviour tests still stand" in out and "tests/patches/test_conflict_c.py" in out
    loaded = recipe.load(p.root / "recipe.toml")
    assert "conflict-c" in loaded.recipe.series.retired
    assert "conflict-c" not in [e.topic for e in loaded.series_entries()]
    assert not (p.root / "patches" / "conflict-c.patch").exists()
    ledger = (p.root / "PATCHES.md").read_text()
    assert f"Retired at {NEW} and removed from the tree: `conflict-c` ({why})" in ledger
    assert main([*common, "export", str(ws)]) == 0  # nothing left unfinished


def test_retire_names_an_unknown_topic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from qwen38build.cli import main

    p = two_pins(tmp_path, monkeypatch, ["clean-a"])
    common = ["--recipe", str(p.root / "recipe.toml"), "--store", str(p.store_root)]
    before = (p.root / "recipe.toml").read_bytes()
    assert main([*common, "retire", "no-such", "--why", "x"]) == 2
    assert "no series entry no-such" in capsys.readouterr().err
    assert (p.root / "recipe.toml").read_bytes() == before
