"""bump: every outcome on a tiny two-pin series, and the real 0.32.0 → 0.33.0 bump."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from qwen38build.bump import bump
from qwen38build.bump import report as bumpreport
from qwen38build.engine.fetch import wheel_in_store
from qwen38build.inputs import lock, recipe
from qwen38build.series.patchfile import PatchFile
from qwen38build.store.store import Store
from qwen38build.workspace import gitrepo, workspace
from tests.bump_fixtures import NEW, PIN, Project, make_project, make_wheel, numbered

REPO = Path(__file__).resolve().parents[1]
A, B, C, D, E, F = (numbered(x) for x in "abcdef")


def sub(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new, 1)


A1 = sub(A, "a line 10\n", "a line 10 ours\n")  # clean-a
F6 = sub(sub(F, "f line 5\n", "f line 5 ours\n"),
         "f line 20\n", "f line 20\nfrom base-f 1\nfrom base-f 2\nfrom base-f 3\n")
OLD = {"a.py": A, "b.py": B, "c.py": C, "d.py": D, "e.py": E, "f.py": F}
NEW_FILES = {
    "a.py": A,  # unchanged: clean
    "b.py": "".join(f"new top {i}\n" for i in range(5)) + B,  # five lines above: offset +5
    "c.py": sub(C, "c line 10\n", "c line 10 upstream\n"),  # same line changed: conflict
    "d.py": sub(D, "d line 10\n", "d line 10 fixed\n"),  # the patch itself: upstreamed
    "moved/e.py": E,  # e.py moved: deleted
    "f.py": sub(F, "f line 5\n", "f line 5 upstream\n"),  # base-f conflicts, on-f depends
}
SERIES = ["clean-a", "on-clean-a", "offset-b", "conflict-c", "upstreamed-d", "deleted-e",
          "base-f", "on-f"]


def two_pins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, series: list[str]) -> Project:
    wheels = tmp_path / "wheels"
    old = make_wheel(wheels, PIN, {"__init__.py": "", **OLD})
    make_wheel(wheels, NEW, {"__init__.py": "", **NEW_FILES})
    p = make_project(tmp_path, old, series)
    monkeypatch.setenv("QWEN38BUILD_SOURCES", str(wheels))
    diffs = {
        "clean-a": [("a.py", A, A1)],
        # cut on top of clean-a: its context holds clean-a's line
        "on-clean-a": [("a.py", A1, sub(A1, "a line 12\n", "a line 12 ours\n"))],
        "offset-b": [("b.py", B, sub(B, "b line 10\n", "b line 10 ours\n"))],
        "conflict-c": [("c.py", C, sub(C, "c line 10\n", "c line 10 ours\n"))],
        "upstreamed-d": [("d.py", D, sub(D, "d line 10\n", "d line 10 fixed\n"))],
        "deleted-e": [("e.py", E, sub(E, "e line 10\n", "e line 10 ours\n"))],
        "base-f": [("f.py", F, F6)],
        "on-f": [("f.py", F6, sub(F6, "from base-f 2\n", "from base-f 2 tuned\n"))],
    }
    for topic in series:
        p.patch("patches", topic, diffs[topic])
    return p


@pytest.fixture
def pins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Project:
    return two_pins(tmp_path, monkeypatch, SERIES)


def by_patch(report: bumpreport.BumpReport) -> dict[str, bumpreport.PatchReport]:
    return {p.patch: p for p in report.patches}


def test_every_outcome_is_told_apart(pins: Project) -> None:
    report = bump.bump(pins.loaded(), pins.store, NEW)
    got = by_patch(report)
    assert {k: v.outcome for k, v in got.items()} == {
        "clean-a": "clean",
        "on-clean-a": "clean",
        "offset-b": "offset",
        "conflict-c": "conflict",
        "upstreamed-d": "upstreamed",
        "deleted-e": "deleted",
        "base-f": "conflict",
        "on-f": "depends-on-failed",
    }
    assert not report.ok
    assert got["offset-b"].offsets == (bumpreport.HunkOffset("b.py", 1, 12, 5),)
    (c,) = got["conflict-c"].failures
    assert (c.file, c.hunk) == ("c.py", 1)
    assert "-c line 10\n+c line 10 upstream" in c.upstream_diff
    assert c.upstream_diff.startswith(f"--- a/c.py ({PIN})\n+++ b/c.py ({NEW})\n")
    assert got["deleted-e"].deleted == ("e.py",)
    assert got["deleted-e"].moved_to == {"e.py": ["moved/e.py"]}
    (f5,) = got["base-f"].failures  # only the hunk upstream touched fails
    assert "-f line 5\n+f line 5 upstream" in f5.upstream_diff
    assert got["on-f"].depends_on == ("base-f",)
    assert "its context came from base-f" in got["on-f"].failures[0].note


def test_all_applying_series_is_ok_and_dry_run_touches_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = two_pins(tmp_path, monkeypatch, ["clean-a", "on-clean-a", "offset-b"])
    recipe_before = (p.root / "recipe.toml").read_bytes()
    lock_before = (p.root / "lock" / "sources.json").read_bytes()
    report = bump.bump(p.loaded(), p.store, NEW, dry_run=True)
    assert report.ok
    assert (p.root / "recipe.toml").read_bytes() == recipe_before
    assert (p.root / "lock" / "sources.json").read_bytes() == lock_before


def test_report_renders_as_markdown_and_json(pins: Project) -> None:
    report = bump.bump(pins.loaded(), pins.store, NEW)
    md = report.to_markdown()
    assert "| 3 | offset-b | offset | b.py #1 +5 |" in md
    assert "| 6 | deleted-e | deleted | e.py gone (moved to moved/e.py?) |" in md
    assert "| 8 | on-f | depends-on-failed | stands on base-f |" in md
    assert "```diff\n--- a/c.py" in md
    data = json.loads(json.dumps(report.to_json()))
    assert data["ok"] is False and data["to"] == NEW
    assert [x["outcome"] for x in data["patches"]][:3] == ["clean", "clean", "offset"]
    assert data["wheel"]["version"] == NEW


def test_bump_repins_recipe_keeping_layout_and_rewrites_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = two_pins(tmp_path, monkeypatch, ["clean-a"])
    before = (p.root / "recipe.toml").read_text()
    report = bump.bump(p.loaded(), p.store, NEW, dry_run=False)
    assert report.ok
    after = (p.root / "recipe.toml").read_text()
    assert after == before.replace(f'version = "{PIN}"   # the pin', f'version = "{NEW}"   # the pin')
    locked = lock.read(p.root)["vllm"]
    wheel = p.wheels / f"vllm-{NEW}-cp38-abi3-manylinux_2_28_x86_64.whl"
    assert (locked.version, locked.filename, locked.size) == (NEW, wheel.name, wheel.stat().st_size)
    import hashlib

    assert locked.sha256 == hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert recipe.load(p.root / "recipe.toml").recipe.vllm.version == NEW


def test_new_wheel_found_in_store_needs_no_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = two_pins(tmp_path, monkeypatch, ["clean-a"])
    first = bump.bump(p.loaded(), p.store, NEW)
    monkeypatch.setenv("QWEN38BUILD_SOURCES", str(tmp_path / "nowhere"))
    second = bump.bump(p.loaded(), p.store, NEW)
    assert second.wheel == first.wheel


def test_rebase_carries_the_workspace_and_export_gives_patches_for_the_new_pin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = two_pins(tmp_path, monkeypatch, ["clean-a", "offset-b", "upstreamed-d"])
    ws = tmp_path / "ws"
    report = bump.bump(p.loaded(), p.store, NEW, dry_run=False, rebase=ws)
    assert report.rebase is not None and report.rebase.ok
    assert report.rebase.done == ("clean-a", "offset-b", "upstreamed-d")
    assert report.rebase.empty == ("upstreamed-d",)
    assert gitrepo.git(ws, "rev-parse", "--abbrev-ref", "HEAD").strip() == f"qwen38-{NEW}"
    loaded = recipe.load(p.root / "recipe.toml")
    offset_b = p.root / "patches" / "offset-b.patch"
    clean_a = p.root / "patches" / "clean-a.patch"
    written = workspace.export(loaded, ws, ["clean-a", "offset-b"])
    # clean-a's diff is the same text on the new pin; only its Cut-against header moves
    assert written == [clean_a, offset_b]
    assert f"\nCut-against: {NEW}\n" in clean_a.read_text()
    assert "@@ -12,7 +12,7 @@" in offset_b.read_text()
    # the exported series now applies to the new pin without offsets
    again = by_patch(bump.bump(loaded, p.store, NEW))
    assert again["offset-b"].outcome == "clean"


def test_rebase_stops_at_a_conflict_naming_topic_and_file(pins: Project, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    report = bump.bump(pins.loaded(), pins.store, NEW, rebase=ws)
    r = report.rebase
    assert r is not None and not r.ok
    assert r.stopped_at == "conflict-c" and r.conflict_files == ("vllm/c.py",)
    assert r.done == ("clean-a", "on-clean-a", "offset-b")
    assert "stopped at topic conflict-c" in report.to_markdown()
    assert (ws / ".git" / "CHERRY_PICK_HEAD").exists()


# -- the real thing ---------------------------------------------------------------------


def gnu_patch(tree: Path, patch: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["patch", "-p1", "--fuzz", "0", "--batch", "--no-backup-if-mismatch",
         "--reject-file=-", "-d", str(tree), "-i", str(patch), *extra],
        capture_output=True, text=True, check=False, env={"PATH": os.environ["PATH"], "LC_ALL": "C"},
    )


@pytest.mark.e2e
@pytest.mark.slow
def test_real_bump_to_0_33_0_agrees_with_gnu_patch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The project's series, 0.32.0 → 0.33.0, dry run; each outcome checked with GNU patch
    (forward at fuzz 0, and -R --dry-run) on the same tree, built here independently."""
    sources = [d for d in ("/tmp/wh", "/tmp/wh33") if Path(d).is_dir()]
    if sources:
        monkeypatch.setenv("QWEN38BUILD_SOURCES", ":".join(sources))
    from qwen38build.store.store import default_root

    loaded = recipe.load(REPO / "recipe.toml")
    if loaded.recipe.vllm.version != "0.32.0":
        pytest.skip(f"the pin is {loaded.recipe.vllm.version} now, not 0.32.0")
    recipe_before = (REPO / "recipe.toml").read_bytes()
    store = Store(default_root())
    report = bump.bump(loaded, store, "0.33.0", dry_run=True)
    assert (REPO / "recipe.toml").read_bytes() == recipe_before
    new_wheel, _ = bump.resolve_wheel(loaded, store, "0.33.0")
    wheel = wheel_in_store(loaded, store, new_wheel)
    entries = loaded.series_entries()
    tree = tmp_path / "tree"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for e in entries:
            for rel in PatchFile.parse(e.path).touched_paths:
                if f"vllm/{rel}" in names and not (tree / rel).exists():
                    (tree / rel).parent.mkdir(parents=True, exist_ok=True)
                    (tree / rel).write_bytes(z.read(f"vllm/{rel}"))
    assert [p.patch for p in report.patches] == [e.row_name for e in entries]
    for entry, got in zip(entries, report.patches, strict=True):
        forward = gnu_patch(tree, entry.path, "--forward", "--dry-run")
        backward = gnu_patch(tree, entry.path, "-R", "--dry-run")
        where = f"{entry.row_name}: {got.outcome}\n{forward.stdout}"
        if got.outcome in ("clean", "offset"):
            assert forward.returncode == 0, where
            assert ("offset" in forward.stdout) == (got.outcome == "offset"), where
            assert gnu_patch(tree, entry.path, "--forward").returncode == 0
        elif got.outcome == "upstreamed":
            assert forward.returncode != 0 and backward.returncode == 0, where
        else:
            assert forward.returncode != 0 and backward.returncode != 0, where
        if got.outcome == "deleted":
            assert all(f"vllm/{f}" not in names for f in got.deleted)
        if got.outcome == "depends-on-failed":
            failed = {p.patch for p in report.patches if p.outcome in bumpreport.FAILED}
            assert set(got.depends_on) <= failed
    print(report.to_markdown())
    shutil.rmtree(tree)


# -- upstreamed in other words, and whose context it is ----------------------------------

SERVE = """\
import logging

logger = logging.getLogger(__name__)


def serve(requests, limit):
    done = 0
    for r in requests:
        r.run()
        done += 1
    return done


def stop():
    return None
"""


def custom_pins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, old: str, new: str,
                patches: dict[str, tuple[str, str]]) -> Project:
    """Pins whose serve.py is ``old`` and ``new``; each patch (old text, new text) of it."""
    wheels = tmp_path / "wheels"
    wheel = make_wheel(wheels, PIN, {"__init__.py": "", "serve.py": old})
    make_wheel(wheels, NEW, {"__init__.py": "", "serve.py": new})
    p = make_project(tmp_path, wheel, list(patches))
    monkeypatch.setenv("QWEN38BUILD_SOURCES", str(wheels))
    for topic, (before, after) in patches.items():
        p.patch("patches", topic, [("serve.py", before, after)])
    return p


OURS = sub(SERVE, "        done += 1\n",
           "        done += 1\n        if done >= limit:\n"
           "            logger.warning(\"request limit %d reached, stopping\", limit)\n"
           "            break\n")


@pytest.mark.parametrize("upstream, how", [
    # the same check, the variable and the message in other words
    (sub(SERVE, "        done += 1\n",
         "        done += 1\n        if done >= cap:\n"
         "            logger.warning(\"request cap %d reached, stopping\", cap)\n"
         "            break\n").replace("def serve(requests, limit):", "def serve(requests, cap):"),
     "similarity"),
    # the same lines (quoted otherwise), moved into the loop's head
    (sub(SERVE, "    for r in requests:\n",
         "    for r in requests:\n        if done >= limit:\n"
         "            logger.warning('request limit %d reached, stopping', limit)\n"
         "            break\n"),
     "contained"),
])
def test_change_made_upstream_in_other_words_is_likely_upstreamed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, upstream: str, how: str
) -> None:
    p = custom_pins(tmp_path, monkeypatch, SERVE, upstream, {"limit": (SERVE, OURS)})
    report = bump.bump(p.loaded(), p.store, NEW)
    (got,) = report.patches
    assert got.outcome == "likely-upstreamed", got
    (h,) = got.failures
    assert h.similarity is not None
    if how == "similarity":
        assert h.similarity >= 0.75 and "similarity" in h.evidence
    else:
        assert h.evidence == "its added lines are all in the upstream diff"
    assert h.side_by_side.splitlines()[0].startswith("ours ")
    md = report.to_markdown()
    assert "| 1 | limit | likely-upstreamed |" in md
    assert f"similarity {h.similarity:.2f} (threshold 0.75)" in md
    assert "Retire candidates: limit." in md


def test_a_different_change_to_the_same_lines_stays_a_conflict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream = sub(SERVE, "        done += 1\n", "        done += r.weight\n")
    p = custom_pins(tmp_path, monkeypatch, SERVE, upstream, {"limit": (SERVE, OURS)})
    (got,) = bump.bump(p.loaded(), p.store, NEW).patches
    assert got.outcome == "conflict"
    (h,) = got.failures
    assert h.evidence == "" and h.similarity is not None and h.similarity < 0.75


DTYPES = """\
import torch

STR_DTYPE = {
    "float32": torch.float32,
    "half": torch.half,
    "fp8": torch.uint8,
}
"""


@pytest.mark.parametrize("ours, theirs", [
    ('    "kvarn_int4": torch.uint8,\n', '    "ultraquant_4bit": torch.uint8,\n'),  # keys
    ('    "kvarn": "int4",\n', '    "kvarn": "int8",\n'),  # string values
])
def test_lines_differing_only_in_a_string_are_not_a_match(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ours: str, theirs: str
) -> None:
    """Upstream added its own entry where ours goes: the code of the two lines is the same,
    their strings are not, so it is a conflict and never a retire candidate."""
    from qwen38build.series import upstreamed

    anchor = '    "fp8": torch.uint8,\n'
    p = custom_pins(tmp_path, monkeypatch, DTYPES, sub(DTYPES, anchor, anchor + theirs),
                    {"kvarn-dtype": (DTYPES, sub(DTYPES, anchor, anchor + ours))})
    (got,) = bump.bump(p.loaded(), p.store, NEW).patches
    assert got.outcome == "conflict", got
    (h,) = got.failures
    assert h.evidence == "" and h.similarity is not None and h.similarity < 0.75
    assert upstreamed.similarity(([], [ours]), ([], [theirs])) < upstreamed.THRESHOLD
    # the same line, quoted and spaced otherwise, still is one
    assert upstreamed.skeleton(ours) == upstreamed.skeleton(ours.replace('"', "'") + "  ")


def test_reindented_region_is_a_conflict_of_its_own_not_depends_on_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """base adds a line that on-base's hunk stands on; upstream re-indents the whole loop,
    so on-base's own context is gone too: re-cutting base alone would not fix it."""
    base = sub(SERVE, "        r.run()\n", "        r.prepare()\n        r.run()\n")
    on_base = sub(base, "        done += 1\n", "        done += 2\n")
    upstream = sub(SERVE, "    for r in requests:\n        r.run()\n        done += 1\n",
                   "    with logging_context():\n        for r in requests:\n"
                   "            r.run()\n            done += 1\n")
    p = custom_pins(tmp_path, monkeypatch, SERVE, upstream,
                    {"base": (SERVE, base), "on-base": (base, on_base)})
    got = by_patch(bump.bump(p.loaded(), p.store, NEW))
    assert got["base"].outcome == "conflict"
    assert got["on-base"].outcome == "conflict"
    (h,) = got["on-base"].failures
    assert h.depends_on == ()
    assert "its own context lines are gone from the new pin" in h.note
    assert "+            done += 1" in h.upstream_diff


def test_context_missing_only_by_the_earlier_patch_is_depends_on_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = sub(SERVE, "        r.run()\n", "        r.prepare()\n        r.run()\n")
    on_base = sub(base, "        done += 1\n", "        done += 2\n")
    upstream = sub(SERVE, "    done = 0\n", "    done = 0  # counted\n")  # base's context only
    p = custom_pins(tmp_path, monkeypatch, SERVE, upstream,
                    {"base": (SERVE, base), "on-base": (base, on_base)})
    got = by_patch(bump.bump(p.loaded(), p.store, NEW))
    assert got["base"].outcome == "conflict"
    assert got["on-base"].outcome == "depends-on-failed"
    assert got["on-base"].depends_on == ("base",)


def test_retire_moves_the_topic_to_retired_and_keeps_its_prose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from qwen38build.lint import lint
    from qwen38build.series import table

    upstream = sub(SERVE, "    for r in requests:\n",
                   "    for r in requests:\n        if done >= limit:\n"
                   "            logger.warning('request limit %d reached, stopping', limit)\n"
                   "            break\n")
    p = custom_pins(tmp_path, monkeypatch, SERVE, upstream,
                    {"limit": (SERVE, OURS), "other": (SERVE, sub(SERVE, "    return None\n",
                                                                   "    return 0\n"))})
    md = p.root / "PATCHES.md"
    md.write_text("# Ledger\n\n<!-- table:begin -->\n<!-- table:end -->\n\nRetired earlier: x.\n")
    table.write(p.loaded(), md)
    assert "| limit |" in md.read_text()
    report = bump.bump(p.loaded(), p.store, NEW, dry_run=False, retire=True)
    assert report.retired == ("limit",)
    loaded = recipe.load(p.root / "recipe.toml")
    assert loaded.recipe.series.retired == ["old-topic", "limit"]
    assert [e.row_name for e in loaded.series_entries()] == ["other"]
    assert not (p.root / "patches" / "limit.patch").exists()
    text = md.read_text()
    assert "| limit |" not in text and "| other |" in text
    sim = report.patches[0].failures[0].similarity
    assert text.endswith(
        f"Retired earlier: x.\n\nRetired at {NEW} and removed from the tree: `limit` "
        f"(likely-upstreamed in {NEW}: serve.py #1: its added lines are all in the upstream "
        f"diff (similarity {sim:.2f}): retire candidate). It did: limit does a thing. Why limit is right: a "
        "paragraph of prose. # a line that starts like a comment stays in the body\n"
    )
    assert [f for f in lint.check(lint.load_for_lint(p.root / "recipe.toml"))
            if f.rule == "series"] == []
    assert "Retired: limit" in report.to_markdown()


def test_cli_retire_refuses_dry_run_and_retires_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from qwen38build.cli import main

    upstream = sub(SERVE, "    for r in requests:\n",
                   "    for r in requests:\n        if done >= limit:\n"
                   "            logger.warning('request limit %d reached, stopping', limit)\n"
                   "            break\n")
    p = custom_pins(tmp_path, monkeypatch, SERVE, upstream, {"limit": (SERVE, OURS)})
    common = ["--recipe", str(p.root / "recipe.toml"), "--store", str(p.store_root)]
    before = (p.root / "recipe.toml").read_bytes()
    assert main([*common, "bump", "vllm", NEW, "--dry-run", "--retire"]) == 2
    assert "--retire changes the recipe" in capsys.readouterr().err
    assert (p.root / "recipe.toml").read_bytes() == before
    assert main([*common, "bump", "vllm", NEW, "--dry-run"]) == 1
    assert "Retire candidates: limit." in capsys.readouterr().out
    assert main([*common, "bump", "vllm", NEW, "--retire"]) == 0  # the one failure retired
    assert "Retired: limit" in capsys.readouterr().out
    assert recipe.load(p.root / "recipe.toml").recipe.series.retired == ["old-topic", "limit"]


def test_rebase_with_retire_does_not_carry_the_retired_topics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream = sub(SERVE, "    for r in requests:\n",
                   "    for r in requests:\n        if done >= limit:\n"
                   "            logger.warning('request limit %d reached, stopping', limit)\n"
                   "            break\n")
    p = custom_pins(tmp_path, monkeypatch, SERVE, upstream,
                    {"limit": (SERVE, OURS), "other": (OURS, sub(OURS, "    return None\n",
                                                                  "    return 0\n"))})
    ws = tmp_path / "ws"
    # Without --retire git's 3-way merge carries it cleanly: a second copy of the check.
    plain = bump.bump(p.loaded(), p.store, NEW, rebase=ws)
    assert plain.rebase is not None and plain.rebase.done == ("limit", "other")
    shutil.rmtree(ws)
    report = bump.bump(p.loaded(), p.store, NEW, dry_run=False, rebase=ws, retire=True)
    r = report.rebase
    assert r is not None and r.ok, report.to_markdown()
    assert (r.done, r.skipped) == (("other",), ("limit",))
    assert report.retired == ("limit",) and report.ok
    assert "Not carried (retired): limit." in report.to_markdown()


def test_a_pin_edited_by_hand_points_the_build_to_bump_which_moves_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from qwen38build.cli import main

    p = two_pins(tmp_path, monkeypatch, ["clean-a", "offset-b"])
    common = ["--recipe", str(p.root / "recipe.toml"), "--store", str(p.store_root)]
    text = (p.root / "recipe.toml").read_text()
    (p.root / "recipe.toml").write_text(sub(text, f'version = "{PIN}"', f'version = "{NEW}"'))
    assert main([*common, "build", "--no-link", "-q"]) == 2
    err = capsys.readouterr().err
    assert f"run `qwen38build bump vllm {NEW}` to move the pin from {PIN}" in err
    assert "qwen38build lock" not in err
    # The hint works as given: bump moves from the locked pin to the edited one.
    assert main([*common, "bump", "vllm", NEW, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"{PIN} → {NEW}" in out or f"{PIN} -> {NEW}" in out, out[:400]
    assert lock.read(p.root)["vllm"].version == PIN
    assert main([*common, "bump", "vllm", NEW]) == 0
    capsys.readouterr()
    assert lock.read(p.root)["vllm"].version == NEW
    # recipe and lock agree again (this fixture's new wheel lacks envs.py, so no build)
    lock.locked_vllm(recipe.load(p.root / "recipe.toml"), lock.read(p.root))


def test_the_carry_leaves_git_usable_with_a_fresh_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = two_pins(tmp_path, monkeypatch, ["clean-a", "conflict-c"])
    ws = tmp_path / "ws"
    report = bump.bump(p.loaded(), p.store, NEW, rebase=ws)
    assert report.rebase is not None and report.rebase.stopped_at == "conflict-c"
    (ws / "vllm" / "c.py").write_text(sub(C, "c line 10\n", "c line 10 upstream ours\n"))
    home = tmp_path / "fresh-home"  # no ~/.gitconfig: no identity but the repository's
    home.mkdir()
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_EDITOR": "true", "LC_ALL": "C"}

    def user_git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", *args], cwd=ws, env=env, capture_output=True, text=True,
                              check=False)

    assert user_git("add", "vllm/c.py").returncode == 0
    done = user_git("cherry-pick", "--continue")
    assert done.returncode == 0, done.stderr
    assert user_git("log", "-1", "--format=%s").stdout.strip().endswith("conflict-c")


def test_dry_run_prints_a_screen_of_next_steps_and_writes_each_upstream_diff_once(
    pins: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str]
) -> None:
    from qwen38build.cli import main

    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    common = ["--recipe", str(pins.root / "recipe.toml"), "--store", str(pins.store_root)]
    assert main([*common, "bump", "vllm", NEW, "--dry-run"]) == 1
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "```" not in out and len(lines) < 30, out
    row = {ln.split()[1]: ln.split(None, 3)[3] for ln in lines
           if ln[:3].strip().isdigit() and len(ln.split()) > 3}
    assert row["clean-a"] == "nothing"
    assert row["offset-b"] == "re-cut at offset: b.py #1 +5"
    assert row["conflict-c"].startswith("rebase this hunk: c.py #1@")
    assert row["upstreamed-d"].startswith("retire (`--retire`)")
    assert row["deleted-e"].startswith("carry its hunks: e.py gone (moved to moved/e.py?)")
    assert row["on-f"] == "fix base-f first, then rebase it on that"
    assert any(ln.split()[:2] == ["conflict", "2"] for ln in lines)  # the summary table
    assert any(ln.startswith(f"Next: `qwen38build bump vllm {NEW} --rebase DIR`") for ln in lines)
    (shown,) = [ln for ln in lines if ln.startswith("Full report (")]
    path = Path(shown.rsplit(": ", 1)[1])
    assert path == home / ".cache" / "qwen38build" / "reports" / f"bump-{PIN}-{NEW}.md"
    md = path.read_text()
    assert f"Full report ({md.count(chr(10))} lines" in shown
    assert "| 3 | offset-b | offset | b.py #1 +5 | re-cut at offset: b.py #1 +5 |" in md
    # --report FILE puts it there instead
    mine = tmp_path / "mine.md"
    assert main([*common, "bump", "vllm", NEW, "--dry-run", "--report", str(mine)]) == 1
    assert capsys.readouterr().out.rstrip().endswith(str(mine)) and mine.read_text() == md


def test_an_upstream_diff_two_hunks_need_is_in_the_report_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    g = numbered("g", 40)
    upstream = sub(sub(g, "g line 15\n", "g line 15 upstream\n"),
                   "g line 21\n", "g line 21 upstream\n")  # one upstream hunk
    p = custom_pins(tmp_path, monkeypatch, g, upstream, {
        "near-15": (g, sub(g, "g line 14\n", "g line 14 ours\n")),
        "near-21": (g, sub(g, "g line 22\n", "g line 22 ours\n")),
    })
    report = bump.bump(p.loaded(), p.store, NEW)
    assert [x.outcome for x in report.patches] == ["conflict", "conflict"]
    md = report.to_markdown()
    assert md.count("+g line 21 upstream") == 1  # the diff, once
    assert md.count("upstream's change here: [U1](#u1)") == 2  # linked from both hunks
    assert '<a id="u1"></a>' in md and "[U2]" not in md
    screen = report.to_screen("r.md")
    assert "rebase this hunk: serve.py #1@" in screen and "(U1)" in screen
    assert "```" not in screen
