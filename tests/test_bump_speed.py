"""What makes ``bump --dry-run`` fast, each held to the same answers: the wheels' files kept
by the wheel's sha256 (a second bump reads no zip directory), one GNU diff for every
upstream diff, no reverse GNU patch run where the patch certainly does not reverse, and the
environment locks compared by a scan of uv's layout."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from qwen38build.bump import bump, kept, members, trial
from qwen38build.pinning import pylock as envlock
from qwen38build.wheels import wheelzip
from tests.bump_fixtures import NEW, Project
from tests.test_bump import SERIES, two_pins

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def pins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Project:
    return two_pins(tmp_path, monkeypatch, SERIES)


def outcomes(p: Project, keep: bool = False) -> list[tuple[str, str, tuple[str, ...]]]:
    """Each patch's outcome and failing hunks; the series tried again unless ``keep``
    (the trial kept by an earlier bump is dropped first: :mod:`qwen38build.bump.kept`)."""
    if not keep:
        shutil.rmtree(p.store_root / kept.FOLDER, ignore_errors=True)
    report = bump.bump(p.loaded(), p.store, NEW)
    return [(r.patch, r.outcome, tuple(f.upstream_diff + f.note for f in r.failures))
            for r in report.patches]


def test_a_second_bump_reads_no_wheel_and_says_the_same(
    pins: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = outcomes(pins)
    kept = sorted(p.name for p in (pins.store_root / members.FOLDER).iterdir())
    assert len(kept) == 2  # one folder per wheel, by its sha256
    assert all(len(name) == 64 for name in kept)

    def no_zip(wheel: Path) -> object:
        raise AssertionError(f"read {wheel.name}'s zip directory again")

    monkeypatch.setattr(wheelzip, "member_infos", no_zip)
    assert outcomes(pins) == first


def test_a_kept_file_whose_bytes_changed_is_read_from_the_wheel_again(
    pins: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = outcomes(pins)
    folder = pins.store_root / members.FOLDER
    for f in folder.glob("*/*"):
        if f.name != "index.json":
            f.chmod(0o644)
            f.write_bytes(f.read_bytes().replace(b"line", b"LINE"))
    read: list[str] = []
    real = wheelzip.member_infos

    def counted(wheel: Path) -> object:
        read.append(wheel.name)
        return real(wheel)

    monkeypatch.setattr(wheelzip, "member_infos", counted)
    assert outcomes(pins) == first
    assert len(set(read)) == 2


def test_one_diff_for_all_upstream_diffs_and_reverse_runs_only_where_they_can_succeed(
    pins: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    programs: list[str] = []
    from qwen38build.proc import run as real_run
    from qwen38build.series.gnupatch import run_patch as real_patch

    reversed_for: list[str] = []

    def spy_run(args: list[str], **kw: object) -> object:
        programs.append(Path(str(args[0])).name)
        return real_run(args, **kw)  # type: ignore[arg-type]

    def spy_patch(patch: Path, directory: Path, **kw: bool) -> object:
        if kw.get("reverse"):
            reversed_for.append(patch.stem)
        return real_patch(patch, directory, **kw)

    monkeypatch.setattr(trial, "run", spy_run)
    monkeypatch.setattr(trial, "run_patch", spy_patch)
    got = dict((name, outcome) for name, outcome, _ in outcomes(pins))
    assert programs == ["diff"]  # c.py's, d.py's, f.py's... upstream diffs: one process
    # conflict-c, base-f and on-f change lines that are not in the new files: GNU patch is
    # not asked to reverse them; upstreamed-d's are, and it reverses
    assert reversed_for == ["upstreamed-d"]
    assert got["upstreamed-d"] == "upstreamed" and got["conflict-c"] == "conflict"


def test_a_patch_with_its_new_side_in_the_tree_is_still_tried_in_reverse(
    pins: Project, tmp_path: Path
) -> None:
    """The pre-check is only a necessary condition: where every hunk's new side stands it
    leaves the answer to GNU patch."""
    from qwen38build.series.patchfile import PatchFile

    pf = PatchFile.parse(pins.root / "patches" / "upstreamed-d.patch")
    work = tmp_path / "w"
    work.mkdir()
    new = "".join(f"d line {i}\n" for i in range(1, 41)).replace("d line 10\n",
                                                                 "d line 10 fixed\n")
    (work / "d.py").write_text(new)
    assert trial._may_reverse(pf, work)
    (work / "d.py").write_text(new.replace("d line 10 fixed\n", "d line 10 other\n"))
    assert not trial._may_reverse(pf, work)
    (work / "d.py").unlink()
    assert trial._may_reverse(pf, work)  # a missing file: GNU patch says
    twice = dataclasses.replace(pf, files=(*pf.files, *pf.files))
    assert trial._may_reverse(twice, work)


@pytest.mark.parametrize("python", ["3.11", "3.12", "3.13"])
def test_the_scan_of_a_lock_agrees_with_parsing_it(python: str) -> None:
    text = envlock.pylock_path(REPO).read_text()
    env = envlock.marker_env(python, "manylinux_2_31_x86_64")
    fast = envlock.versions(text, "lock", env)
    assert fast == envlock.packages_of(text, "lock", env)
    assert len(fast) > 150
    # another layout (the keys in another order) is parsed in full, with the same answer
    other = text.replace('[[packages]]\nname = "torch"\nversion = "2.13.0"\n',
                         '[[packages]]\nversion = "2.13.0"\nname = "torch"\n')
    assert other != text and envlock.versions(other, "lock", env) == fast
