"""fetch: a fixed-output source, a wheel by name==version, checked against the lock's sha256.

The digest covers the expected sha256, so the output is known before it is fetched (Nix's
fixed-output derivation). The bytes come from a store that already holds them, or from pip,
so the user's own index configuration applies; a mismatch deletes the download.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from qwen38build.digest import copy_hashing
from qwen38build.errors import FetchError
from qwen38build.executor import Context

KIND = "fetch"
VERSION = 1


def run(ctx: Context) -> None:
    p = ctx.step.params
    filename, sha256 = str(p["filename"]), str(p["sha256"])
    dest = ctx.out / filename
    ctx.hashed[filename] = sha256  # every path below either checks these bytes or raises
    for candidate in ctx.source_candidates(sha256, filename):
        if _copy_checked(candidate, dest, sha256):
            ctx.report(f"taken from {candidate.parent}")
            return
    from qwen38build.cacheconfig import offline_env

    if offline_env():
        raise FetchError(
            f"{filename} is in no local store or sources folder, and offline mode forbids "
            "fetching it.", hint="run once without --offline, or set QWEN38BUILD_SOURCES")
    with tempfile.TemporaryDirectory(prefix="q38-fetch.") as tmp:
        got = pip_download(
            str(p["name"]), str(p["version"]), python=str(p["python"]),
            platform=str(p["platform"]), dest=Path(tmp),
        )
        if got.name != filename:
            raise FetchError(
                f"pip fetched {got.name} for {p['name']}=={p['version']}, but the lock "
                f"names {filename}.",
                hint="run `qwen38build lock` to re-pin, or check the recipe's platform tag",
            )
        if not _copy_checked(got, dest, sha256, downloaded=True):
            raise AssertionError("unreachable")


def _copy_checked(src: Path, dest: Path, sha256: str, *, downloaded: bool = False) -> bool:
    with src.open("rb") as fi, dest.open("wb") as fo:
        got, _ = copy_hashing(fi, fo)
    if got == sha256:
        return True
    dest.unlink()
    if downloaded:
        src.unlink()
        raise FetchError(
            f"{src.name}: sha256 {got} does not match the lock's {sha256}; the download "
            "was deleted and nothing was stored.",
            hint="if the index legitimately changed the file, re-pin with `qwen38build lock`",
        )
    return False


def pip_download(name: str, version: str, *, python: str, platform: str, dest: Path) -> Path:
    """Fetch one wheel through pip (its config, its index); return its path."""
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--python-version", python, "--implementation", "cp",
        "--platform", platform, "-d", str(dest), f"{name}=={version}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or len(wheels) != 1:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
        raise FetchError(
            f"pip could not fetch {name}=={version} for {platform}:\n{tail}",
            hint="check your pip index configuration (pip config list) and the network",
        )
    return wheels[0]

