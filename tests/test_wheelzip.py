"""The one extraction routine and its member check, through every entry point that reads
or writes wheel members: wheelzip.extract, the pristine-wheel writer, workspace's (and the
bump's rebase) extract_package, the bump's member reader, and verify/apply's manifest."""

from __future__ import annotations

import os
import zipfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from qwen38build.bump import trial
from qwen38build.errors import InputError
from qwen38build.wheels import installed as verify
from qwen38build.wheels import wheelzip
from qwen38build.workspace import workspace
from tests.engine_fixtures import FILES, make_wheel

HOSTILE = [
    "vllm/../../../x",
    "../x",
    "/tmp/q38-abs",
    "vllm\\..\\..\\x",
    "C:/x",
    "vllm/x\0y",
    "vllm/x\ny",
    "",
    "vllm/../vllm/../../x",
]


def zip_with(path: Path, extra: dict[str, bytes], modes: dict[str, int] | None = None) -> Path:
    """The tiny test wheel plus ``extra`` members, names written as given."""
    good = make_wheel(path.parent / "good")
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(path, "w") as dst:
        for info in src.infolist():
            dst.writestr(info, src.read(info))
        for name, data in extra.items():
            info = zipfile.ZipInfo("placeholder", date_time=(2026, 1, 1, 0, 0, 0))
            info.filename = name  # ZipInfo would normalise some names; keep them hostile
            info.external_attr = (modes or {}).get(name, 0o100644) << 16
            dst.writestr(info, data)
    return path


def tree(top: Path) -> list[str]:
    return sorted(str(p.relative_to(top)) for p in top.rglob("*"))


@pytest.mark.parametrize("name", HOSTILE)
def test_safe_member_refuses_names_that_leave_the_folder(name: str) -> None:
    with pytest.raises(InputError, match="outside its directory"):
        wheelzip.safe_member(name)


def test_safe_member_gives_a_relative_path() -> None:
    assert wheelzip.safe_member("vllm/a/b.py") == PurePosixPath("vllm/a/b.py")


@pytest.mark.parametrize("mode", [0o120777, 0o020644, 0o060644, 0o010644])
def test_safe_member_refuses_links_and_devices_by_mode(mode: int) -> None:
    info = zipfile.ZipInfo("vllm/evil")
    info.external_attr = mode << 16
    with pytest.raises(InputError, match="not a regular file"):
        wheelzip.safe_member("vllm/evil", info)


def test_extract_writes_all_or_the_named_members_with_fixed_modes(tmp_path: Path) -> None:
    wheel = zip_with(tmp_path / "w.whl", {"vllm/run.sh": b"#!/bin/sh\n"},
                     {"vllm/run.sh": 0o100755})
    old = os.umask(0o077)
    try:
        written = wheelzip.extract(wheel, tmp_path / "all")
    finally:
        os.umask(old)
    assert "vllm/server.py" in written and "vllm/run.sh" in written
    assert (tmp_path / "all" / "vllm" / "server.py").read_text() == FILES["vllm/server.py"]
    assert (tmp_path / "all" / "vllm" / "server.py").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "all" / "vllm" / "run.sh").stat().st_mode & 0o777 == 0o755
    some = wheelzip.extract(wheel, tmp_path / "some", ["vllm/envs.py", "vllm/absent.py"])
    assert some == ["vllm/envs.py"]
    assert tree(tmp_path / "some") == ["vllm", "vllm/envs.py"]


def test_extract_never_follows_a_link_in_its_destination(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "w")
    dest = tmp_path / "dest"
    (dest / "vllm").mkdir(parents=True)
    outside = tmp_path / "outside.txt"
    outside.write_text("keep\n")
    (dest / "vllm" / "envs.py").symlink_to(outside)
    with pytest.raises(OSError):
        wheelzip.extract(wheel, dest, ["vllm/envs.py"])
    assert outside.read_text() == "keep\n"
    (dest / "vllm" / "envs.py").unlink()
    os.rmdir(dest / "vllm")
    (dest / "vllm").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(InputError, match="outside"):
        wheelzip.extract(wheel, dest, ["vllm/envs.py"])
    assert tree(tmp_path / "elsewhere") == []


# zipfile itself cuts a name at its NUL ("vllm/x"), so that one is not hostile once read.
@pytest.mark.parametrize("name", [n for n in HOSTILE if n and "\0" not in n])
def test_a_hostile_member_is_refused_by_every_entry_point(name: str, tmp_path: Path) -> None:
    wheel = zip_with(tmp_path / "bad.whl", {name: b"owned"})
    sentinel = tmp_path / "sentinel"
    sentinel.mkdir()
    before = tree(tmp_path)
    entry_points: list[Callable[[], object]] = [
        lambda: wheelzip.check_wheel(wheel),
        lambda: wheelzip.extract(wheel, tmp_path / "a"),
        lambda: wheelzip.extract(wheel, tmp_path / "b", ["vllm/server.py"]),
        lambda: wheelzip.member_infos(wheel),
        lambda: wheelzip.read(wheel, "vllm/server.py"),
        lambda: wheelzip.PatchedWheel(wheel, "vllm-0.0.1.dist-info", "x.dist-info"),
        lambda: workspace.extract_package(wheel, tmp_path / "ws" / "vllm", {"server.py"}),
        lambda: trial._read_members(wheel, {"server.py"}),
    ]
    for call in entry_points:
        with pytest.raises(InputError):
            call()
    made = set(tree(tmp_path)) - set(before)
    assert all(p.startswith(("a", "b", "ws")) for p in made), made
    assert not [p for p in made if not os.path.isdir(tmp_path / p)], made  # no file at all
    assert not Path("/tmp/q38-abs").exists()
    assert tree(sentinel) == []


def test_duplicate_members_that_land_on_one_file_are_refused(tmp_path: Path) -> None:
    wheel = zip_with(tmp_path / "dup.whl", {"vllm/./server.py": b"second"})
    with pytest.raises(InputError, match="one file"):
        wheelzip.extract(wheel, tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_check_wheel_wants_a_zip_with_one_record(tmp_path: Path) -> None:
    wheelzip.check_wheel(make_wheel(tmp_path / "ok"))
    junk = tmp_path / "junk.whl"
    junk.write_bytes(b"not a zip")
    with pytest.raises(InputError, match="not a wheel"):
        wheelzip.check_wheel(junk)
    norec = tmp_path / "norec.whl"
    with zipfile.ZipFile(norec, "w") as z:
        z.writestr("vllm/__init__.py", "")
    with pytest.raises(InputError, match="RECORD members, not one"):
        wheelzip.check_wheel(norec)


def test_a_damaged_record_is_input_error(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "w", {"vllm/__init__.py": ""})
    bad = tmp_path / "bad.whl"
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(bad, "w") as dst:
        for info in src.infolist():
            data = b"x,sha256=y,notanumber\n" if info.filename.endswith("RECORD") else \
                src.read(info)
            dst.writestr(info, data)
    with pytest.raises(InputError, match="not a valid RECORD"):
        wheelzip.read_record(bad, "vllm-0.0.1.dist-info")


def test_verify_and_apply_refuse_a_manifest_path_out_of_the_package(tmp_path: Path) -> None:
    manifest: Any = {"package": "vllm", "owned": {"../../etc/x": {"patched": None, "owners": []}},
                "record": {}, "name": "vllm", "version": "0.0.1"}
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    with pytest.raises(InputError, match="outside"):
        verify.verify_tree(site, manifest)
    with pytest.raises(InputError, match="outside"):
        verify.owned_paths(manifest)
