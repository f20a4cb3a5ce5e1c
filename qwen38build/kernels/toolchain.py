"""The CUDA toolchain: NVIDIA's compiler wheels, pinned in lock/ like the vLLM wheel.

``[toolchain] cuda = "13.0"`` names a release series; ``lock`` pins the newest release of
that series of each package in :data:`PACKAGES` (one ``LockedWheel`` each, by sha256 and
size), and ``lock --check`` names an entry that is missing or outside the series. The
kernels then compile with these bytes and nothing of the machine's own CUDA.

A toolchain entry's ``platform_tag`` is the platform it was fetched for (the recipe's
``[vllm] platform_tag``), which is what the fetch step hands pip; the wheel's own tags are
in its file name.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from packaging.version import InvalidVersion, Version

from qwen38build.digest import sha256_file
from qwen38build.errors import LockError
from qwen38build.inputs import lock as lockmod
from qwen38build.inputs.recipe import LoadedRecipe

#: What nvcc needs to compile a .cu file to a cubin: the driver and its back ends (nvcc),
#: the device front end (nvvm: cicc, libdevice), the CUDA runtime headers (crt, runtime)
#: and libcu++/CUB (cccl). About 45 MB of wheels together.
PACKAGES: tuple[str, ...] = (
    "nvidia-cuda-nvcc",
    "nvidia-nvvm",
    "nvidia-cuda-crt",
    "nvidia-cuda-runtime",
    "nvidia-cuda-cccl",
)
#: NVIDIA ships the toolkit as these unified wheels (one ``nvidia/cuMAJOR`` tree) from 13.0 on.
FIRST_MAJOR = 13


def series(loaded: LoadedRecipe) -> str:
    """The recipe's CUDA release series, e.g. ``13.0``."""
    return loaded.recipe.toolchain.cuda


def top_dir(cuda: str) -> str:
    """Where the wheels put the toolkit, relative to the extracted tree: ``nvidia/cu13``."""
    return f"nvidia/cu{cuda.split('.', maxsplit=1)[0]}"


def in_series(version: str, cuda: str) -> bool:
    want = tuple(int(x) for x in cuda.split("."))
    try:
        got = Version(version).release
    except InvalidVersion:
        return False
    return got[: len(want)] == want


def problems(loaded: LoadedRecipe, locked: dict[str, lockmod.LockedWheel]) -> list[str]:
    """Why the lock's toolchain entries do not serve the recipe, one line per entry."""
    cuda, platform = series(loaded), loaded.recipe.vllm.platform_tag
    out: list[str] = []
    for name in PACKAGES:
        entry = locked.get(name)
        if entry is None:
            out.append(f"no entry for {name!r} (the CUDA {cuda} toolchain)")
        elif not in_series(entry.version, cuda):
            out.append(
                f"{name} is {entry.version} in the lock but [toolchain] cuda = {cuda!r} "
                f"in {loaded.path.name} asks for {cuda}.x"
            )
        elif not set(entry.platform_tag.split(".")) & installs_on(platform):
            out.append(
                f"{name}: {entry.filename} does not install on the recipe's platform "
                f"{platform!r}"
            )
        elif not entry.filename.startswith(f"{name.replace('-', '_')}-{entry.version}-"):
            out.append(f"{name}: file name {entry.filename!r} is not of {name} {entry.version}")
    return out


def installs_on(platform: str) -> set[str]:
    """Every wheel platform tag a ``platform`` system installs (pip's view of it)."""
    from qwen38build.steps.fetch import platform_args

    return set(platform_args(platform)[1::2])


def locked_toolchain(
    loaded: LoadedRecipe, locked: dict[str, lockmod.LockedWheel]
) -> list[lockmod.LockedWheel]:
    """The lock's toolchain entries in :data:`PACKAGES` order; LockError naming each stale one."""
    found = problems(loaded, locked)
    if found:
        raise LockError(
            f"{lockmod.lock_path(loaded.root)}: the lock does not match {loaded.path.name}: "
            + "; ".join(found) + ".",
            hint="run `qwen38build lock` to pin the toolchain",
        )
    return [locked[name] for name in PACKAGES]


def require_supported(loaded: LoadedRecipe) -> str:
    """The recipe's series, or LockError when NVIDIA ships no such unified wheels."""
    cuda = series(loaded)
    if int(cuda.split(".")[0]) < FIRST_MAJOR:
        raise LockError(
            f"{loaded.path}: [toolchain] cuda = {cuda!r}: the toolchain comes from NVIDIA's "
            f"unified compiler wheels, which start at {FIRST_MAJOR}.0.",
            hint=f'set [toolchain] cuda = "{FIRST_MAJOR}.0" or newer',
        )
    return cuda


def pin(loaded: LoadedRecipe, dest: Path) -> list[lockmod.LockedWheel]:
    """Fetch the newest release of the series of each package through pip into ``dest``
    (one folder per package) and return their lock entries."""
    from qwen38build.steps.fetch import pip_download

    cuda = require_supported(loaded)
    platform = loaded.recipe.vllm.platform_tag
    entries: list[lockmod.LockedWheel] = []
    for name in PACKAGES:
        folder = Path(tempfile.mkdtemp(prefix=f"{name}.", dir=dest))
        wheel = pip_download(name, f"{cuda}.*", python=loaded.recipe.toolchain.python,
                             platform=platform, dest=folder)
        parts = wheel.name[: -len(".whl")].split("-")
        if len(parts) != 5 or not in_series(parts[1], cuda):
            raise LockError(f"pip fetched {wheel.name} for {name}=={cuda}.*; expected a "
                            f"{cuda}.x wheel named NAME-VERSION-PY-ABI-PLATFORM.whl.")
        entries.append(lockmod.LockedWheel(
            name=name, version=parts[1], filename=wheel.name, python_tag=parts[2],
            abi_tag=parts[3], platform_tag=parts[4], sha256=sha256_file(wheel),
            size=wheel.stat().st_size,
        ))
    return entries
