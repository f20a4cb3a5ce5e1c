"""fetch: a fixed-output source, a wheel file checked against the lock's sha256.

The digest is the file name and the sha256 alone, so the output is known before it is
fetched (Nix's fixed-output derivation) and the same bytes keep one digest whatever Python
the toolchain names. The bytes come from any store entry already holding them or a source
folder (checked while copied), else from pip, so the user's own index configuration
applies. What pip needs (name, version, platform) is read from the file name; the target
Python and the expected size travel as the step's hints, outside the digest.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

from qwen38build.digest import copy_hashing
from qwen38build.engine.executor import Context
from qwen38build.errors import FetchError
from qwen38build.proc import inherited
from qwen38build.proc import run as run_program
from qwen38build.steps import ENGINE

KIND = "fetch"
FIXED_OUTPUT = True  # keyed by file name and sha256 alone; see qwen38build.steps
# (fixed output: the list is not in the digest, but kept whole like every kind's)
IMPLEMENTATION = (
    *ENGINE,
    "qwen38build.cache.transport",
    "qwen38build.cache.config",
    "qwen38build.cache.signing",
    "qwen38build.cache.transport",
    "qwen38build.wheels.record",
    "qwen38build.wheels.wheelzip",
)


def run(ctx: Context) -> None:
    p, hints = ctx.step.params, ctx.step.hints
    filename, sha256 = str(p["filename"]), str(p["sha256"])
    size = hints.get("size")  # outside the digest: a fixed output is its name and sha256
    want_size = size if type(size) is int else None
    dest = ctx.out / filename
    ctx.hashed[filename] = sha256  # every path below either checks these bytes or raises
    for candidate in ctx.source_candidates(sha256, filename):
        if _copy_checked(candidate, dest, sha256, want_size):
            ctx.report(f"taken from {candidate.parent}")
            _check_wheel(dest)
            return
    name, version, platform = _from_filename(filename)
    python = str(hints.get("python") or f"{sys.version_info[0]}.{sys.version_info[1]}")
    from qwen38build.cache.config import offline_env

    if offline_env():
        raise FetchError(
            f"{filename} is in no local store or sources folder, and offline mode forbids "
            "fetching it.", hint="run once without --offline, or set QWEN38BUILD_SOURCES")
    with tempfile.TemporaryDirectory(prefix="fetch.", dir=ctx.scratch) as tmp:
        got = pip_download(name, version, python=python, platform=str(
            hints.get("platform") or platform), dest=Path(tmp))
        if got.name != filename:
            raise FetchError(
                f"pip fetched {got.name} for {name}=={version}, but the lock names {filename}.",
                hint="run `qwen38build lock` to re-pin, or check the recipe's platform tag",
            )
        if not _copy_checked(got, dest, sha256, want_size, downloaded=True):
            raise AssertionError("unreachable")
    _check_wheel(dest)


def _from_filename(filename: str) -> tuple[str, str, str]:
    """(name, version, first platform tag) of a wheel file name, as pip wants them."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    try:
        name, version, _, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename as exc:
        raise FetchError(f"{filename}: not a wheel file name: {exc}.") from exc
    platform = sorted(t.platform for t in tags)[0]
    return str(name), str(version), platform


def _check_wheel(path: Path) -> None:
    """A pinned wheel that is no safe zip never enters the store (its sha256 held, so the
    lock pins a bad file: bad input)."""
    if path.suffix == ".whl":
        from qwen38build.wheels.wheelzip import check_wheel

        check_wheel(path)


def _copy_checked(
    src: Path, dest: Path, sha256: str, size: int | None, *, downloaded: bool = False
) -> bool:
    """Copy ``src`` to ``dest`` if it has the lock's size and sha256; else drop the copy.

    The size is checked before a byte is copied and again after (more or fewer bytes are
    refused), so a file of the wrong size is never hashed into the store.
    """
    if size is not None and src.stat().st_size != size:
        got = f"{src.stat().st_size} bytes, not the lock's {size}"
    else:
        with src.open("rb") as fi, dest.open("wb") as fo:
            got, copied = copy_hashing(fi, fo, limit=None if size is None else size + 1)
        if got == sha256 and (size is None or copied == size):
            return True
        got = (f"sha256 {got} does not match the lock's {sha256}" if got != sha256
               else f"{copied} bytes, not the lock's {size}")
        dest.unlink()
    if downloaded:
        src.unlink()
        raise FetchError(
            f"{src.name}: {got}; the download was deleted and nothing was stored.",
            hint="if the index legitimately changed the file, re-pin with `qwen38build lock`",
        )
    return False


def pip_download(name: str, version: str, *, python: str, platform: str, dest: Path) -> Path:
    """Fetch one wheel through pip (its config, its index); return its path."""
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--python-version", python, "--implementation", "cp",
        *platform_args(platform), "-d", str(dest), f"{name}=={version}",
    ]
    proc = run_program(cmd, what="pip", env=inherited(), hint="install pip into this environment")
    wheels = sorted(dest.glob("*.whl"))
    if not proc.ok or len(wheels) != 1:
        tail = proc.tail(5)
        raise FetchError(
            f"pip could not fetch {name}=={version} for {platform}:\n{tail}",
            hint="check your pip index configuration (pip config list) and the network",
        )
    return wheels[0]



_MANYLINUX = re.compile(r"manylinux_2_(?P<minor>\d+)_(?P<arch>\w+)")
_LEGACY = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}


def platform_args(platform: str) -> list[str]:
    """``--platform`` options for every tag a ``platform`` system installs.

    pip's ``--platform`` matches tags exactly, so ``manylinux_2_28_x86_64`` alone would refuse
    a ``manylinux_2_17`` wheel (NVIDIA's compiler wheels) that such a system runs; list the
    older glibc tags (and their legacy aliases) as an installer would accept them.
    """
    m = _MANYLINUX.fullmatch(platform)
    if m is None:
        return ["--platform", platform]
    minor, arch = int(m.group("minor")), m.group("arch")
    tags = [f"manylinux_2_{y}_{arch}" for y in range(minor, 4, -1)]
    tags += [f"{alias}_{arch}" for y, alias in _LEGACY.items() if y <= minor]
    return [arg for tag in tags for arg in ("--platform", tag)]
