"""lock and lock --check: pin the recipe's sources (the vLLM wheel, the CUDA toolchain's
wheels, the ``[sources.*]`` trees) by fetching them once."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from qwen38build.digest import sha256_file
from qwen38build.engine.executor import realise
from qwen38build.engine.fetch import wheel_in_store
from qwen38build.engine.plan import fetch_step
from qwen38build.engine.report import Reporter
from qwen38build.errors import FetchError, LockError
from qwen38build.inputs import lock as lockmod
from qwen38build.inputs.lock import locked_vllm
from qwen38build.inputs.recipe import LoadedRecipe
from qwen38build.kernels import toolchain
from qwen38build.pinning import pylock
from qwen38build.steps.fetch import pip_download
from qwen38build.store.store import Store


def check_lock(loaded: LoadedRecipe) -> None:
    """Raise LockError naming the entry when the lock does not serve the recipe."""
    locked = lockmod.read(loaded.root)
    locked_vllm(loaded, locked)
    toolchain.locked_toolchain(loaded, locked)
    trees = lockmod.read_trees(loaded.root)
    for name in loaded.recipe.sources:
        if name not in trees:
            continue  # not obtainable when locked: what needs it is declared, not built
        why = lockmod.tree_mismatch(loaded, name, trees.get(name))
        if why is not None:
            raise LockError(f"{lockmod.lock_path(loaded.root)}: the lock does not match "
                            f"{loaded.path.name}: {why}.", hint="run `qwen38build lock`")


def pin_trees(loaded: LoadedRecipe, *, say: Callable[[str], None] = lambda _: None,
              ) -> list[lockmod.LockedTree]:
    """Each ``[sources.*]`` tree pinned by its hash: a tree the lock already holds for the
    same repository, commit and paths is kept as it is (only what changed is re-pinned);
    the others are obtained (a mirror, else the origin) and hashed. Nothing is written."""
    from qwen38build.cache.config import offline_env
    from qwen38build.trees.obtain import TreeRequest, obtain

    have = lockmod.read_trees(loaded.root) if lockmod.lock_path(loaded.root).is_file() else {}
    out = []
    for name, spec in sorted(loaded.recipe.sources.items()):
        old = have.get(name)
        if old is not None and lockmod.tree_mismatch(loaded, name, old) is None:
            out.append(old)
            continue
        request = TreeRequest(name, spec.repository, spec.commit, tuple(spec.paths),
                              spec.archive, want=None)
        with tempfile.TemporaryDirectory(prefix="q38-tree.") as tmp:
            try:
                got = obtain(request, loaded.mirrors(), Path(tmp), offline=offline_env(),
                             say=say)
            except FetchError as exc:
                # A source nobody can reach from here (KVarN's, say) is not an error of the
                # lock: it stays unlocked, and plan shows what needs it as declared.
                say(f"warning: source {name} not pinned: {exc.message}")
                continue
        say(f"pinned source {name} ({spec.commit[:12]}): tree {got.tree_sha256[:16]}… "
            f"from {got.origin}")
        out.append(lockmod.LockedTree(name, spec.repository, spec.commit, tuple(spec.paths),
                                      got.tree_sha256))
    return out


def relock(loaded: LoadedRecipe, store: Store) -> Path:
    """Fetch the pinned wheel and the toolchain's through pip and write lock/ with each
    one's sha256 and size."""
    entries = pin_sources(loaded, store)
    return lockmod.write(loaded.root, entries, pin_trees(loaded, say=_warn))


def lock_all(loaded: LoadedRecipe, store: Store) -> tuple[Path, Path]:
    """``lock``: pin the sources and lock the environment, then write both, so a refusal
    of either (a torch the pin excludes, an index that fails) leaves lock/ as it was."""
    entries = pin_sources(loaded, store)
    entry = locked_vllm(loaded, {e.name: e for e in entries})
    env = pylock.compute(loaded, entry, wheel_in_store(loaded, store, entry))
    trees = pin_trees(loaded, say=_warn)
    return lockmod.write(loaded.root, entries, trees), pylock.write(loaded.root, env)


def _warn(message: str) -> None:
    """Where a tree came from, or why it stays unpinned: on stderr, as progress is."""
    import sys

    print(message, file=sys.stderr)


def pin_sources(loaded: LoadedRecipe, store: Store) -> list[lockmod.LockedWheel]:
    """The recipe's sources fetched through pip into the store, each pinned by sha256 and
    size (the vLLM wheel first); nothing of lock/ is written."""
    pin = loaded.recipe.vllm
    toolchain.require_supported(loaded)  # refuse before fetching anything
    with tempfile.TemporaryDirectory(prefix="q38-lock.") as tmp:
        wheel = pip_download(pin.name, pin.version, python=loaded.recipe.toolchain.python,
                             platform=pin.platform_tag, dest=Path(tmp))
        if wheel.name != pin.wheel_filename:
            raise LockError(
                f"pip fetched {wheel.name}, but {loaded.path.name} asks for {pin.wheel_filename}.",
                hint="check [vllm] python_tag, abi_tag and platform_tag",
            )
        entry = lockmod.LockedWheel(
            name=pin.name, version=pin.version, filename=wheel.name,
            python_tag=pin.python_tag, abi_tag=pin.abi_tag, platform_tag=pin.platform_tag,
            sha256=sha256_file(wheel), size=wheel.stat().st_size,
        )
        tools = toolchain.pin(loaded, Path(tmp))
        # Keep the downloads: the next build's fetches take them by sha256 instead of again.
        folders = [Path(tmp), *(p for p in Path(tmp).iterdir() if p.is_dir())]
        realise([fetch_step(loaded, e) for e in (entry, *tools)], store, Reporter(quiet=True),
                source_dirs=folders)
    return [entry, *tools]


def relock_env(loaded: LoadedRecipe, store: Store) -> Path:
    """Lock the environment of the pinned wheel (fetched through the store) and write it."""
    entry = locked_vllm(loaded, lockmod.read(loaded.root))
    wheel = wheel_in_store(loaded, store, entry)
    return pylock.write(loaded.root, pylock.compute(loaded, entry, wheel))
