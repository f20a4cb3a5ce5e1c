"""The store's own promises: atomic writes, locks that leave nothing behind, the cheap check,
digests that mean bytes (implementation hashes, the fixed-output fetch)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from qwen38build.engine.plan import Plan, fetch_step, make_plan
from qwen38build.files import atomic_write
from qwen38build.inputs import lock, recipe
from qwen38build.steps import KINDS, kind_module
from qwen38build.steps import implementation as kind_version
from qwen38build.store.entry import cheap_ok
from qwen38build.store.store import Store
from qwen38build.store.temproots import digest_lock
from tests.conftest import Project
from tests.imports_closure import imported_closure

REPO = Path(__file__).resolve().parent.parent


def _plan(p: Project) -> Plan:
    return make_plan(recipe.load(p.root / "recipe.toml"), lock.read(p.root))


def test_atomic_write_from_many_threads_leaves_one_whole_file_and_no_temp(
        tmp_path: Path) -> None:
    target = tmp_path / "d" / "f.json"
    bodies = [bytes([65 + i]) * (1000 + i) for i in range(16)]
    threads = [threading.Thread(target=atomic_write, args=(target, b)) for b in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert target.read_bytes() in bodies
    assert [p.name for p in target.parent.iterdir()] == ["f.json"]


def test_digest_lock_excludes_and_leaves_no_file(tmp_path: Path) -> None:
    path = tmp_path / "locks" / "x.lock"
    inside: list[int] = []
    most = [0]

    def work() -> None:
        for _ in range(20):
            with digest_lock(path):
                inside.append(1)
                most[0] = max(most[0], len(inside))
                inside.pop()

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1
    assert list(path.parent.iterdir()) == []


def test_cheap_check_sees_a_restored_mtime_through_ctime(tmp_path: Path) -> None:
    from qwen38build.store.entry import stat_record

    f = tmp_path / "f"
    f.write_bytes(b"good")
    os.chmod(f, 0o444)
    rec = stat_record(f.stat(), "0" * 64)
    assert cheap_ok(rec, f)
    st = f.stat()
    os.chmod(f, 0o644)
    f.write_bytes(b"evil")
    os.chmod(f, 0o444)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert not cheap_ok(rec, f)
    assert not cheap_ok(rec, tmp_path / "absent")


def test_a_copied_store_is_rehashed_once_not_rebuilt(
        project: Project, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert project.run("build", "-q", "--no-link") == 0
    capsys.readouterr()
    copy = tmp_path / "copied"
    shutil.copytree(project.store, copy, symlinks=True)  # new inodes and ctimes
    from qwen38build.engine.executor import realise
    from qwen38build.engine.report import Reporter

    outcomes = realise([_plan(project).top], Store(copy), Reporter(quiet=True))
    assert not any(o.built for o in outcomes.values())
    for o in outcomes.values():
        assert Store(copy).get(o.step.digest) is not None  # new stat recorded


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_declared_implementation_covers_every_imported_module(kind: str) -> None:
    module = kind_module(kind)
    declared = {module.__name__, *module.IMPLEMENTATION}
    missing = imported_closure(module.__name__) - declared
    assert not missing, f"{kind}: add {sorted(missing)} to its IMPLEMENTATION"


def test_editing_a_module_a_kind_uses_changes_its_digest_and_nothing_else(
        tmp_path: Path) -> None:
    shutil.copytree(REPO / "qwen38build", tmp_path / "qwen38build",
                    ignore=shutil.ignore_patterns("__pycache__"))
    gnupatch = tmp_path / "qwen38build" / "series" / "gnupatch.py"
    gnupatch.write_text(gnupatch.read_text() + "\n# a change\n")
    probe = ("from qwen38build.steps import implementation as v; "
             "print(v('patch'), v('wheel'), v('cubin'), v('fetch'))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True,
                         text=True, check=True, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    patch, wheel, cubin, fetch = out.stdout.split()
    assert patch != kind_version("patch") and wheel != kind_version("wheel")
    assert cubin == kind_version("cubin") and fetch == kind_version("fetch") == "fixed-output"


def test_fetch_digest_is_filename_and_sha256_only(project: Project) -> None:
    from dataclasses import replace

    loaded = recipe.load(project.root / "recipe.toml")
    entry = lock.read(project.root)["vllm"]
    step = fetch_step(loaded, entry)
    assert step.derivation()["params"] == {"filename": entry.filename, "sha256": entry.sha256}
    other_python = loaded.recipe.model_copy(update={"toolchain": loaded.recipe.toolchain.
                                                    model_copy(update={"python": "3.13"})})
    loaded2 = replace(loaded, recipe=other_python)
    assert fetch_step(loaded2, replace(entry, size=entry.size + 1)).digest == step.digest
    assert fetch_step(loaded, replace(entry, sha256="0" * 64)).digest != step.digest
    assert fetch_step(loaded, replace(entry, filename="x-" + entry.filename)).digest != step.digest


def test_reproduce_refuses_a_record_from_other_code_honestly(
        project: Project, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert project.run("build", "--json", "-q", "--no-link") == 0
    build = json.loads(capsys.readouterr().out)["build"]
    from qwen38build.engine import reproduce

    # the patch kind's code changed since the build: its implementation hash is another
    monkeypatch.setattr(reproduce, "implementation",
                        lambda kind: "0" * 64 if kind == "patch" else kind_version(kind))
    assert project.run("reproduce", build[:12]) == 1
    out = capsys.readouterr().out
    assert "was built by patch implementation" in out and "this qwen38build's is 000000" in out
    monkeypatch.undo()
    path = Store(project.store).builds / f"{build}.json"
    record = json.loads(path.read_text())
    record["format"] = 1
    path.write_text(json.dumps(record))
    assert project.run("reproduce", build[:12]) == 2
    assert "recorded by an older qwen38build" in capsys.readouterr().err


@pytest.mark.parametrize("arg", ["******", "8f64f?", "../../../etc/passwd", "abc", "ABCDEF12"])
def test_a_build_hash_argument_is_hex_never_a_glob_or_a_path(
        project: Project, capsys: pytest.CaptureFixture[str], arg: str) -> None:
    assert project.run("reproduce", arg) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err and "8 to 64" in err


def test_a_malformed_build_record_is_a_clean_error(
        project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    assert project.run("build", "--json", "-q", "--no-link") == 0
    build = json.loads(capsys.readouterr().out)["build"]
    (Store(project.store).builds / f"{build}.json").write_text("{torn")
    assert project.run("reproduce", build[:12]) == 1
    assert "unreadable build record" in capsys.readouterr().err
