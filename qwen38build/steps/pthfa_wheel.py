"""pthfa-wheel: the pthfa Python package plus the cubins of every arch, as one wheel."""

from __future__ import annotations

import shutil

from qwen38build.executor import Context
from qwen38build.kernels import write_pthfa_wheel

KIND = "pthfa-wheel"
VERSION = 1


def run(ctx: Context) -> None:
    package = ctx.scratch / "pthfa"
    for name, _ in ctx.step.inputs:
        dest = package / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ctx.input_path(name), dest)
    # By the names each cubin step recorded, never by listing its folder.
    kernels = sorted(
        entry.file(name)
        for dep, _ in ctx.step.deps
        for entry in [ctx.dep_entry(dep)]
        for name in entry.outputs
    )
    write_pthfa_wheel(package, kernels, ctx.out, str(ctx.step.params["version"]))
