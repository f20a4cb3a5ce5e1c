"""The engine's fetch of a locked wheel: realise its fixed-output step, hand back the file.

Used wherever a pinned wheel's bytes are needed outside a build (the workspace, the bump
report, the environment lock): through the store, so the lock's sha256 is checked once and
the download is shared.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from qwen38build.engine.executor import realise
from qwen38build.engine.plan import fetch_step
from qwen38build.engine.report import Reporter
from qwen38build.inputs import lock as lockmod
from qwen38build.inputs.recipe import LoadedRecipe
from qwen38build.store.store import Store


def wheel_in_store(
    loaded: LoadedRecipe, store: Store, entry: lockmod.LockedWheel,
    source_dirs: Sequence[Path] = (),
) -> Path:
    """Realise the fetch step of ``entry`` and return the wheel file in the store."""
    step = fetch_step(loaded, entry)
    out = realise([step], store, Reporter(quiet=True), source_dirs=list(source_dirs))
    return out[step.digest].entry.path / entry.filename


def locked_wheel(loaded: LoadedRecipe, store: Store) -> Path:
    """The pinned wheel through the store (the fetch step, checked by the lock's sha256)."""
    entry = lockmod.locked_vllm(loaded, lockmod.read(loaded.root))
    return wheel_in_store(loaded, store, entry)
