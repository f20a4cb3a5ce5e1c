"""Push: the closure goes up signed, outputs before the record, nothing twice, and nothing
the local store no longer vouches for."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from qwen38build.cache import transport as cachehttp
from qwen38build.cache.signing import SecretKey, write_key_pair
from tests import cache_fixtures as cf
from tests.conftest import Project
from tests.test_substituter import no_user_cache_config

__all__ = ["no_user_cache_config"]  # autouse: this machine's cache config stays out


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    key = SecretKey.generate("q38-test-1")
    write_key_pair(key, tmp_path / "k.sec", tmp_path / "k.pub")
    return tmp_path / "k.sec"


def _files(root: Path) -> dict[str, int]:
    return {p.relative_to(root).as_posix(): p.stat().st_mtime_ns
            for p in root.rglob("*") if p.is_file()}


def test_push_sends_outputs_first_then_the_signed_record_and_is_idempotent(
        project: Project, tmp_path: Path, key_file: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    puts: list[str] = []
    real_put = cachehttp.put

    def recording_put(url: str, *args: object, **kwargs: object) -> None:
        puts.append(url)
        real_put(url, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(cachehttp, "put", recording_put)
    with cf.nginx(tmp_path / "cache", tmp_path / "nginx") as url:
        assert project.run("build", "-q") == 0
        capsys.readouterr()
        assert project.run("push", url, "--key", str(key_file), "--json") == 0
        first = json.loads(capsys.readouterr().out)
        assert len(first["sent"]) == 3 and first["present"] == []
        # Each entry's record is the last thing of it sent, so a reader never sees a
        # record whose outputs are not there yet.
        for digest in first["sent"]:
            mine = [u for u in puts if f"/{digest}" in u]
            assert mine[-1].endswith(f"/{digest}.json")
            assert all(f"/{digest}/" in u for u in mine[:-1]) and len(mine) >= 2
        before = _files(tmp_path / "cache")
        puts.clear()
        assert project.run("push", url, "--key", str(key_file), "--json") == 0
        second = json.loads(capsys.readouterr().out)
    assert second["sent"] == [] and sorted(second["present"]) == sorted(first["sent"])
    assert puts == []  # nothing re-sent
    assert _files(tmp_path / "cache") == before


def test_push_of_a_changed_store_entry_publishes_no_record(
        project: Project, tmp_path: Path, key_file: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert project.run("build", "--json", "-q") == 0
    wheel = Path(json.loads(capsys.readouterr().out)["wheel"])
    # Same size, other bytes, the recorded mtime put back: only a re-hash can tell.
    st = wheel.stat()
    data = bytearray(wheel.read_bytes())
    data[-1] ^= 1
    wheel.chmod(0o644)
    wheel.write_bytes(bytes(data))
    os.utime(wheel, ns=(st.st_atime_ns, st.st_mtime_ns))
    with cf.nginx(tmp_path / "cache", tmp_path / "nginx") as url:
        assert project.run("push", url, "--key", str(key_file)) == 1
        err = capsys.readouterr().err
    assert "nothing of it was pushed" in err
    digest = wheel.parent.name
    assert not (tmp_path / "cache" / f"{digest}.json").exists()


def test_push_without_a_key_is_refused(project: Project, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert project.run("build", "-q") == 0
    assert project.run("push", "http://127.0.0.1:9/q38") == 2
    assert "needs a signing key" in capsys.readouterr().err


def test_push_with_a_bad_key_file_names_it(project: Project, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.sec"
    bad.write_text("q38:not-base64!\n")
    assert project.run("push", "http://127.0.0.1:9/q38", "--key", str(bad)) == 2
    err = capsys.readouterr().err
    assert f"error: {bad}:" in err and "Traceback" not in err


def test_push_to_a_server_without_put_fails_with_one_line(
        project: Project, tmp_path: Path, key_file: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert project.run("build", "-q") == 0
    with cf.fault_server(tmp_path / "empty") as server:
        assert project.run("push", server.url, "--key", str(key_file)) == 1
    err = capsys.readouterr().err
    assert "PUT answered 405" in err and "Traceback" not in err
