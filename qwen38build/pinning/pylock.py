"""The stack's Python environment, locked with hashes by uv into ``lock/pylock.toml``.

What is locked: the pinned vLLM wheel's runtime requirements (its METADATA ``Requires-Dist``
with no extra), what pthfa needs at run time (CuPy for the recipe's CUDA major) and torch as
the recipe names it, for every Python the pin supports (:mod:`.universal`: one lock with
markers, so ``env`` works with any of them) on the target platform (``[environment]
platform``, else the vLLM wheel's). uv (a pinned dependency of this package) writes a PEP
751 ``pylock.toml`` of wheels only, with a wheel for every package on every covered Python:
making the environment never builds from source. Beside it, ``lock/pylock.inputs.json``
records what the lock was made from and the lock file's sha256, so that ``check`` tells a
stale or edited lock without network. A torch that the pin's own requirements exclude is
refused before uv runs.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from qwen38build.digest import sha256_bytes, sha256_file, sha256_json
from qwen38build.errors import InputError, LockError, Qwen38BuildError
from qwen38build.files import atomic_write
from qwen38build.inputs import lock as lockmod
from qwen38build.inputs.recipe import LoadedRecipe
from qwen38build.pinning import universal
from qwen38build.proc import inherited, run

TYPE_CHECKING = False
if TYPE_CHECKING:
    from email.message import Message

PYLOCK = "pylock.toml"
INPUTS = "pylock.inputs.json"
FORMAT = 3  # 2: wheels only (--only-binary :all:); 3: and every Python the pin supports
HEADER = (
    "# The Python environment of the stack, locked with hashes by `qwen38build lock`\n"
    "# (uv lock, for every Python the pin supports). Do not edit: lock/pylock.inputs.json\n"
    "# records what it was locked from and this file's sha256, and\n"
    "# `qwen38build lock --check` compares both.\n"
)
_MANYLINUX = re.compile(r"^manylinux_(\d+)_(\d+)_(x86_64|aarch64)$")


class UvError(Qwen38BuildError):
    """uv failed; the message carries the tail of its output."""


def pylock_path(root: Path) -> Path:
    return root / lockmod.LOCK_DIR / PYLOCK


def inputs_path(root: Path) -> Path:
    return root / lockmod.LOCK_DIR / INPUTS


# -- the target: the recipe's Python and platform -----------------------------------------


def uv_platform(platform_tag: str) -> str:
    """uv's ``--python-platform`` for a wheel platform tag (``manylinux_2_28_x86_64``)."""
    m = _MANYLINUX.match(platform_tag)
    if m is None:
        raise InputError(
            f"[vllm] platform_tag {platform_tag!r}: the environment can be locked for "
            "manylinux_X_Y_x86_64 or manylinux_X_Y_aarch64 only.",
        )
    return f"{m.group(3)}-manylinux_{m.group(1)}_{m.group(2)}"


def marker_env(python: str, platform_tag: str) -> dict[str, str]:
    """The PEP 508 marker values of the target (not of this machine)."""
    return universal.marker_values(python, uv_platform(platform_tag).split("-", 1)[0])


def cupy_requirement(cuda: str) -> str:
    """CuPy's wheel for the CUDA major (``13.0`` → ``cupy-cuda13x``): pthfa's kernels load
    through CuPy's RawModule at run time."""
    return f"cupy-cuda{Version(cuda).major}x"


# -- the pin's requirements ----------------------------------------------------------------


def requires_dist(meta: Message) -> list[str]:
    """The ``Requires-Dist`` lines of a wheel's METADATA, in order."""
    return [str(v) for v in meta.get_all("Requires-Dist") or []]


def metadata(wheel: Path) -> Message:
    """The wheel's METADATA headers."""
    from email.parser import BytesHeaderParser

    from qwen38build.wheels.wheelzip import open_wheel

    z = open_wheel(wheel)  # shared within the process: not closed here
    names = [n for n in z.namelist()
             if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
    if len(names) != 1:
        raise InputError(f"{wheel.name}: holds {len(names)} dist-info METADATA files, "
                         "not one.")
    return BytesHeaderParser().parsebytes(z.read(names[0]))


def runtime_requirements(lines: list[str], envs: list[dict[str, str]], where: str
                         ) -> list[Requirement]:
    """The requirements that apply on one of the targets ``envs`` with no extra selected
    (their markers kept: uv decides per Python)."""
    out = []
    for line in lines:
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            raise InputError(f"{where}: Requires-Dist {line!r} is not valid: {exc}.") from exc
        if req.marker is None or any(req.marker.evaluate(env) for env in envs):
            out.append(req)
    return out


def check_torch(loaded: LoadedRecipe, pin: str, reqs: list[Requirement]) -> None:
    """Refuse, in one line, a recipe torch that the pin's requirements exclude."""
    torch = loaded.recipe.toolchain.torch
    for req in reqs:
        if canonicalize_name(req.name) != "torch" or req.specifier.contains(
                torch, prereleases=True):
            continue
        want = required_version(req)
        fix = f'set torch = "{want}"' if want else f"pick a torch within {req.specifier}"
        raise LockError(
            f"{loaded.path}: [toolchain] torch = \"{torch}\" contradicts the pin: "
            f"{pin} requires {req}; {fix} in [toolchain], then run `qwen38build lock`."
        )


def torch_for(loaded: LoadedRecipe, pin: str, reqs: list[Requirement]) -> str:
    """The recipe's torch when the pin allows it, else the one version the pin requires
    (``torch==V``); a pin that allows neither is refused as ``check_torch`` does."""
    torch = loaded.recipe.toolchain.torch
    for req in reqs:
        if canonicalize_name(req.name) == "torch" and not req.specifier.contains(
                torch, prereleases=True):
            want = required_version(req)
            if want is None:
                check_torch(loaded, pin, reqs)
            return str(want)
    return torch


def required_version(req: Requirement) -> str | None:
    """The one version an ``==V`` requirement allows, else None."""
    specs = list(req.specifier)
    if len(specs) == 1 and specs[0].operator in ("==", "===") and "*" not in specs[0].version:
        return specs[0].version
    return None


# -- what the lock is made from ------------------------------------------------------------


class LockInputs(TypedDict):
    """What the environment lock is made from (``pylock.inputs.json``). The Pythons it
    covers are the pin's (its METADATA, fixed by ``vllm_sha256``); ``check`` asks that the
    recipe's is one of them."""

    format: int
    vllm: str
    vllm_sha256: str
    platform: str
    torch: str
    cuda: str
    extra: list[str]


def inputs(loaded: LoadedRecipe, entry: lockmod.LockedWheel, torch: str | None = None
           ) -> LockInputs:
    """Everything the lock depends on, known without network: the pinned wheel's bytes fix
    its requirements; the recipe fixes the rest."""
    tc = loaded.recipe.toolchain
    torch = torch or tc.torch
    return {
        "format": FORMAT,
        "vllm": f"{entry.name}=={entry.version}",
        "vllm_sha256": entry.sha256,
        "platform": target_platform(loaded, entry),
        "torch": torch,
        "cuda": tc.cuda,
        "extra": [cupy_requirement(tc.cuda), f"torch=={torch}"],
    }


@dataclass(frozen=True)
class Locked:
    """A computed environment lock, not yet written."""

    text: str
    inputs: LockInputs
    requirements: list[str] = field(default_factory=list)

    @property
    def packages(self) -> dict[str, str]:
        return packages_of(self.text, PYLOCK)


def target_platform(loaded: LoadedRecipe, entry: lockmod.LockedWheel) -> str:
    """The wheel platform the environment is locked for: ``[environment] platform``, else
    the pinned vLLM wheel's own."""
    env = loaded.recipe.environment
    return env.platform if env is not None else entry.platform_tag


def pythons(loaded: LoadedRecipe, entry: lockmod.LockedWheel, meta: Message) -> list[str]:
    """The Pythons the lock covers: those the pin supports (its METADATA ``meta``), the
    recipe's among them."""
    found = universal.supported_pythons(meta, loaded.recipe.toolchain.python)
    python = ".".join(loaded.recipe.toolchain.python.split(".")[:2])
    if python not in found:
        raise LockError(
            f"{loaded.path}: [toolchain] python = \"{python}\" is not a Python "
            f"{entry.name} {entry.version} supports ({', '.join(found)}, from its METADATA); "
            "set one of them in [toolchain].")
    return found


def pin_requirements(loaded: LoadedRecipe, entry: lockmod.LockedWheel, wheel: Path,
                     meta: Message | None = None) -> list[Requirement]:
    """The runtime requirements of the pinned ``wheel`` (its METADATA ``meta``, read from it
    when not given) on the target, for any Python it supports (markers kept)."""
    meta = meta if meta is not None else metadata(wheel)
    platform = target_platform(loaded, entry)
    envs = [marker_env(p, platform) for p in pythons(loaded, entry, meta)]
    return runtime_requirements(requires_dist(meta), envs, f"{entry.filename} METADATA")


def compute(
    loaded: LoadedRecipe, entry: lockmod.LockedWheel, wheel: Path, *, torch: str | None = None
) -> Locked:
    """Lock the environment of ``wheel`` (the pin ``entry``) through uv; writes nothing.

    ``torch`` overrides the recipe's (bump moves it to what a new pin requires); without
    it a recipe torch that the pin excludes is refused before uv runs.
    """
    pin = f"{entry.name} {entry.version}"
    meta = metadata(wheel)
    covered = pythons(loaded, entry, meta)
    reqs = pin_requirements(loaded, entry, wheel, meta)
    if torch is None:
        check_torch(loaded, pin, reqs)
    spec = inputs(loaded, entry, torch)
    lines = [str(r) for r in reqs] + list(spec["extra"])
    platform = target_platform(loaded, entry)
    machine = uv_platform(platform).split("-", 1)[0]
    # uv lock needs an interpreter of the covered range: this one where it is in it
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    python = ["--python", sys.executable] if here in covered else []
    what = f"lock the Python environment of {pin}"
    with tempfile.TemporaryDirectory(prefix="q38-envlock.") as tmp:
        (Path(tmp) / "pyproject.toml").write_text(
            universal.project(lines, covered, machine), encoding="utf-8")
        out = Path(tmp) / PYLOCK
        common = ["--project", tmp, "--no-python-downloads", "--quiet"]
        uv(["lock", *common, *python], what=what)
        uv(["export", *common, "--frozen", "--format", "pylock.toml", "--no-emit-project",
            "--no-header", "-o", str(out)], what=what)
        body = universal.wheels_only(out.read_text(encoding="utf-8"))
    missing = universal.gaps(body, covered, platform)
    if missing:
        raise LockError(
            f"{what}: no wheel for {platform} of {'; '.join(missing[:8])}"
            f"{' and more' if len(missing) > 8 else ''}; the environment is never built "
            "from source.", hint="pin a version that has one (a constraint in the pin's "
            "requirements), or change [environment] platform")
    return Locked(HEADER + body, spec, lines)


def write(root: Path, locked: Locked) -> Path:
    """Write lock/pylock.toml and its inputs record (each atomically); returns the lock."""
    from qwen38build.pinning import uv as uvbin

    path = pylock_path(root)
    data = locked.text.encode("utf-8")
    record = {
        "inputs": locked.inputs,
        "inputs_digest": sha256_json(locked.inputs),
        "pylock_sha256": sha256_bytes(data),
        "requirements": locked.requirements,
        "locked_by": f"uv {uvbin.version()}",
    }
    # a lock file is shared project content, not a secret: 0644
    atomic_write(path, data)
    atomic_write(inputs_path(root), (json.dumps(record, indent=2, sort_keys=True) + "\n").encode())
    return path


# -- the interface: check ---------------------------------------------------------


def check(loaded: LoadedRecipe) -> Path:
    """The environment lock's path; LockError when it is missing, edited or stale.

    No network and no store: the inputs record says what the lock was made from, and
    that is compared with the recipe and lock/sources.json.
    """
    from qwen38build.inputs.lock import locked_vllm

    root = loaded.root
    path, side = pylock_path(root), inputs_path(root)
    redo = "run `qwen38build lock` to lock the Python environment again"
    if not path.is_file() or not side.is_file():
        missing = path if not path.is_file() else side
        raise LockError(f"{missing}: missing, so the Python environment is not locked; "
                        f"{redo}.")
    try:
        record = json.loads(side.read_text(encoding="utf-8"))
        recorded, sha = record["inputs"], record["pylock_sha256"]
        if not isinstance(recorded, dict) or not isinstance(sha, str):
            raise TypeError("inputs must be a table and pylock_sha256 a string")
        if sha256_json(recorded) != record["inputs_digest"]:
            raise ValueError("its inputs do not hash to its inputs_digest: it was edited")
    except (ValueError, KeyError, TypeError) as exc:
        raise LockError(f"{side}: not a valid inputs record ({exc}); {redo}.") from None
    now = sha256_file(path)
    if now != sha:
        raise LockError(
            f"{path}: its content changed since it was locked (sha256 {now[:16]}…, "
            f"{side.name} records {sha[:16]}…); {redo}."
        )
    text = read_text(path)
    packages_of(text, str(path))
    python = loaded.recipe.toolchain.python
    if not universal.covered(text).contains(python, prereleases=True):
        raise LockError(f"{path}: stale: it covers Python {universal.covered(text)}, and "
                        f"{loaded.path.name} [toolchain] python is {python}; {redo}.")
    entry = locked_vllm(loaded, lockmod.read(root))
    want: dict[str, object] = dict(inputs(loaded, entry))
    moved = [f"{k} {recorded.get(k)!r} → {want.get(k)!r}"
             for k in sorted(set(want) | set(recorded)) if recorded.get(k) != want.get(k)]
    if moved:
        raise LockError(f"{path}: stale: locked for other inputs ({'; '.join(moved)}); {redo}.")
    return path


# -- reading a lock --------------------------------------------------------------------------


def read_text(path: Path) -> str:
    """A pylock.toml's text; LockError (bad input) when it is not UTF-8."""
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LockError(f"{path}: not UTF-8 text (byte {exc.start}); TOML is UTF-8.",
                        hint="run `qwen38build lock` to lock the Python environment again"
                        ) from None


_PACKAGE = re.compile(r'^\[\[packages\]\]\nname = "([^"\\]+)"\nversion = "([^"\\]+)"\n'
                      r'(?:marker = "([^"\\]*)"\n)?', re.M)


def versions(text: str, where: str, env: dict[str, str]) -> dict[str, str]:
    """:func:`packages_of` for ``env``, by a scan of uv's own layout (a bump compares two
    300 KB locks; TOML parsing is most of that); any other layout is parsed in full."""
    found = _PACKAGE.findall(text)
    if len(found) != text.count("[[packages]]") or not found:
        return packages_of(text, where, env)
    return {canonicalize_name(name): version for name, version, marker in found
            if not marker or universal.applies({"marker": marker}, env)}


def packages_of(text: str, where: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """name → version of every package of a pylock.toml (of those whose marker holds in
    ``env``, when given); every artifact must carry a hash. Any other shape (``packages``
    as a table, ``wheels = "x"``) is a LockError."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise LockError(f"{where}: not valid TOML: {exc}.") from None
    packages = data.get("packages", [])
    if not isinstance(packages, list):
        raise LockError(f"{where}: packages must be an array of tables ([[packages]]), "
                        f"not a {type(packages).__name__}.")
    out: dict[str, str] = {}
    for i, pkg in enumerate(packages):
        if not isinstance(pkg, dict):
            raise LockError(f"{where}: packages[{i}] must be a table.")
        name, version = pkg.get("name"), pkg.get("version")
        if not isinstance(name, str) or not isinstance(version, str):
            raise LockError(f"{where}: packages[{i}] has no name or version.")
        wheels, sdist = pkg.get("wheels", []), pkg.get("sdist")
        if not isinstance(wheels, list) or (sdist is not None and not isinstance(sdist, dict)):
            raise LockError(f"{where}: packages[{i}] ({name}): wheels must be an array of "
                            "tables and sdist a table.")
        artifacts = [*wheels, *([sdist] if sdist is not None else [])]
        if not all(isinstance(a, dict) for a in artifacts):
            raise LockError(f"{where}: packages[{i}] ({name}): each file must be a table.")
        if not artifacts or any(not isinstance(a.get("hashes"), dict) or not a["hashes"]
                                for a in artifacts):
            raise LockError(f"{where}: packages[{i}] ({name}) has a file without a hash.")
        if env is None or universal.applies(pkg, env):
            out[canonicalize_name(name)] = version
    return out


# -- uv ----------------------------------------------------------------------------------------


def uv(args: list[str], *, what: str) -> str:
    """Run the pinned uv (the user's uv config and UV_* variables apply); its stdout."""
    from qwen38build.pinning import uv as uvbin

    proc = run([uvbin.path(), *args], what="uv", env=inherited())
    if not proc.ok:
        tail = proc.tail(8)
        raise UvError(f"uv failed to {what}:\n{tail}",
                      hint="check the index configuration (uv.toml, UV_INDEX_URL) and the "
                      "network, or pass --offline once uv's cache holds everything")
    return proc.stdout

