"""Cache settings: the user's file, then the environment, then flags; bad ones named."""

from __future__ import annotations

from pathlib import Path

import pytest

from qwen38build.cache import config as cacheconfig
from qwen38build.cache.signing import SecretKey
from qwen38build.cli import main
from qwen38build.errors import InputError

KEY_A = str(SecretKey.generate("a-1").public())
KEY_B = str(SecretKey.generate("b-1").public())


@pytest.fixture
def cfg_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "config.toml"
    monkeypatch.setenv(cacheconfig.ENV_CONFIG, str(path))
    return path


def test_no_file_means_no_cache() -> None:
    cfg = cacheconfig.load(env={cacheconfig.ENV_CONFIG: "/nonexistent/config.toml"})
    assert cfg.active == () and cfg.trusted_keys == ()


def test_file_then_environment_then_flags(cfg_file: Path) -> None:
    cfg_file.write_text('[cache]\nsubstituters = ["http://file.test/c/"]\n'
                        f'trusted-public-keys = ["{KEY_A}"]\ntimeout = 3\n')
    env = {cacheconfig.ENV_CONFIG: str(cfg_file)}
    cfg = cacheconfig.load(env=env)
    assert cfg.substituters == ("http://file.test/c",) and cfg.timeout == 3.0
    assert [str(k) for k in cfg.trusted_keys] == [KEY_A]
    env[cacheconfig.ENV_SUBSTITUTERS] = "http://env.test/a https://env.test/b"
    env[cacheconfig.ENV_KEYS] = KEY_B
    cfg = cacheconfig.load(env=env)
    assert cfg.substituters == ("http://env.test/a", "https://env.test/b")
    assert [str(k) for k in cfg.trusted_keys] == [KEY_B]
    cfg = cacheconfig.load(env=env, substituters=["http://flag.test/x"], trusted_keys=[KEY_A])
    assert cfg.substituters == ("http://flag.test/x",)
    assert [str(k) for k in cfg.trusted_keys] == [KEY_A]
    # An empty variable means "no cache", and offline silences every cache.
    assert cacheconfig.load(env={**env, cacheconfig.ENV_SUBSTITUTERS: ""}).active == ()
    assert cacheconfig.load(env={**env, cacheconfig.ENV_OFFLINE: "1"}).active == ()
    assert cacheconfig.load(env=env, offline=True).active == ()


@pytest.mark.parametrize(("text", "where"), [
    ('[cache]\nsubstituters = ["ftp://x/y"]\n', "cache.substituters"),
    ('[cache]\nsubstituters = "http://x/y"\n', "cache.substituters"),
    ('[cache]\ntrusted-public-keys = ["nope"]\n', "cache.trusted-public-keys"),
    ('[cache]\ntimeout = -1\n', "cache.timeout"),
    ('[cache]\nsubstituter = []\n', "cache.substituter"),
    ('cache = 3\n', "cache"),
    ('[cache\n', "cannot read"),
])
def test_a_bad_setting_is_named_with_its_file_and_key(cfg_file: Path, text: str,
                                                      where: str) -> None:
    cfg_file.write_text(text)
    with pytest.raises(InputError) as info:
        cacheconfig.load(env={cacheconfig.ENV_CONFIG: str(cfg_file)})
    assert str(info.value).startswith(f"{cfg_file}:") and where in str(info.value)


def test_a_bad_config_stops_a_build_with_exit_2_and_one_line(
        cfg_file: Path, capsys: pytest.CaptureFixture[str],
        project: object) -> None:
    cfg_file.write_text('[cache]\nsubstituters = ["not a url"]\n')
    assert main(["--recipe", "recipe.toml", "--store", str(cfg_file.parent / "s"),
                 "build", "--rebuild"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {cfg_file}:cache.substituters:") and "Traceback" not in err


def test_a_bad_flag_is_named(capsys: pytest.CaptureFixture[str], cfg_file: Path) -> None:
    with pytest.raises(InputError, match=r"^--trusted-public-key: "):
        cacheconfig.load(trusted_keys=["x"], env={})
    with pytest.raises(InputError, match=r"^--substituter: "):
        cacheconfig.load(substituters=["http://x/?q=1"], env={})
