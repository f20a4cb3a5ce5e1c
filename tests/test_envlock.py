"""The environment lock: made by uv from the pin's METADATA, the torch/pin contradiction
refused, the lock checked (missing, edited, stale) without network, what moved on a bump."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
import tomllib
from pathlib import Path
from typing import Any

import pytest

from qwen38build.bump import bump
from qwen38build.bump import report as bumpreport
from qwen38build.errors import LockError, RecipeError
from qwen38build.inputs import lock, recipe
from qwen38build.inputs import lock as lockmod
from qwen38build.pinning import envmove
from qwen38build.pinning import pylock as envlock
from qwen38build.pinning import sources as locking
from qwen38build.store.store import Store
from tests.conftest import Project
from tests.env_fixtures import PIN_REQUIRES, env_project

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def proj(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Project:
    return env_project(tmp_path, monkeypatch)


def loaded(p: Project) -> recipe.LoadedRecipe:
    return recipe.load(p.root / "recipe.toml")


def test_lock_holds_the_pins_runtime_requirements_cupy_and_torch_with_hashes(
    proj: Project,
) -> None:
    path = locking.relock_env(loaded(proj), Store(proj.store))
    assert path == proj.root / "lock" / "pylock.toml"
    text = path.read_text()
    # extras and other machines' requirements are left out; tinydep comes through torch too
    assert envlock.packages_of(text, "x") == {
        "torch": "2.11.0", "tinydep": "1.2.0", "cupy-cuda13x": "14.2.0"}
    assert text.startswith(envlock.HEADER) and text.count("sha256 = ") == 3
    record = json.loads((proj.root / "lock" / "pylock.inputs.json").read_text())
    assert record["inputs"]["torch"] == "2.11.0"
    assert record["inputs"]["extra"] == ["cupy-cuda13x", "torch==2.11.0"]
    assert record["requirements"][:2] == ["torch==2.11.0", "tinydep>=1"]
    assert envlock.check(loaded(proj)) == path


def test_torch_the_pin_excludes_is_refused_in_one_line_before_uv_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    p = env_project(tmp_path, monkeypatch, requires=("torch==2.13.0",), torch="2.11.0")

    def no_uv(*args: object, **kwargs: object) -> str:
        raise AssertionError("uv ran although the recipe contradicts the pin")

    monkeypatch.setattr(envlock, "uv", no_uv)
    # the sources are pinned already; lock's own fetch through pip is not what is tested
    monkeypatch.setattr(locking, "pin_sources", lambda ld, st: list(lockmod.read(ld.root).values()))
    sources = p.root / "lock" / "sources.json"
    before = (sources.read_bytes(), sources.stat().st_ino, sources.stat().st_mtime_ns)
    assert p.run("lock") == 2
    err = capsys.readouterr().err
    first = err.splitlines()[0]
    assert first.startswith("error: ") and err.count("\n") == 1
    assert '[toolchain] torch = "2.11.0"' in first and "requires torch==2.13.0" in first
    assert 'set torch = "2.13.0"' in first
    assert not (p.root / "lock" / "pylock.toml").exists()
    # exit 2 means nothing was written: lock/sources.json is the same file, untouched
    assert (sources.read_bytes(), sources.stat().st_ino, sources.stat().st_mtime_ns) == before


def test_torch_the_pin_allows_by_a_range_is_accepted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = env_project(tmp_path, monkeypatch, requires=("torch>=2.10,<2.12",), torch="2.11.0")
    locking.relock_env(loaded(p), Store(p.store))
    assert envlock.packages_of(envlock.pylock_path(p.root).read_text(), "x")["torch"] == "2.11.0"


def test_missing_lock_is_bad_input_naming_the_file(
    proj: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    assert proj.run("lock", "--check") == 2
    err = capsys.readouterr().err
    assert "lock/pylock.toml: missing" in err and "qwen38build lock" in err


def test_edited_lock_is_named(proj: Project, capsys: pytest.CaptureFixture[str]) -> None:
    path = locking.relock_env(loaded(proj), Store(proj.store))
    assert proj.run("lock", "--check") == 0
    path.write_text(path.read_text().replace('version = "1.2.0"', 'version = "1.3.0"'))
    assert proj.run("lock", "--check") == 2
    err = capsys.readouterr().err
    assert f"{path}: its content changed since it was locked" in err


@pytest.mark.parametrize(("old", "new", "says"), [
    ('cuda = "13.0"', 'cuda = "12.8"', "cuda '13.0' → '12.8'"),
    ('torch = "2.11.0"', 'torch = "2.11.1"', "torch '2.11.0' → '2.11.1'"),
])
def test_stale_lock_names_what_changed(
    proj: Project, capsys: pytest.CaptureFixture[str], old: str, new: str, says: str
) -> None:
    locking.relock_env(loaded(proj), Store(proj.store))
    recipe_toml = proj.root / "recipe.toml"
    recipe_toml.write_text(recipe_toml.read_text().replace(old, new))
    with pytest.raises(LockError) as info:
        envlock.check(loaded(proj))
    assert "lock/pylock.toml: stale" in str(info.value) and says in str(info.value)
    assert proj.run("lock", "--check") == 2
    # A new CUDA series is stale in lock/sources.json too (the toolchain), named first.
    err = capsys.readouterr().err
    assert says in err or "[toolchain] cuda = '12.8'" in err


def test_an_edited_inputs_record_is_named(proj: Project) -> None:
    locking.relock_env(loaded(proj), Store(proj.store))
    side = envlock.inputs_path(proj.root)
    record = json.loads(side.read_text())
    record["inputs"]["cuda"] = "12.8"
    side.write_text(json.dumps(record))
    with pytest.raises(LockError, match=r"pylock.inputs.json: not a valid inputs record "
                       r"\(its inputs do not hash to its inputs_digest"):
        envlock.check(loaded(proj))


def test_a_new_pin_wheel_makes_the_lock_stale(proj: Project) -> None:
    locking.relock_env(loaded(proj), Store(proj.store))
    sources = proj.root / "lock" / "sources.json"
    data = json.loads(sources.read_text())
    next(e for e in data["sources"] if e["name"] == "vllm")["sha256"] = "1" * 64
    sources.write_text(json.dumps(data))
    with pytest.raises(LockError, match="vllm_sha256"):
        envlock.check(loaded(proj))


def test_a_lock_entry_without_a_hash_is_refused() -> None:
    text = '[[packages]]\nname = "x"\nversion = "1"\nwheels = [{ url = "file:///x.whl" }]\n'
    with pytest.raises(LockError, match=r"packages\[0\] \(x\) has a file without a hash"):
        envlock.packages_of(text, "pylock.toml")


def test_platform_tag_maps_to_uvs_platform() -> None:
    assert envlock.uv_platform("manylinux_2_28_x86_64") == "x86_64-manylinux_2_28"
    assert envlock.uv_platform("manylinux_2_39_aarch64") == "aarch64-manylinux_2_39"
    with pytest.raises(Exception, match="manylinux_X_Y"):
        envlock.uv_platform("win_amd64")
    assert envlock.cupy_requirement("13.0") == "cupy-cuda13x"
    assert envlock.cupy_requirement("12.8") == "cupy-cuda12x"


# -- what moved ---------------------------------------------------------------------------


def pylock(packages: dict[str, str]) -> str:
    return 'lock-version = "1.0"\n' + "".join(
        f'\n[[packages]]\nname = "{n}"\nversion = "{v}"\n'
        f'wheels = [{{ url = "file:///{n}.whl", hashes = {{ sha256 = "{"0" * 64}" }} }}]\n'
        for n, v in packages.items())


OLD = {"numpy": "2.3.0", "torch": "2.13.0", "triton": "3.7.1", "zeta": "1.0", "gone": "0.1"}
NEW = {"numpy": "2.3.0", "torch": "2.14.0", "triton": "3.8.0", "zeta": "1.0.0", "added": "2.0"}


def test_diff_names_torch_and_triton_first_and_what_was_added_or_removed() -> None:
    move = envmove.diff(envlock.packages_of(pylock(OLD), "old"),
                        envlock.packages_of(pylock(NEW), "new"))
    assert move.changed == (("torch", "2.13.0", "2.14.0"), ("triton", "3.7.1", "3.8.0"))
    assert move.added == (("added", "2.0"),) and move.removed == (("gone", "0.1"),)
    assert move.unchanged == 2  # numpy, and zeta (1.0 == 1.0.0)
    assert move.lines()[:2] == ["- torch 2.13.0 → 2.14.0", "- triton 3.7.1 → 3.8.0"]


WHEEL = lock.LockedWheel("vllm", "0.33.0", "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl",
                         "cp38", "abi3", "manylinux_2_28_x86_64", "0" * 64, 1)


def test_bump_report_says_what_moved_in_markdown_and_json() -> None:
    move = envmove.diff(OLD, NEW)
    report = bumpreport.BumpReport(
        "0.32.0", "0.33.0", WHEEL, [], dry_run=True,
        environment=bumpreport.EnvReport(move, torch=("2.13.0", "2.14.0")),
    )
    md = report.to_markdown()
    assert "### Python environment (lock/pylock.toml)" in md
    assert "- recipe [toolchain] torch 2.13.0 → 2.14.0" in md
    assert "- triton 3.7.1 → 3.8.0\n- added added 2.0\n- removed gone 0.1" in md
    env: Any = report.to_json()["environment"]
    assert env["moved"]["changed"][0] == {"name": "torch", "from": "2.13.0", "to": "2.14.0"}
    assert env["moved"]["removed"] == [{"name": "gone", "version": "0.1"}]
    assert env["recipe_torch"] == {"from": "2.13.0", "to": "2.14.0"}


def test_bump_relocks_the_environment_for_the_new_pin(
    proj: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new pin requires torch 2.13.0: the lock moves torch, the recipe's torch with it;
    the dry run writes nothing, the real one writes recipe and both locks."""
    from tests.engine_fixtures import make_wheel

    locking.relock_env(loaded(proj), Store(proj.store))
    new_reqs = ["torch==2.13.0", "tinydep>=1", "cupy-cuda13x"]
    make_wheel(proj.wheels, version="0.0.2", requires=new_reqs)
    lock_dir = proj.root / "lock"
    before = {p.name: p.read_bytes() for p in lock_dir.iterdir()}
    dry = bump.bump(loaded(proj), Store(proj.store), "0.0.2", dry_run=True)
    assert dry.environment is not None and dry.environment.move is not None
    assert dry.environment.move.changed == (("torch", "2.11.0", "2.13.0"),)
    assert dry.environment.torch == ("2.11.0", "2.13.0")
    assert {p.name: p.read_bytes() for p in lock_dir.iterdir()} == before
    bump.bump(loaded(proj), Store(proj.store), "0.0.2", dry_run=False)
    after = loaded(proj)
    assert (after.recipe.vllm.version, after.recipe.toolchain.torch) == ("0.0.2", "2.13.0")
    assert envlock.check(after) == envlock.pylock_path(proj.root)


def test_bump_without_an_environment_lock_reports_none(proj: Project) -> None:
    from tests.engine_fixtures import make_wheel

    make_wheel(proj.wheels, version="0.0.2", requires=PIN_REQUIRES)
    report = bump.bump(loaded(proj), Store(proj.store), "0.0.2", dry_run=True)
    assert report.environment is None and report.to_json()["environment"] is None


# -- the real one ---------------------------------------------------------------------------


def test_committed_lock_is_current_for_the_recipe() -> None:
    """No network: the repository's lock/pylock.toml matches recipe.toml and sources.json."""
    assert envlock.check(recipe.load(REPO / "recipe.toml")).name == "pylock.toml"


@pytest.mark.network
@pytest.mark.e2e
def test_real_lock_resolves_to_the_committed_packages(tmp_path: Path) -> None:
    for name in ("recipe.toml", "lock"):
        src = REPO / name
        (shutil.copytree if src.is_dir() else shutil.copyfile)(src, tmp_path / name)
    for d in ("patches", "kvarn"):
        shutil.copytree(REPO / d, tmp_path / d)
    ld = recipe.load(tmp_path / "recipe.toml")
    from qwen38build.store.store import default_root

    locking.relock_env(ld, Store(default_root()))
    got = envlock.packages_of(envlock.pylock_path(tmp_path).read_text(), "new")
    want = envlock.packages_of(envlock.pylock_path(REPO).read_text(), "committed")
    assert got["torch"] == "2.13.0" and "cupy-cuda13x" in got
    assert set(got) == set(want)


def test_environment_platform_of_the_recipe_is_the_locks_target(
    proj: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe_toml = proj.root / "recipe.toml"
    recipe_toml.write_text(recipe_toml.read_text()
                           + '\n[environment]\nplatform = "manylinux_2_31_aarch64"\n')
    seen: list[str] = []
    real_uv = envlock.uv

    def spy(args: list[str], *, what: str) -> str:
        if args[0] == "lock":  # the project uv locks, as it is when uv reads it
            seen.append((Path(args[args.index("--project") + 1]) / "pyproject.toml").read_text())
        return real_uv(args, what=what)

    monkeypatch.setattr(envlock, "uv", spy)
    locking.relock_env(loaded(proj), Store(proj.store))
    project = tomllib.loads(seen[0])
    want = "sys_platform == 'linux' and platform_machine == 'aarch64'"
    assert project["tool"]["uv"]["environments"] == [want]
    assert project["tool"]["uv"]["no-build"] is True
    record = json.loads(envlock.inputs_path(proj.root).read_text())
    assert record["inputs"]["platform"] == "manylinux_2_31_aarch64"
    recipe_toml.write_text(recipe_toml.read_text().replace("manylinux_2_31_aarch64", "linux"))
    with pytest.raises(RecipeError, match=r"environment\.platform: 'linux' is not a manylinux"):
        loaded(proj)


def test_a_requirement_with_no_wheel_is_not_locked_from_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    p = env_project(tmp_path, monkeypatch, requires=(*PIN_REQUIRES, "onlysource"))
    data = b"Metadata-Version: 2.1\nName: onlysource\nVersion: 1.0\n"
    with tarfile.open(tmp_path / "index" / "onlysource-1.0.tar.gz", "w:gz") as tar:
        info = tarfile.TarInfo("onlysource-1.0/PKG-INFO")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    monkeypatch.setattr(locking, "pin_sources", lambda ld, st: list(lockmod.read(ld.root).values()))
    assert p.run("lock") == 1
    err = capsys.readouterr().err
    assert "uv failed to lock the Python environment" in err and "onlysource" in err
    assert not envlock.pylock_path(p.root).exists()


@pytest.mark.parametrize("how", ["global", "bump", "env"])
def test_bump_offline_never_touches_the_network_and_says_it_did_not_relock(
    proj: Project, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    from qwen38build.steps import fetch as fetchstep
    from tests.engine_fixtures import make_wheel

    locking.relock_env(loaded(proj), Store(proj.store))
    wheel = make_wheel(proj.wheels, version="0.0.2", requires=PIN_REQUIRES)

    def network(*args: object, **kwargs: object) -> str:
        raise AssertionError(f"the network was asked for: {args}")

    monkeypatch.setattr(envlock, "uv", network)
    monkeypatch.setattr(fetchstep, "pip_download", network)
    if how == "env":
        monkeypatch.setenv("QWEN38BUILD_OFFLINE", "1")

    def bump_to(version: str) -> list[str]:
        argv = ["bump", "vllm", version, "--dry-run"]
        return {"global": ["--offline", *argv], "bump": [*argv, "--offline"], "env": argv}[how]

    assert proj.run(*bump_to("0.0.2")) == 0
    out = capsys.readouterr().out
    said = [line for line in out.splitlines() if "re-lock" in line]
    assert len(said) == 1 and "Not re-locked: offline" in said[0], out
    # A new wheel in no local store or folder: refused in one line, pip never run.
    wheel.unlink()
    assert proj.run(*bump_to("0.0.3")) == 1
    assert "offline mode forbids fetching it" in capsys.readouterr().err


def test_bump_relocks_a_pin_once_then_takes_the_lock_from_the_store(
    proj: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.engine_fixtures import make_wheel

    locking.relock_env(loaded(proj), Store(proj.store))
    make_wheel(proj.wheels, version="0.0.2", requires=["torch==2.13.0", "tinydep>=1"])
    calls: list[str] = []
    real = envlock.uv

    def counted(args: list[str], *, what: str) -> str:
        if args[0] == "lock":  # one lock per compute (then its export)
            calls.append(what)
        return real(args, what=what)

    monkeypatch.setattr(envlock, "uv", counted)

    def dry() -> bumpreport.EnvReport:
        env = bump.bump(loaded(proj), Store(proj.store), "0.0.2", dry_run=True).environment
        assert env is not None and env.move is not None
        return env

    first = dry()
    assert len(calls) == 1 and not first.cached
    again = dry()
    assert len(calls) == 1 and again.cached and again.move == first.move
    assert "locked by an earlier bump from the same inputs" in again.summary()
    monkeypatch.setenv("QWEN38BUILD_OFFLINE", "1")  # offline, the cached lock serves
    offline = dry()
    assert len(calls) == 1 and offline.cached and not offline.offline
    monkeypatch.delenv("QWEN38BUILD_OFFLINE")
    monkeypatch.setenv("UV_HTTP_TIMEOUT", "31")  # another uv configuration: another key
    assert not dry().cached and len(calls) == 2
    # the real bump writes the cached lock, and it is current for the moved recipe
    bump.bump(loaded(proj), Store(proj.store), "0.0.2", dry_run=False)
    assert len(calls) == 2
    assert envlock.check(loaded(proj)) == envlock.pylock_path(proj.root)


@pytest.mark.parametrize(("text", "says"), [
    (b'[packages]\nname = "x"\n', "packages must be an array of tables"),
    (b'[[packages]]\nname = "x"\nversion = "1"\nwheels = "x"\n', "wheels must be an array"),
    (b'[[packages]]\nname = "x"\nversion = "1"\nwheels = ["x"]\n', "each file must be a table"),
    (b'[[packages]]\nname = "x"\nversion = "1"\nwheels = [{ hashes = "x" }]\n',
     "has a file without a hash"),
    (b'packages = ["x"]\n', "packages[0] must be a table"),
    (b'# caf\xe9\n[[packages]]\n', "not UTF-8 text"),
], ids=["packages-a-table", "wheels-a-string", "wheel-a-string", "hashes-a-string",
        "package-a-string", "not-utf8"])
def test_a_malformed_lock_is_bad_input_in_one_line(
    proj: Project, capsys: pytest.CaptureFixture[str], text: bytes, says: str
) -> None:
    """Even with its recorded sha256 made to match (so only the shape can tell), a lock of
    the wrong shape is bad input (exit 2, one line), never an internal error."""
    import hashlib

    path = locking.relock_env(loaded(proj), Store(proj.store))
    path.write_bytes(text)
    side = envlock.inputs_path(proj.root)
    record = json.loads(side.read_text())
    record["pylock_sha256"] = hashlib.sha256(text).hexdigest()
    side.write_text(json.dumps(record))
    capsys.readouterr()
    assert proj.run("lock", "--check") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and says in err, err
    assert str(path) in err
