"""The series' trial kept in the store (:mod:`qwen38build.bump.kept`): a second dry run
takes it and says the same, and a change of any input it is made from makes it again."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from qwen38build import proc
from qwen38build.bump import bump, kept, trial
from qwen38build.bump.report import PatchReport
from qwen38build.cli import version
from tests.bump_fixtures import NEW, Project
from tests.test_bump import SERIES, two_pins


@pytest.fixture
def pins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Project:
    return two_pins(tmp_path, monkeypatch, SERIES)


def kept_files(p: Project) -> list[Path]:
    folder = p.store_root / kept.FOLDER
    return sorted(folder.iterdir()) if folder.is_dir() else []


def test_a_second_bump_takes_the_kept_trial_and_says_the_same(
    pins: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = bump.bump(pins.loaded(), pins.store, NEW)
    assert len(kept_files(pins)) == 1
    # every outcome of the fixture is in what is kept, failures and offsets included
    assert {r.outcome for r in first.patches} >= {"clean", "offset", "conflict",
                                                   "upstreamed", "deleted",
                                                   "depends-on-failed"}

    def no_patch(*args: object, **kw: object) -> object:
        raise AssertionError("GNU patch ran: the kept trial was not taken")

    monkeypatch.setattr(trial, "run_patch", no_patch)
    second = bump.bump(pins.loaded(), pins.store, NEW)
    assert second.patches == first.patches
    assert second.to_markdown() == first.to_markdown()
    assert second.to_screen("r.md") == first.to_screen("r.md")


def counting(p: Project) -> tuple[Callable[[], tuple[list[PatchReport], bool]], list[int]]:
    """A trial of ``p``'s series to 0.2.0, and the count of times it was really made."""
    made: list[int] = []

    def compute() -> list[PatchReport]:
        made.append(1)
        return [PatchReport("t", "patches/t.patch", "clean")]

    def again() -> tuple[list[PatchReport], bool]:
        return kept.trial(p.loaded(), p.store, ("1" * 64, "2" * 64), ("0.1.0", NEW), compute)

    return again, made


def _edit_patch(p: Project, mp: pytest.MonkeyPatch) -> None:
    f = p.root / "patches" / "conflict-c.patch"
    f.write_bytes(f.read_bytes().replace(b"c line 10 ours", b"c line 10 OURS"))


def _reorder(p: Project, mp: pytest.MonkeyPatch) -> None:
    f = p.root / "recipe.toml"
    text = f.read_text()
    assert text.count('"offset-b.patch"') == 1 and text.count('"conflict-c.patch"') == 1
    f.write_text(text.replace('"offset-b.patch"', '"TMP"').replace(
        '"conflict-c.patch"', '"offset-b.patch"').replace('"TMP"', '"conflict-c.patch"'))


def _gnu_patch(p: Project, mp: pytest.MonkeyPatch) -> None:
    real = proc.run

    def other(args: list[str], **kw: object) -> proc.Result:
        got = real(args, **kw)  # type: ignore[arg-type]
        if Path(str(args[0])).name == "patch" and args[1:] == ["--version"]:
            return proc.Result(got.args, 0, "GNU patch 2.8\n", "")
        return got

    mp.setattr(proc, "run", other)


def _gnu_diff(p: Project, mp: pytest.MonkeyPatch) -> None:
    real = proc.run

    def other(args: list[str], **kw: object) -> proc.Result:
        got = real(args, **kw)  # type: ignore[arg-type]
        if list(args) == ["diff", "--version"]:
            return proc.Result(got.args, 0, "diff (GNU diffutils) 3.12\n", "")
        return got

    mp.setattr(proc, "run", other)


def _python(p: Project, mp: pytest.MonkeyPatch) -> None:
    mp.setattr(sys, "version", sys.version + " (another build)")


def _tool(p: Project, mp: pytest.MonkeyPatch) -> None:
    digest = version.package_digest()
    mp.setattr(version, "package_digest", lambda: "0" * 64 if digest != "0" * 64 else "1" * 64)


@pytest.mark.parametrize("change", [_edit_patch, _reorder, _gnu_patch, _gnu_diff, _python,
                                    _tool], ids=lambda f: f.__name__.strip("_"))
def test_a_change_of_any_input_makes_the_trial_again(
    pins: Project, monkeypatch: pytest.MonkeyPatch,
    change: Callable[[Project, pytest.MonkeyPatch], None],
) -> None:
    again, made = counting(pins)
    assert again()[1] is False and again()[1] is True and len(made) == 1
    change(pins, monkeypatch)
    assert again()[1] is False and len(made) == 2  # a miss: made again
    assert again()[1] is True and len(made) == 2  # and kept under its own key
    assert len(kept_files(pins)) == 2


@pytest.mark.parametrize("which", ["old wheel", "new wheel", "old version", "new version"])
def test_the_wheels_and_versions_are_in_the_key(pins: Project, which: str) -> None:
    loaded = pins.loaded()
    shas, versions = ["1" * 64, "2" * 64], ["0.1.0", NEW]
    base = kept.key(kept.inputs(loaded, (shas[0], shas[1]), (versions[0], versions[1])))
    if which.endswith("wheel"):
        shas[which.startswith("new")] = "3" * 64
    else:
        versions[which.startswith("new")] = "0.3.0"
    assert kept.key(kept.inputs(loaded, (shas[0], shas[1]), (versions[0], versions[1]))) != base


def test_a_renamed_row_is_in_the_key(pins: Project) -> None:
    """The row name and the file the report names are kept: a patch moved to another file
    with the same bytes is another trial."""
    made_from = kept.inputs(pins.loaded(), ("1" * 64, "2" * 64), ("0.1.0", NEW))
    names = [(row, file) for row, file, _ in made_from["patches"]]
    assert ("conflict-c", "patches/conflict-c.patch") in names


def test_a_kept_trial_that_is_damaged_or_not_its_own_is_made_again(
    pins: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = bump.bump(pins.loaded(), pins.store, NEW)
    tried: list[int] = []
    real = trial.try_series

    def counted(*args: object) -> list[PatchReport]:
        tried.append(1)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(bump, "try_series", counted)
    (path,) = kept_files(pins)
    data = json.loads(path.read_bytes())
    for damage in (b"{not json", json.dumps({**data, "inputs": {}}).encode(),
                   json.dumps({**data, "patches": [{"patch": "x"}]}).encode(),
                   json.dumps({**data, "patches": [{**data["patches"][0], "extra": 1}]}
                              ).encode()):
        path.chmod(0o644)
        path.write_bytes(damage)
        got = bump.bump(pins.loaded(), pins.store, NEW)
        assert tried == [1]  # made again
        tried.clear()
        assert got.patches == first.patches
        assert json.loads(path.read_bytes()) == data  # written again whole
    bump.bump(pins.loaded(), pins.store, NEW)
    assert tried == []  # and taken once well formed


def test_only_the_newest_trials_are_kept(pins: Project, monkeypatch: pytest.MonkeyPatch
                                         ) -> None:
    monkeypatch.setattr(kept, "KEEP", 3)
    loaded = pins.loaded()
    for i in range(5):
        kept.trial(loaded, pins.store, ("1" * 64, f"{i}" * 64), ("0.1.0", NEW), list)
        for p in kept_files(pins):  # the file system's clock may not tell them apart
            if p.stat().st_mtime_ns > 10**12:
                os.utime(p, ns=(i * 10**9, i * 10**9))
    names = [p.name for p in kept_files(pins)]
    assert len(names) == 3
    newest = [kept.key(kept.inputs(loaded, ("1" * 64, f"{i}" * 64), ("0.1.0", NEW))) + ".json"
              for i in (2, 3, 4)]
    assert sorted(names) == sorted(newest)
