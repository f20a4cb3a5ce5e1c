"""cubin: the pthfa kernels compiled for one CUDA arch.

The digest covers the sources, the arch, the flags, whether PTX is emitted and the
compiler: by default the locked toolchain step (a dependency, so its wheels' sha256s are in
the digest and a cache hit runs no compiler at all); with the system nvcc, only when the
user asked, that choice and the full ``nvcc --version`` text the plan saw.
"""

from __future__ import annotations

import shutil

from qwen38build.engine.executor import Context
from qwen38build.errors import KernelBuildError
from qwen38build.kernels.kernels import compile_arch
from qwen38build.steps import ENGINE, toolchain

KIND = "cubin"
IMPLEMENTATION = (
    *ENGINE,
    "qwen38build.kernels.kernels",
    "qwen38build.engine.tools",
    "qwen38build.steps.toolchain",
    "qwen38build.wheels.record",
    "qwen38build.wheels.zipwrite",
    "qwen38build.wheels.wheelzip",
)


def run(ctx: Context) -> None:
    p = ctx.step.params
    nvcc = toolchain.compiler(ctx)
    # Laid out under their own names (a store keeps inputs by sha256 alone, as reproduce
    # finds them), so the .cu files compile and their #includes resolve side by side.
    src = ctx.scratch / "csrc"
    src.mkdir()
    sources = []
    for name, _ in ctx.step.inputs:
        if "/" in name or name.startswith(".") or not name:
            raise KernelBuildError(f"cubin step {ctx.step.name}: input name {name!r} is not "
                                   "a plain file name.")
        shutil.copyfile(ctx.input_path(name), src / name)
        sources.append(src / name)
    ctx.report(f"nvcc for sm_{str(p['arch']).replace('.', '')}")
    compile_arch(sources, str(p["arch"]), ctx.out, nvcc=nvcc, ptx=bool(p["ptx"]))
