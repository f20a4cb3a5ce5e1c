"""pthfa-wheel: the pthfa Python package plus the cubins of every arch, as one wheel."""

from __future__ import annotations

import shutil

from qwen38build.engine.executor import Context
from qwen38build.kernels.kernels import write_pthfa_wheel
from qwen38build.steps import ENGINE

KIND = "pthfa-wheel"
IMPLEMENTATION = (
    *ENGINE,
    "qwen38build.kernels.kernels",
    "qwen38build.wheels.record",
    "qwen38build.wheels.zipwrite",
)


# The input that is the dist-info's entry_points.txt (vLLM finds pthfa's plugin by it).
ENTRY_POINTS = "dist-info/entry_points.txt"


def run(ctx: Context) -> None:
    package = ctx.scratch / "pthfa"
    entry_points = None
    for name, _ in ctx.step.inputs:
        if name == ENTRY_POINTS:
            entry_points = ctx.input_path(name).read_bytes()
            continue
        dest = package / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ctx.input_path(name), dest)
    # the cubins by their recorded names, never a listing: a stray file is not an output
    kernels = sorted(
        entry.file(name) for entry in (ctx.dep_entry(dep) for dep, _ in ctx.step.deps)
        for name in entry.outputs
    )
    write_pthfa_wheel(package, kernels, ctx.out, str(ctx.step.params["version"]),
                      entry_points=entry_points)
