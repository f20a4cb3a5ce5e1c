"""Substitution from a real nginx, and every way a cache can fail or lie: the build goes on
locally, with one warning line, and nothing the cache sent that failed a check is stored."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from qwen38build.cache import substituter
from qwen38build.cache.signing import SecretKey, sign_record, write_key_pair
from qwen38build.cli import main
from qwen38build.engine import executor
from qwen38build.engine.step import Step
from qwen38build.store.entry import Entry
from tests import cache_fixtures as cf
from tests.conftest import Project
from tests.engine_fixtures import relist_pthfa


@pytest.fixture(autouse=True)
def no_user_cache_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine's own cache settings must not leak into the tests, nor the tests'
    (``--offline`` sets QWEN38BUILD_OFFLINE for the process) into later ones: set to empty
    (which means "not set") so that monkeypatch restores each afterwards."""
    monkeypatch.setenv("QWEN38BUILD_CONFIG", str(tmp_path / "no-config.toml"))
    for var in ("QWEN38BUILD_SUBSTITUTERS", "QWEN38BUILD_TRUSTED_PUBLIC_KEYS",
                "QWEN38BUILD_OFFLINE", "QWEN38BUILD_CACHE_TIMEOUT",
                "QWEN38BUILD_SECRET_KEY_FILE", "QWEN38BUILD_CACHE_AUTH"):
        monkeypatch.setenv(var, "")


@dataclass
class Pushed:
    """A project built on store A and pushed to nginx, whose files lie under ``root``."""

    project: Project
    url: str
    root: Path
    key: SecretKey
    key_file: Path
    build: dict[str, str]
    digests: list[str]  # the closure, dependencies first

    @property
    def trusted(self) -> str:
        return str(self.key.public())

    def wheel_bytes(self) -> bytes:
        return Path(self.build["wheel"]).read_bytes()

    def build_on(self, store: Path, *flags: str) -> int:
        return main(["--recipe", str(self.project.root / "recipe.toml"), "--store", str(store),
                     *flags, "build", "--json", "--no-link"])


def make_key(tmp: Path, name: str = "q38-test-1") -> tuple[SecretKey, Path]:
    key = SecretKey.generate(name)
    tmp.mkdir(parents=True, exist_ok=True)
    write_key_pair(key, tmp / f"{name}.sec", tmp / f"{name}.pub")
    return key, tmp / f"{name}.sec"


@pytest.fixture
def pushed(project: Project, tmp_path: Path, capsys: pytest.CaptureFixture[str]
           ) -> Iterator[Pushed]:
    key, key_file = make_key(tmp_path / "keys")
    with cf.nginx(tmp_path / "cache", tmp_path / "nginx") as url:
        assert project.run("build", "--json", "-q") == 0
        build = json.loads(capsys.readouterr().out)
        assert project.run("push", url, "--key", str(key_file), "--json", "-q") == 0
        result = json.loads(capsys.readouterr().out)
        yield Pushed(project, url, tmp_path / "cache", key, key_file, build, result["sent"])


@pytest.fixture
def built_steps(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the steps that ran locally (every _build call), in order."""
    ran: list[str] = []
    real = executor._build

    def counting(step: Step, *args: object) -> Entry:
        ran.append(step.kind)
        return real(step, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(executor, "_build", counting)
    return ran


def test_machine_b_substitutes_everything_from_nginx_and_runs_no_step(
        pushed: Pushed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # Layout: a signed <digest>.json per step and its outputs under <digest>/.
    assert len(pushed.digests) == 3  # fetch, patch, wheel
    for d in pushed.digests:
        record = json.loads((pushed.root / f"{d}.json").read_text())
        assert record["digest"] == d and record["signatures"][0].startswith("q38-test-1:")
        for name, out in record["outputs"].items():
            assert (pushed.root / d / name).stat().st_size == out["size"]
    # Machine B: an empty store, no GNU patch on PATH, no local copy of the vLLM wheel,
    # and any local build fails the test.
    empty_bin = tmp_path / "empty-bin"
    empty_bin.mkdir()
    monkeypatch.setenv("PATH", str(empty_bin))
    monkeypatch.setenv("QWEN38BUILD_SOURCES", str(tmp_path / "no-wheels-here"))

    def no_build(*args: object, **kwargs: object) -> None:
        raise AssertionError("a step ran on machine B")

    monkeypatch.setattr(executor, "_build", no_build)
    store_b = tmp_path / "store-b"
    rc = pushed.build_on(store_b, "--substituter", pushed.url,
                         "--trusted-public-key", pushed.trusted)
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    b = json.loads(captured.out)
    assert b["build"] == pushed.build["build"]
    assert Path(b["wheel"]).read_bytes() == pushed.wheel_bytes()
    assert "substituted from" in captured.err and "warning" not in captured.err
    assert sorted(p.name for p in (store_b / "objects").glob("*.json")) == sorted(
        f"{d}.json" for d in pushed.digests)
    assert not any((store_b / "tmp").iterdir())
    # And the store check agrees that every substituted entry is intact.
    assert main(["--store", str(store_b), "store", "verify"]) == 0


def test_environment_variables_configure_the_substituter(
        pushed: Pushed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        built_steps: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("QWEN38BUILD_SUBSTITUTERS", pushed.url)
    monkeypatch.setenv("QWEN38BUILD_TRUSTED_PUBLIC_KEYS", pushed.trusted)
    monkeypatch.setattr(substituter, "BIG", 1)  # every download reports its progress
    assert pushed.build_on(tmp_path / "store-b") == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["build"] == pushed.build["build"]
    assert built_steps == []
    assert "downloading" in captured.err and "% of" in captured.err


def test_a_config_file_configures_the_substituter(
        pushed: Pushed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        built_steps: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[cache]\nsubstituters = ["{pushed.url}"]\n'
                   f'trusted-public-keys = ["{pushed.trusted}"]\n')
    monkeypatch.setenv("QWEN38BUILD_CONFIG", str(cfg))
    monkeypatch.delenv("QWEN38BUILD_SUBSTITUTERS")  # set, even empty, they would win
    monkeypatch.delenv("QWEN38BUILD_TRUSTED_PUBLIC_KEYS")
    assert pushed.build_on(tmp_path / "store-b") == 0
    assert built_steps == []
    capsys.readouterr()
    # --offline wins over the file: nothing is asked, everything is built.
    assert pushed.build_on(tmp_path / "store-c", "--offline") == 0
    assert built_steps == ["fetch", "patch", "wheel"]


def test_offline_never_touches_the_network(
        pushed: Pushed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    with cf.fault_server(pushed.root) as server:
        monkeypatch.setenv("QWEN38BUILD_SUBSTITUTERS", server.url)
        monkeypatch.setenv("QWEN38BUILD_TRUSTED_PUBLIC_KEYS", pushed.trusted)
        assert pushed.build_on(tmp_path / "store-b", "--offline") == 0
        monkeypatch.setenv("QWEN38BUILD_OFFLINE", "1")
        assert pushed.build_on(tmp_path / "store-c") == 0
        assert server.requests == []
        assert "warning" not in capsys.readouterr().err


def test_an_untrusted_cache_is_never_used(
        pushed: Pushed, tmp_path: Path, built_steps: list[str],
        capsys: pytest.CaptureFixture[str]) -> None:
    other, _ = make_key(tmp_path / "other", "q38-other-1")
    assert pushed.build_on(tmp_path / "store-b", "--substituter", pushed.url,
                           "--trusted-public-key", str(other.public())) == 0
    err = capsys.readouterr().err
    assert built_steps == ["fetch", "patch", "wheel"]
    assert err.count("warning:") == 3 and "signed by: q38-test-1" in err


# -- faults: the cache misbehaves as a whole ----------------------------------------------


def _record_of(pushed: Pushed, index: int) -> str:
    return f"{pushed.digests[index]}.json"


WHOLE_CACHE_FAULTS: dict[str, Callable[[Pushed], dict[str, cf.Fault]]] = {
    "slow": lambda p: {".json": cf.slow(3.0)},
    "trickling": lambda p: {".json": cf.trickle},
    "500": lambda p: {".json": cf.status(500)},
    "503 on an output": lambda p: {".whl": cf.status(503)},
    "garbage": lambda p: {".json": cf.garbage},
    "truncated": lambda p: {".whl": cf.truncated},
}


@pytest.mark.parametrize("fault", sorted(WHOLE_CACHE_FAULTS))
def test_a_failing_cache_costs_one_warning_and_the_build_goes_on(
        fault: str, pushed: Pushed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        built_steps: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("QWEN38BUILD_CACHE_TIMEOUT", "0.5")
    with cf.fault_server(pushed.root) as server:
        server.faults = WHOLE_CACHE_FAULTS[fault](pushed)
        store_b = tmp_path / "store-b"
        rc = pushed.build_on(store_b, "--substituter", server.url,
                             "--trusted-public-key", pushed.trusted)
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert json.loads(captured.out)["build"] == pushed.build["build"]
    assert Path(json.loads(captured.out)["wheel"]).read_bytes() == pushed.wheel_bytes()
    warnings = [line for line in captured.err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and server.url in warnings[0], captured.err
    assert "wheel" in built_steps  # the step the cache failed on was built here
    assert not any((store_b / "tmp").iterdir())


TRICKLES: dict[str, dict[str, cf.Fault]] = {
    "record headers": {".json": cf.trickle_headers},
    "record body": {".json": cf.trickle},
    "output headers": {".whl": cf.trickle_headers},
    "output body": {".whl": cf.trickle},
}


@pytest.mark.parametrize("where", sorted(TRICKLES))
def test_a_trickling_cache_cannot_hold_a_build_past_its_deadline(
        where: str, pushed: Pushed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        built_steps: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """A byte every 0.05-0.1 s never trips a per-read timeout of 0.5 s; the whole-transfer
    deadline (0.5 s + size at 1 MB/s: well under a second for these files) does. Without
    it the headers take ~13 s and the output's body minutes."""
    import time

    monkeypatch.setenv("QWEN38BUILD_CACHE_TIMEOUT", "0.5")
    with cf.fault_server(pushed.root) as server:
        server.faults = TRICKLES[where]
        start = time.monotonic()
        rc = pushed.build_on(tmp_path / "store-b", "--substituter", server.url,
                             "--trusted-public-key", pushed.trusted)
        elapsed = time.monotonic() - start
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert json.loads(captured.out)["build"] == pushed.build["build"]
    warnings = [line for line in captured.err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and server.url in warnings[0], captured.err
    assert "within" in warnings[0], warnings[0]
    assert elapsed < 6, f"{where}: a trickling cache held the build {elapsed:.1f}s"


def test_a_cache_that_is_down_costs_one_warning(
        pushed: Pushed, tmp_path: Path, built_steps: list[str],
        capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{cf.free_port()}/q38"  # nothing listens there
    assert pushed.build_on(tmp_path / "store-b", "--substituter", url,
                           "--trusted-public-key", pushed.trusted) == 0
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "warning" in line] == [
        line for line in err.splitlines() if f"cache {url} is unusable" in line]
    assert err.count("warning") == 1
    assert built_steps == ["fetch", "patch", "wheel"]


# -- faults: one entry lies; it is refused, the others are used --------------------------


def _resign(pushed: Pushed, index: int, change: Callable[[dict[str, object]], None],
            key: SecretKey | None) -> bytes:
    record = json.loads((pushed.root / _record_of(pushed, index)).read_text())
    change(record)
    if key is not None:
        record = sign_record(record, key)
    return json.dumps(record).encode()


def _same_name_other_key(pushed: Pushed, tmp: Path) -> SecretKey:
    return SecretKey.generate(pushed.key.name)


LYING_ENTRIES: dict[str, Callable[[Pushed, Path], dict[str, cf.Fault]]] = {
    # The top step's record signed by a key of the trusted name but another secret.
    "wrong signature": lambda p, t: {_record_of(p, 2): cf.serve(
        _resign(p, 2, lambda r: None, _same_name_other_key(p, t)))},
    "unsigned": lambda p, t: {_record_of(p, 2): cf.serve(
        _resign(p, 2, lambda r: r.update(signatures=[]), None))},
    "signed, then edited": lambda p, t: {_record_of(p, 2): cf.serve(
        _resign(p, 2, lambda r: r["derivation"].update(name="evil"), None))},  # type: ignore[attr-defined]
    # A true, signed record of another step served under the top step's digest.
    "record for another digest": lambda p, t: {_record_of(p, 2): cf.serve(
        (p.root / _record_of(p, 1)).read_bytes())},
    # The signed record is honest; the wheel's bytes are not.
    "output hash mismatch": lambda p, t: {f"/{p.digests[2]}/": cf.flip_last_byte},
    # A signed record whose output claims a path outside the entry.
    "output path escapes": lambda p, t: {_record_of(p, 2): cf.serve(_resign(
        p, 2, lambda r: r.update(outputs={"../../evil.py": {
            "sha256": "0" * 64, "size": 1, "executable": False}}), p.key))},
}


@pytest.mark.parametrize("lie", sorted(LYING_ENTRIES))
def test_a_poisoned_entry_is_refused_and_never_stored(
        lie: str, pushed: Pushed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        built_steps: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with cf.fault_server(pushed.root) as server:
        server.faults = LYING_ENTRIES[lie](pushed, tmp_path)
        store_b = tmp_path / "store-b"
        rc = pushed.build_on(store_b, "--substituter", server.url,
                             "--trusted-public-key", pushed.trusted)
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    out = json.loads(captured.out)
    assert out["build"] == pushed.build["build"]
    # The wheel in store B is the honest one, built here; the lie never landed.
    assert Path(out["wheel"]).read_bytes() == pushed.wheel_bytes()
    assert built_steps == ["wheel"]
    warnings = [line for line in captured.err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "refused" in warnings[0], captured.err
    assert pushed.digests[2][:12] in warnings[0]
    assert not any((store_b / "tmp").iterdir())
    assert not (tmp_path / "evil.py").exists() and not (store_b / "evil.py").exists()


# -- kernels ------------------------------------------------------------------------------


def test_kernel_outputs_push_and_substitute_without_compiling(
        project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The cubins (one step per arch) and the pthfa wheel go through the cache like the
    rest, with the toolchain they were made with; machine B runs no compiler at all."""
    log = tmp_path / "nvcc.log"  # the project's stand-in toolchain logs every call here
    csrc = project.root / "pthfa" / "csrc"
    csrc.mkdir(parents=True)
    (csrc / "tiny.cu").write_text('extern "C" __global__ void k(float* x) { x[0] = 1; }\n')
    pkg = project.root / "pthfa" / "python" / "pthfa"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""tiny"""\n')
    relist_pthfa(project.root)
    key, key_file = make_key(tmp_path / "keys")
    with cf.nginx(tmp_path / "cache", tmp_path / "nginx") as url:
        assert project.run("kernels", "--json", "-q", "-j", "1") == 0
        a = json.loads(capsys.readouterr().out)
        assert log.read_text().count("-cubin") == 2
        assert project.run("push", url, a["build"], "--key", str(key_file), "--json") == 0
        sent = json.loads(capsys.readouterr().out)["sent"]
        assert len(sent) >= 3  # two cubins and the wheel, with the toolchain they came from
        log.unlink()
        rc = main(["--recipe", str(project.root / "recipe.toml"), "--store",
                   str(tmp_path / "store-b"), "--substituter", url,
                   "--trusted-public-key", str(key.public()), "kernels", "--json", "-q"])
        captured = capsys.readouterr()
    assert rc == 0, captured.err
    b = json.loads(captured.out)
    assert b["build"] == a["build"] and b["cubins"] == a["cubins"]
    assert Path(b["wheel"]).read_bytes() == Path(a["wheel"]).read_bytes()
    assert not log.exists()  # no compiler ran on machine B, not even for its version


def test_offline_fetches_nothing_from_the_index_either(
        project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("QWEN38BUILD_SOURCES", str(tmp_path / "no-wheels-here"))

    def no_pip(*args: object, **kwargs: object) -> None:
        raise AssertionError("pip ran offline")

    monkeypatch.setattr("qwen38build.steps.fetch.pip_download", no_pip)
    assert project.run("--offline", "build") == 1
    assert "offline mode forbids fetching it" in capsys.readouterr().err
    assert not list((project.store / "objects").glob("*.json"))


def test_substitution_is_top_down_a_kernels_build_fetches_only_the_kernels(
        project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """As Nix substitutes: the requested outputs are asked for first, and a step whose
    outputs come from the cache needs none of its build inputs. ``build --only pthfa`` on a
    machine with an empty store fetches the pthfa wheel (the cubins are inside it), not the
    cubin steps, the toolchain nor the compiler wheels; with only the kernel entries in the
    cache it still builds nothing, and with no pip or compiler to reach."""
    from tests.engine_fixtures import add_pthfa_sources

    add_pthfa_sources(project.root)
    key, key_file = make_key(tmp_path / "keys")
    with cf.nginx(tmp_path / "cache", tmp_path / "nginx") as url:
        assert project.run("build", "--only", "pthfa", "--json", "-q", "--no-link") == 0
        a = json.loads(capsys.readouterr().out)
        assert project.run("push", url, a["build"], "--key", str(key_file), "--json") == 0
        capsys.readouterr()
        kinds = {}
        for record in (tmp_path / "cache").glob("*.json"):
            kinds[record.stem] = json.loads(record.read_text())["derivation"]["kind"]
        assert sorted(set(kinds.values())) == ["cubin", "fetch", "pthfa-wheel", "toolchain"]
        monkeypatch.setenv("QWEN38BUILD_SOURCES", str(tmp_path / "no-wheels-here"))
        monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))

        def no_build(*args: object, **kwargs: object) -> None:
            raise AssertionError("a step ran on machine B")

        monkeypatch.setattr(executor, "_build", no_build)
        for cache_holds in ("everything", "kernels only"):
            if cache_holds == "kernels only":
                for digest, kind in kinds.items():
                    if kind in ("fetch", "toolchain"):
                        (tmp_path / "cache" / f"{digest}.json").unlink()
            store_b = tmp_path / f"store-b-{cache_holds.replace(' ', '-')}"
            rc = main(["--recipe", str(project.root / "recipe.toml"), "--store", str(store_b),
                       "--substituter", url, "--trusted-public-key", str(key.public()),
                       "build", "--only", "pthfa", "--json", "-q", "--no-link"])
            captured = capsys.readouterr()
            assert rc == 0, captured.err
            assert json.loads(captured.out)["build"] == a["build"]
            held = {json.loads(p.read_text())["derivation"]["kind"]
                    for p in (store_b / "objects").glob("*.json")}
            assert held == {"pthfa-wheel"}, cache_holds


def test_a_credential_reaches_only_the_cache_it_names(
        pushed: Pushed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Two caches asked in order, a credential for the second only: the first (another
    host, say an untrusted mirror) never sees it; the second gets it on every request."""
    with cf.fault_server(tmp_path / "empty") as first, \
            cf.fault_server(pushed.root) as second:
        monkeypatch.setenv("QWEN38BUILD_CACHE_AUTH", f"{second.url}=Bearer s3cret\n")
        rc = pushed.build_on(tmp_path / "store-b", "--substituter", first.url,
                             "--substituter", second.url,
                             "--trusted-public-key", pushed.trusted)
        assert rc == 0, capsys.readouterr().err
        assert first.requests and set(first.auths) == {None}
        assert second.requests and set(second.auths) == {"Bearer s3cret"}


@pytest.mark.parametrize("value", ["Bearer s3cret", "cache.example.org=Bearer x",
                                   "https://cache.example.org/q38="])
def test_a_credential_not_scoped_to_a_cache_is_bad_input(
        project: Project, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        value: str) -> None:
    monkeypatch.setenv("QWEN38BUILD_CACHE_AUTH", value)
    assert project.run("build", "--no-link", "-q") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: $QWEN38BUILD_CACHE_AUTH: line 1 is not URL=VALUE")
    assert not (project.store / "objects").exists()
