"""The small named stages every command is made of: open the store, load the recipe, plan.

Each is a plain function over the parsed arguments, testable alone; the commands call them
in order (load recipe → load lock → plan → realise → report).
"""

from __future__ import annotations

import os
from pathlib import Path

from qwen38build.errors import UsageError

# Not typing.TYPE_CHECKING: importing typing alone costs a tenth of the no-op budget.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any

    from qwen38build.cache.substituter import Substituters
    from qwen38build.engine.plan import Plan
    from qwen38build.inputs.recipe import LoadedRecipe
    from qwen38build.store.store import Store

# The stores this run opened: an OSError that names no file (a write into an open file
# on a full disk) is then said to be about the store, the only place the tool writes.
STORES: list[str] = []


def open_store(args: argparse.Namespace) -> Store:
    """The store named by --store (or the default); a file where it, or a folder above
    it, should be is bad input, found before anything is read or written there."""
    from qwen38build.store.store import Store, default_root

    root = Path(args.store) if args.store else default_root()
    probe = root
    while not os.path.lexists(probe) and probe != probe.parent:
        probe = probe.parent
    if os.path.lexists(probe) and not os.path.isdir(probe):
        raise UsageError(
            f"{probe}: the store {root} needs a folder here, but a file stands there.",
            hint="pass --store DIR naming a folder (or a path that does not exist yet)",
        )
    STORES.append(str(root))
    return Store(root)


def load_recipe(args: argparse.Namespace) -> LoadedRecipe:
    from qwen38build.inputs import recipe

    return recipe.load(Path(args.recipe))


def load_plan(
    loaded: LoadedRecipe, *, only: list[str] | None = None, system_nvcc: bool = False,
    with_: list[str] | None = None,
) -> Plan:
    from qwen38build.engine.plan import make_plan
    from qwen38build.inputs import lock
    from qwen38build.kernels.kernels import system_nvcc_requested

    return make_plan(loaded, lock.read(loaded.root), only=only,
                     system_nvcc=system_nvcc_requested(system_nvcc), with_=with_ or ())


def with_groups(args: argparse.Namespace) -> list[str]:
    """The optional groups ``--with`` adds, each once, in order."""
    from qwen38build.engine.fastpath import with_requested

    return with_requested(getattr(args, "with_", None) or [])


def check_patch_files(loaded: LoadedRecipe) -> None:
    """Parse every patch of the series strictly: a link, a mode change, a binary diff or a
    path out of the package is bad input (exit 2), found before anything is fetched."""
    from qwen38build.series.patchfile import PatchFile

    for entry in loaded.series_entries():
        PatchFile.parse(entry.path)


def check_args(args: argparse.Namespace) -> None:
    """The arguments' own rules, checked before any command runs."""
    from qwen38build.cache.config import offline_env
    from qwen38build.store.record import check_build_hash

    offline_env()  # $QWEN38BUILD_OFFLINE is yes or no, for every command

    if args.store is not None and not args.store.strip():
        raise UsageError("command line: --store is empty.",
                         hint="give a store directory, or leave --store out for the default")
    if not args.recipe.strip():
        raise UsageError("command line: --recipe is empty.", hint="give the recipe.toml path")
    for name in ("build_hash", "build"):
        value = getattr(args, name, None)
        if isinstance(value, str):
            check_build_hash(value)
    if getattr(args, "jobs", 1) < 1:
        raise UsageError(f"command line: --jobs {args.jobs} must be 1 or more.",
                         hint="give how many steps to run at once (1 runs them one by one)")


def check_archs(loaded: LoadedRecipe, wanted: list[str] | None) -> list[str] | None:
    """``--arch`` values, canonical, each one of the recipe's ``cuda.archs``."""
    from qwen38build.inputs.recipe import normalise_arch

    if not wanted:
        return None
    have = list(loaded.recipe.cuda.archs)
    out = []
    for value in wanted:
        try:
            arch = normalise_arch(value)
        except ValueError:
            arch = None
        if arch not in have:
            raise UsageError(
                f"command line: --arch {value!r} is not one of {loaded.path.name}'s "
                f"cuda.archs ({', '.join(have)}).",
                hint="give one of those, or add the arch to cuda.archs in the recipe",
            )
        out.append(arch)
    return out


def open_substituters(args: argparse.Namespace) -> Substituters | None:
    """The caches this run may substitute from (user config, env, flags); None when none."""
    from qwen38build.cache import config as cacheconfig
    from qwen38build.cache.substituter import Substituters

    cfg = cacheconfig.load(substituters=args.substituter, trusted_keys=args.trusted_public_key,
                           offline=args.offline)
    return Substituters(cfg) if cfg.active else None


def emit(args: argparse.Namespace, data: Any, text: str) -> None:
    """``data`` as JSON with --json, else ``text``: the one place results reach stdout."""
    import json

    print(json.dumps(data, indent=2, sort_keys=True) if getattr(args, "json", False) else text)


def root_name(loaded: LoadedRecipe) -> str:
    """The named root of this recipe's last build (gc keeps its closure)."""
    from qwen38build.digest import sha256_bytes

    return "recipe-" + sha256_bytes(str(loaded.path).encode())[:16]
