"""env DIR: a virtual environment from a synthetic lock and the store's wheels, made by uv
with no network, accepted by verify; and each refusal before anything is made."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from qwen38build.inputs import recipe
from qwen38build.pinning import pylock as envlock
from qwen38build.pinning.sources import relock_env
from qwen38build.store.store import Store
from tests.conftest import Project
from tests.env_fixtures import add_pthfa_wheel, dist_wheel, env_project


@pytest.fixture
def built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Project:
    """Locked, built, and the pthfa wheel in the store."""
    p = env_project(tmp_path, monkeypatch)
    relock_env(recipe.load(p.root / "recipe.toml"), Store(p.store))
    assert p.run("build", "--no-link") == 0
    add_pthfa_wheel(p, monkeypatch)
    return p


def dists(site: Path) -> set[str]:
    return {"==".join(d.name.removesuffix(".dist-info").rsplit("-", 1))
            for d in site.glob("*.dist-info")}


def test_env_installs_lock_and_built_wheels_and_verify_accepts_it(
    built: Project, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = tmp_path / "venv"
    capsys.readouterr()
    assert built.run("env", str(dest), "--python", sys.executable, "--json") == 0
    out = json.loads(capsys.readouterr().out)
    site = Path(out["site_packages"])
    assert site.is_relative_to(dest) and out["locked_packages"] == 3
    have = dists(site)
    assert {"torch==2.11.0", "tinydep==1.2.0", "cupy_cuda13x==14.2.0", "pthfa==0.1.0"} <= have
    vllm = [d for d in have if d.startswith("vllm==")]
    assert len(vllm) == 1 and "+q38." in vllm[0]  # the patched build, not a pristine one
    assert "return 33" in (site / "vllm" / "server.py").read_text()
    # the whole build recorded, so verify finds it without ./result
    assert built.run("verify", str(site)) == 0
    assert "holds exactly build" in capsys.readouterr().out
    # again, offline: everything is local, and the environment is brought up to date
    assert built.run("env", str(dest), "--python", sys.executable, "--offline") == 0


def test_a_dependency_whose_bytes_differ_from_the_lock_is_refused(
    built: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    index = tmp_path / "index"
    dist_wheel(index, "tinydep", "1.2.0", files={"tinydep/__init__.py": "EVIL = 1\n"})
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "fresh-cache"))
    assert built.run("env", str(tmp_path / "venv"), "--python", sys.executable) == 1
    err = capsys.readouterr().err
    assert "uv failed to install pylock.toml" in err and "Hash mismatch for `tinydep" in err
    assert not (tmp_path / "venv").exists()


def test_a_changed_wheel_in_the_store_is_refused(
    built: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A change the store's cheap (stat) check cannot see is still caught: env hashes the
    wheels it installs against the store's record."""
    from qwen38build.wheels.venv import pthfa_step

    step = pthfa_step(recipe.load(built.root / "recipe.toml"))
    entry = Store(built.store).get(step.digest)
    assert entry is not None
    wheel = entry.the_output(".whl")
    wheel.chmod(0o644)
    data = bytearray(wheel.read_bytes())
    data[-1] ^= 1
    wheel.write_bytes(bytes(data))
    monkeypatch.setattr(Store, "get", Store.lookup)  # a cheap check blind to this change
    assert built.run("env", str(tmp_path / "venv"), "--python", sys.executable) == 1
    assert "differs from the store's record" in capsys.readouterr().err
    assert not (tmp_path / "venv").exists()


def test_missing_build_says_to_run_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    p = env_project(tmp_path, monkeypatch)
    relock_env(recipe.load(p.root / "recipe.toml"), Store(p.store))
    assert p.run("env", str(tmp_path / "venv"), "--python", sys.executable) == 2
    err = capsys.readouterr().err
    assert "the patched vLLM wheel of this recipe" in err and "run `qwen38build build`" in err
    assert not (tmp_path / "venv").exists()


def test_missing_pthfa_wheel_says_to_run_kernels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    p = env_project(tmp_path, monkeypatch)
    relock_env(recipe.load(p.root / "recipe.toml"), Store(p.store))
    assert p.run("build", "--no-link") == 0
    assert p.run("env", str(tmp_path / "venv"), "--python", sys.executable) == 2
    assert "qwen38build kernels" in capsys.readouterr().err


def test_stale_environment_lock_is_refused_before_anything_is_made(
    built: Project, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe_toml = built.root / "recipe.toml"
    recipe_toml.write_text(recipe_toml.read_text().replace('cuda = "13.0"', 'cuda = "12.8"'))
    assert built.run("env", str(tmp_path / "venv"), "--python", sys.executable) == 2
    assert "lock/pylock.toml: stale" in capsys.readouterr().err
    assert not (tmp_path / "venv").exists()


def test_python_not_found_is_a_clear_error(
    built: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    missing = tmp_path / "no-such-python"
    dest = tmp_path / "new" / "deeper" / "venv"
    assert built.run("env", str(dest), "--python", str(missing)) == 2
    err = capsys.readouterr().err
    assert f"Python {missing} (--python) was not found" in err and "--python PATH" in err
    assert not (tmp_path / "new").exists()
    # no Python at all that the lock covers: the recipe's is named, and the range
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setenv("UV_PYTHON_INSTALL_DIR", str(tmp_path / "no-managed-pythons"))
    monkeypatch.setenv("UV_PYTHON_SEARCH_PATH", str(empty))
    # uv finds an active virtual environment's Python whatever PATH says (nox's session
    # venv, in CI): a machine with no Python has none active either
    for name in ("VIRTUAL_ENV", "CONDA_PREFIX", "UV_PYTHON"):
        monkeypatch.delenv(name, raising=False)
    assert built.run("env", str(dest)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no Python that lock/pylock.toml covers was found" in err
    assert "(recipe.toml [toolchain] python, the stack's)" in err and "none is downloaded" in err
    assert not (tmp_path / "new").exists()


def test_a_python_the_lock_does_not_cover_is_refused_before_anything_is_made(
    built: Project, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A lock whose requires-python leaves out this very interpreter (its sha256 record
    made to match), and this interpreter asked for: refused, nothing made."""
    import hashlib
    import re

    version = ".".join(map(str, sys.version_info[:3]))
    pylock = envlock.pylock_path(built.root)
    text = re.sub(r'(?m)^requires-python = .*$',
                  f'requires-python = "=={sys.version_info[0]}.{sys.version_info[1]}.*, '
                  f'!={version}"', pylock.read_text())
    pylock.write_text(text)
    side = envlock.inputs_path(built.root)
    record = json.loads(side.read_text())
    record["pylock_sha256"] = hashlib.sha256(text.encode()).hexdigest()
    side.write_text(json.dumps(record))
    other = sys.executable
    dest = tmp_path / "made" / "venv"
    assert built.run("env", str(dest), "--python", other) == 2
    err = capsys.readouterr().err
    assert f"is {version}, which lock/pylock.toml does not cover (requires-python" in err, err
    assert err.count("\n") == 1 and not (tmp_path / "made").exists()


def test_without_the_recipes_python_another_the_lock_covers_is_used_with_a_note(
    built: Project, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The recipe asks for a Python release this machine does not have (the lock covers
    its minor, so this interpreter too): env uses this one and says so on stderr."""
    recipe_toml = built.root / "recipe.toml"
    minor = f"{sys.version_info[0]}.{sys.version_info[1]}"
    recipe_toml.write_text(recipe_toml.read_text().replace(
        f'python = "{minor}"', f'python = "{minor}.99"'))
    capsys.readouterr()
    assert built.run("env", str(tmp_path / "venv"), "--json") == 0
    out, err = capsys.readouterr()
    made = json.loads(out)
    assert made["python_version"] == ".".join(map(str, sys.version_info[:3]))
    assert f"note: Python {minor}.99 (recipe.toml [toolchain] python) was not found; " \
        f"using {made['python_version']}" in err
    assert made["note"] and "lock/pylock.toml also covers" in made["note"]


def test_a_failure_after_the_venv_was_made_leaves_nothing_behind(
    built: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """uv made the venv, then the install fails (the index is gone, uv's cache empty): the
    directory and the parents env created are removed."""
    (tmp_path / "uv.toml").write_text(f'no-index = true\nfind-links = ["{tmp_path / "gone"}"]\n')
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "empty-cache"))
    dest = tmp_path / "a" / "b" / "venv"
    assert built.run("env", str(dest), "--python", sys.executable) == 1
    assert "uv failed to install pylock.toml" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()


def test_a_directory_that_is_not_an_environment_is_left_alone(
    built: Project, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = tmp_path / "data"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine\n")
    assert built.run("env", str(dest), "--python", sys.executable) == 2
    assert "exists and is not an environment `env` made" in capsys.readouterr().err
    assert [p.name for p in dest.iterdir()] == ["keep.txt"]


def test_a_virtual_environment_env_did_not_make_keeps_its_packages(
    built: Project, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Syncing it to the lock would uninstall the user's packages: refused, untouched."""
    dest = tmp_path / "theirs"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], check=True)
    site = next(dest.glob("lib/python*/site-packages"))
    (site / "gamma.py").write_text("VALUE = 1\n")
    before = sorted(str(q.relative_to(dest)) for q in dest.rglob("*"))
    assert built.run("env", str(dest), "--python", sys.executable) == 2
    err = capsys.readouterr().err
    assert "a virtual environment made by something else" in err and err.count("\n") == 1
    assert sorted(str(q.relative_to(dest)) for q in dest.rglob("*")) == before


def test_offline_once_uvs_cache_holds_the_locked_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The index is an HTTP server on the loopback; after one install it is shut down, and
    a second environment is made with --offline from uv's cache and the store alone."""
    import functools
    import http.server
    import threading

    p = env_project(tmp_path, monkeypatch)
    index = tmp_path / "index"
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(index))

    class Quiet(http.server.ThreadingHTTPServer):
        def handle_error(self, request: object, client_address: object) -> None:
            pass

    monkeypatch.setattr(http.server.SimpleHTTPRequestHandler, "log_message",
                        lambda *a: None)
    server = Quiet(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        (tmp_path / "uv.toml").write_text(f'no-index = true\nfind-links = ["{url}"]\n')
        relock_env(recipe.load(p.root / "recipe.toml"), Store(p.store))
        assert url in envlock.pylock_path(p.root).read_text()
        assert p.run("build", "--no-link") == 0
        add_pthfa_wheel(p, monkeypatch)
        assert p.run("env", str(tmp_path / "online"), "--python", sys.executable) == 0
    finally:
        server.shutdown()
        server.server_close()
    capsys.readouterr()
    monkeypatch.setenv("UV_HTTP_RETRIES", "0")
    assert p.run("env", str(tmp_path / "online-again"), "--python", sys.executable) == 1
    assert "uv failed" in capsys.readouterr().err  # the index is gone indeed
    assert p.run("env", str(tmp_path / "offline"), "--python", sys.executable, "--offline") == 0
    site = next((tmp_path / "offline").glob("lib/*/site-packages"))
    assert (site / "torch" / "__init__.py").read_text() == "VERSION = '2.11.0'\n"
    assert p.run("verify", str(site)) == 0


@pytest.mark.network
@pytest.mark.e2e
@pytest.mark.slow
def test_real_env_of_the_repository_is_verified(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The committed lock installed for real (about 3.7 GB of wheels the first time) with
    the built vLLM and pthfa wheels of the default store, with the Python this machine has
    (the recipe's where it is here, else another the lock covers); verify accepts the
    result."""
    from qwen38build.cli import main
    from qwen38build.engine.plan import make_plan
    from qwen38build.errors import UsageError
    from qwen38build.inputs import lock
    from qwen38build.pinning import universal
    from qwen38build.store.store import default_root
    from qwen38build.wheels.venv import built_wheels

    repo = Path(__file__).resolve().parents[1]
    loaded = recipe.load(repo / "recipe.toml")
    try:
        built_wheels(loaded, Store(default_root()))
    except UsageError as exc:
        pytest.skip(f"not built in the default store: {exc}")
    dest = tmp_path / "env"
    argv = ["--recipe", str(repo / "recipe.toml"), "env", str(dest)]
    assert main([*argv, "--json"]) == 0
    made = json.loads(capsys.readouterr().out)
    covered = universal.covered(envlock.pylock_path(repo).read_text())
    assert covered.contains(made["python_version"])
    build = make_plan(loaded, lock.read(repo)).build_hash
    site = made["site_packages"]
    assert main(["--recipe", str(repo / "recipe.toml"), "verify", site, "--build", build]) == 0
    assert main([*argv, "--offline"]) == 0  # again, from uv's cache
