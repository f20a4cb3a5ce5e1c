"""pylock: the checked environment lock, as an output of the stack.

The plan checks ``lock/pylock.toml`` against what it was locked from (``envlock.check``:
no network) before this step exists; the step copies the file, its bytes verified against
the sha256 its digest covers, so ``./result/pylock.toml`` is the lock the build was made
with.
"""

from __future__ import annotations

import shutil

from qwen38build.engine.executor import Context
from qwen38build.steps import ENGINE

KIND = "pylock"
IMPLEMENTATION = ENGINE


def run(ctx: Context) -> None:
    for name, _ in ctx.step.inputs:
        shutil.copyfile(ctx.input_path(name), ctx.out / name)
