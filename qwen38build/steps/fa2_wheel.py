"""fa2-wheel: the fa2fp8 Python loader plus the library of every arch, as one wheel."""

from __future__ import annotations

import shutil

from qwen38build.engine.executor import Context
from qwen38build.kernels.kernels import write_kernel_wheel
from qwen38build.steps import ENGINE

KIND = "fa2-wheel"
IMPLEMENTATION = (*ENGINE, "qwen38build.kernels.kernels", "qwen38build.wheels.record",
                  "qwen38build.wheels.zipwrite")
PACKAGE = "fa2fp8"


def run(ctx: Context) -> None:
    package = ctx.scratch / PACKAGE
    for name, _ in ctx.step.inputs:
        dest = package / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ctx.input_path(name), dest)
    libs = sorted(
        entry.file(name) for entry in (ctx.dep_entry(dep) for dep, _ in ctx.step.deps)
        for name in entry.outputs
    )
    write_kernel_wheel(PACKAGE, package, libs, ctx.out, str(ctx.step.params["version"]),
                       subdir="lib", summary="FlashAttention-2 split-KV paged decode over an "
                       "fp8 (e4m3) KV cache, per-arch libraries and a ctypes loader")
