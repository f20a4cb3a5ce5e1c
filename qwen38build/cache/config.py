"""Which binary caches this machine asks, and which keys it trusts.

A cache is a property of the machine, like Nix's ``substituters`` and
``trusted-public-keys``, so it lives in the user's configuration, never in recipe.toml.
Three layers, each replacing the one before it field by field:

1. the file ``<user config dir>/qwen38build/config.toml`` (or ``$QWEN38BUILD_CONFIG``)::

       [cache]
       substituters = ["https://cache.example/q38"]
       trusted-public-keys = ["q38-ci-1:BASE64..."]
       timeout = 10          # seconds per connect or read
       secret-key-file = "~/.config/qwen38build/q38-ci-1.sec"   # for push

2. environment variables: ``QWEN38BUILD_SUBSTITUTERS`` and
   ``QWEN38BUILD_TRUSTED_PUBLIC_KEYS`` (whitespace-separated; empty means none),
   ``QWEN38BUILD_CACHE_TIMEOUT``, ``QWEN38BUILD_SECRET_KEY_FILE``, ``QWEN38BUILD_OFFLINE``;
3. command-line flags: ``--substituter``, ``--trusted-public-key`` (repeatable), ``--offline``.

Offline means no cache is asked: nothing touches the network.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from qwen38build.cache.signing import PublicKey
from qwen38build.errors import InputError

ENV_CONFIG = "QWEN38BUILD_CONFIG"
ENV_SUBSTITUTERS = "QWEN38BUILD_SUBSTITUTERS"
ENV_KEYS = "QWEN38BUILD_TRUSTED_PUBLIC_KEYS"
ENV_TIMEOUT = "QWEN38BUILD_CACHE_TIMEOUT"
ENV_SECRET = "QWEN38BUILD_SECRET_KEY_FILE"
ENV_OFFLINE = "QWEN38BUILD_OFFLINE"
DEFAULT_TIMEOUT = 10.0
_KNOWN = {"substituters", "trusted-public-keys", "timeout", "secret-key-file"}


@dataclass(frozen=True)
class CacheConfig:
    substituters: tuple[str, ...] = ()
    trusted_keys: tuple[PublicKey, ...] = ()
    timeout: float = DEFAULT_TIMEOUT
    secret_key_file: Path | None = None
    offline: bool = False
    # Where each setting came from, for error messages: "FILE:cache.KEY", "$VAR", "--flag".
    origin: Mapping[str, str] = field(default_factory=dict)

    @property
    def active(self) -> tuple[str, ...]:
        """The caches to ask: none when offline."""
        return () if self.offline else self.substituters


def config_path() -> Path:
    env = os.environ.get(ENV_CONFIG)
    if env:
        return Path(env).expanduser()
    from platformdirs import user_config_dir

    return Path(user_config_dir("qwen38build")) / "config.toml"


def check_url(url: str, where: str) -> str:
    parts = urlsplit(url)
    try:
        port = parts.port  # ValueError when out of 0..65535 or not a number
    except ValueError:
        port = 0
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query \
            or parts.fragment or port == 0 or (port is None and parts.netloc.endswith(":")):
        raise InputError(
            f"{where}: {url!r} is not a cache URL; give http(s)://HOST[:PORT]/PREFIX "
            "(a port from 1 to 65535).",
            hint="a cache is any HTTP server that serves GET, HEAD and PUT under a prefix",
        )
    return url.rstrip("/")


_YES = ("1", "true", "yes", "on")
_NO = ("", "0", "false", "no", "off")


def _flag(value: str, where: str) -> bool:
    """A yes/no variable: 1/true/yes/on or 0/false/no/off (or empty); anything else is bad
    input, never silently "no" (QWEN38BUILD_OFFLINE=banana must not mean online)."""
    v = value.strip().lower()
    if v in _YES:
        return True
    if v in _NO:
        return False
    raise InputError(f"{where}: {value!r} is neither yes nor no.",
                     hint="give 1, true, yes or on (or 0, false, no, off, empty)")


def offline_env() -> bool:
    """Whether this process is offline (the CLI's ``--offline`` sets the variable too, so a
    step that would fetch from the network sees it); InputError for a value neither yes
    nor no."""
    return _flag(os.environ.get(ENV_OFFLINE, ""), f"${ENV_OFFLINE}")


def from_file(path: Path) -> CacheConfig:
    """The ``[cache]`` table of ``path``; an absent file is an empty configuration."""
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        return CacheConfig()
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise InputError(f"{path}: cannot read the configuration: {exc}.",
                         hint="fix the file, or point QWEN38BUILD_CONFIG elsewhere") from exc
    table: Any = data.get("cache", {})
    if not isinstance(table, dict):
        raise InputError(f"{path}:cache: must be a table.")
    unknown = sorted(set(table) - _KNOWN)
    if unknown:
        raise InputError(f"{path}:cache.{unknown[0]}: unknown setting.",
                         hint="known: " + ", ".join(sorted(_KNOWN)))
    cfg = CacheConfig()
    origin: dict[str, str] = {}

    def strings(key: str) -> list[str]:
        value = table.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise InputError(f"{path}:cache.{key}: must be a list of strings.")
        origin[key] = f"{path}:cache.{key}"
        return value

    subs = tuple(check_url(u, f"{path}:cache.substituters") for u in strings("substituters"))
    keys = tuple(PublicKey.parse(k, f"{path}:cache.trusted-public-keys")
                 for k in strings("trusted-public-keys"))
    cfg = replace(cfg, substituters=subs, trusted_keys=keys)
    if "timeout" in table:
        cfg = replace(cfg, timeout=_timeout(table["timeout"], f"{path}:cache.timeout"))
    if "secret-key-file" in table:
        value = table["secret-key-file"]
        if not isinstance(value, str):
            raise InputError(f"{path}:cache.secret-key-file: must be a path string.")
        cfg = replace(cfg, secret_key_file=Path(value).expanduser())
        origin["secret-key-file"] = f"{path}:cache.secret-key-file"
    return replace(cfg, origin=origin)


def _timeout(value: object, where: str) -> float:
    try:
        # A TOML boolean is not a number of seconds (float(True) would be 1).
        seconds = -1.0 if isinstance(value, bool) else float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        seconds = -1.0
    if not 0 < seconds <= 3600:
        raise InputError(f"{where}: timeout {value!r} must be a number of seconds in (0, 3600].")
    return seconds


def load(
    *, substituters: list[str] | None = None, trusted_keys: list[str] | None = None,
    offline: bool = False, env: Mapping[str, str] | None = None,
) -> CacheConfig:
    """The file, then the environment, then the flags given here (None: not given)."""
    env = os.environ if env is None else env
    cfg = from_file(config_path())
    origin = dict(cfg.origin)
    if ENV_SUBSTITUTERS in env:
        cfg = replace(cfg, substituters=tuple(
            check_url(u, f"${ENV_SUBSTITUTERS}") for u in env[ENV_SUBSTITUTERS].split()))
    if ENV_KEYS in env:
        cfg = replace(cfg, trusted_keys=tuple(
            PublicKey.parse(k, f"${ENV_KEYS}") for k in env[ENV_KEYS].split()))
    if env.get(ENV_TIMEOUT):
        cfg = replace(cfg, timeout=_timeout(env[ENV_TIMEOUT], f"${ENV_TIMEOUT}"))
    if env.get(ENV_SECRET):
        cfg = replace(cfg, secret_key_file=Path(env[ENV_SECRET]).expanduser())
        origin["secret-key-file"] = f"${ENV_SECRET}"
    if substituters is not None:
        cfg = replace(cfg, substituters=tuple(check_url(u, "--substituter")
                                              for u in substituters))
    if trusted_keys is not None:
        cfg = replace(cfg, trusted_keys=tuple(PublicKey.parse(k, "--trusted-public-key")
                                              for k in trusted_keys))
    off = _flag(env.get(ENV_OFFLINE, ""), f"${ENV_OFFLINE}") or offline
    from qwen38build.cache.transport import credentials

    credentials(env.get("QWEN38BUILD_CACHE_AUTH", ""))  # per cache, checked before any work
    return replace(cfg, offline=off, origin=origin)
