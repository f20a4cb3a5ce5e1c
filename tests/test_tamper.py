"""Tampered store entries: each is noticed, removed and rebuilt; bad bytes are never used.

Every case changes what the store holds behind the tool's back, the way a user, a disk or
an attacker might, then checks the expected outcome: the next build gives the same hash
and the good bytes, ``store verify`` names what it found, ``apply`` refuses.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from pathlib import Path

import pytest

from qwen38build.engine.plan import Plan, make_plan
from qwen38build.inputs import lock, recipe
from qwen38build.store.store import Store
from tests.conftest import Project
from tests.engine_fixtures import wheel_name


def _build(p: Project, capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, str]:
    assert p.run("build", "--json", *extra) == 0
    captured = capsys.readouterr()
    out: dict[str, str] = json.loads(captured.out)
    out["log"] = captured.err
    return out


def _plan(p: Project) -> Plan:
    return make_plan(recipe.load(p.root / "recipe.toml"), lock.read(p.root))


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _flip_keeping_mtime(path: Path, offset: int = 40) -> None:
    """Change one byte in place, then put mode and mtime back as they were."""
    st = path.stat()
    os.chmod(path.parent, 0o755)
    os.chmod(path, 0o644)
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))
    os.chmod(path, st.st_mode & 0o777)
    os.chmod(path.parent, 0o555)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_mtime_ns == st.st_mtime_ns and path.stat().st_size == st.st_size


def _verify(p: Project, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[dict[str, str]]]:
    code = p.run("store", "verify", "--json")
    findings: list[dict[str, str]] = json.loads(capsys.readouterr().out)["findings"]
    return code, findings


def test_output_wheel_with_a_flipped_byte_and_its_mtime_restored_is_rebuilt(
        project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    first = _build(project, capsys)
    wheel = Path(first["wheel"])
    good = _sha(wheel)
    _flip_keeping_mtime(wheel)
    # the fast path's stat check sees the ctime move; the full build rebuilds the entry
    second = _build(project, capsys)
    assert second["build"] == first["build"]
    assert "changed since written; rebuilding" in second["log"]
    assert _sha(Path(second["wheel"])) == good
    assert _verify(project, capsys) == (0, [])


def test_tampered_pristine_wheel_is_refetched_never_built_from(
        project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    first = _build(project, capsys)
    good = _sha(Path(first["wheel"]))
    store, plan = Store(project.store), _plan(project)
    fetched = store.lookup(plan.targets["fetch"].digest)
    assert fetched is not None
    pristine = fetched.the_output(".whl")
    _flip_keeping_mtime(pristine, offset=pristine.stat().st_size // 2)
    store.remove(plan.top.digest)  # the wheel step must read the pristine wheel again
    second = _build(project, capsys, "--rebuild")
    assert second["build"] == first["build"] and _sha(Path(second["wheel"])) == good
    assert "fetch" in second["log"] and _sha(pristine) == _sha(project.wheels / pristine.name)


def test_tamper_that_passes_the_stat_check_is_caught_before_commit(
        project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    """A record without inode and ctime (an older store) lets a restored mtime pass the
    cheap check: the full re-hash before the wheel entry commits still catches it."""
    first = _build(project, capsys)
    good = _sha(Path(first["wheel"]))
    store, plan = Store(project.store), _plan(project)
    digest = plan.targets["fetch"].digest
    meta_path = store.meta_path(digest)
    meta = json.loads(meta_path.read_bytes())
    for rec in meta["outputs"].values():
        for key in ("ino", "ctime_ns", "mode"):
            del rec[key]
    meta_path.write_text(json.dumps(meta))
    entry = store.lookup(digest)
    assert entry is not None
    _flip_keeping_mtime(entry.the_output(".whl"), offset=100)
    assert store.get(digest) is not None  # the cheap check alone cannot tell
    store.remove(plan.top.digest)
    store.remove(plan.targets["patch"].digest)
    second = _build(project, capsys, "--rebuild")
    assert second["build"] == first["build"] and _sha(Path(second["wheel"])) == good
    assert "changed after it was written" not in second["log"]  # handled, not reported
    refetched = store.lookup(digest)
    assert refetched is not None and "ctime_ns" in refetched.outputs[wheel_name("0.0.1")]
    assert _verify(project, capsys) == (0, [])


def test_a_stray_wheel_in_an_entry_is_never_used_and_verify_reports_it(
        project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    first = _build(project, capsys)
    good = _sha(Path(first["wheel"]))
    store, plan = Store(project.store), _plan(project)
    fetched = store.lookup(plan.targets["fetch"].digest)
    assert fetched is not None
    os.chmod(fetched.path, 0o755)
    stray = fetched.path / "aaa-0.0.1-py3-none-any.whl"  # sorts before the real one
    with zipfile.ZipFile(stray, "w") as z:
        z.writestr("vllm/server.py", "evil = True\n")
    os.chmod(fetched.path, 0o555)
    store.remove(plan.top.digest)
    store.remove(plan.targets["patch"].digest)
    second = _build(project, capsys, "--rebuild")
    assert second["build"] == first["build"] and _sha(Path(second["wheel"])) == good
    code, findings = _verify(project, capsys)
    assert code == 1
    assert findings == [{"kind": "stray", "entry": fetched.digest, "path": stray.name,
                         "detail": "no record names it; never used"}]


def _site(p: Project, dest: Path) -> Path:
    """An installed pristine vLLM (the fixture wheel unpacked, dist-info included)."""
    with zipfile.ZipFile(p.wheels / wheel_name("0.0.1")) as z:
        z.extractall(dest)
    return dest


def test_apply_refuses_a_stored_file_edited_after_its_build(
        project: Project, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    _build(project, capsys)
    site = _site(project, tmp_path / "site")
    before = (site / "vllm" / "server.py").read_bytes()
    store, plan = Store(project.store), _plan(project)
    patched = store.lookup(plan.targets["patch"].digest)
    assert patched is not None
    tree_file = patched.path / "tree" / "server.py"
    os.chmod(tree_file.parent, 0o755)
    os.chmod(tree_file, 0o644)
    tree_file.write_text("import os; os.system('evil')\n")
    assert project.run("apply", str(site)) == 1
    err = capsys.readouterr().err
    assert "is not the build manifest's" in err and "Nothing was written" in err
    assert (site / "vllm" / "server.py").read_bytes() == before
    assert not [p for p in (site / "vllm").iterdir() if p.name.startswith(".")]
    # the next build notices the edited entry and rebuilds it; then apply goes through
    _build(project, capsys, "--rebuild")
    assert project.run("apply", str(site)) == 0
    assert b"return 33" in (site / "vllm" / "server.py").read_bytes()
    assert project.run("verify", str(site)) == 0


def test_apply_refuses_an_edited_manifest(
        project: Project, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Editing the manifest and the tree together would fool a tree check alone."""
    first = _build(project, capsys)
    site = _site(project, tmp_path / "site")
    before = (site / "vllm" / "server.py").read_bytes()
    manifest = Path(first["wheel"]).parent / "manifest.json"
    os.chmod(manifest.parent, 0o755)
    os.chmod(manifest, 0o644)
    data = json.loads(manifest.read_text())
    data["owned"]["server.py"]["patched"] = "0" * 64
    manifest.write_text(json.dumps(data))
    assert project.run("apply", str(site)) == 1
    assert "manifest.json changed after it was written" in capsys.readouterr().err
    assert (site / "vllm" / "server.py").read_bytes() == before


@pytest.mark.parametrize("damage", ["mode", "symlink", "no-outputs", "bad-json", "wrong-types",
                                    "orphan", "missing", "folder-mode"])
def test_store_verify_names_each_kind_of_damage_and_the_build_repairs_it(
        project: Project, capsys: pytest.CaptureFixture[str], damage: str) -> None:
    first = _build(project, capsys)
    store, plan = Store(project.store), _plan(project)
    digest = plan.targets["patch"].digest
    entry = store.lookup(digest)
    assert entry is not None
    target = entry.path / "patch.json"
    os.chmod(entry.path, 0o755)
    meta_path = store.meta_path(digest)
    meta = json.loads(meta_path.read_bytes())
    if damage == "mode":
        os.chmod(target, 0o666)
    elif damage == "symlink":
        target.unlink()
        target.symlink_to("/etc/hostname")
    elif damage == "no-outputs":
        del meta["outputs"]
        meta_path.write_text(json.dumps(meta))
    elif damage == "bad-json":
        meta_path.write_text("{not json")
    elif damage == "wrong-types":
        meta["outputs"]["patch.json"]["size"] = "big"
        meta_path.write_text(json.dumps(meta))
    elif damage == "orphan":
        (store.objects / ("0" * 64)).mkdir()
        os.chmod(entry.path, 0o555)  # the entry itself as sealed
    elif damage == "missing":
        target.unlink()
    expected = {"mode": "mode", "symlink": "symlink", "no-outputs": "malformed",
                "bad-json": "malformed", "wrong-types": "malformed", "orphan": "leftover",
                "missing": "missing", "folder-mode": "mode"}[damage]
    code, findings = _verify(project, capsys)
    assert code == (0 if damage == "orphan" else 1)  # a leftover is no damage
    assert expected in {f["kind"] for f in findings}
    assert project.run("store", "verify") == code
    text = capsys.readouterr().out
    assert f"{expected}: " in text and "Traceback" not in text
    if damage in ("orphan", "folder-mode"):
        return  # nothing a build reads: the next build or gc removes an orphan
    second = _build(project, capsys, "--rebuild")
    assert second["build"] == first["build"]
    assert _verify(project, capsys) == (0, [])
