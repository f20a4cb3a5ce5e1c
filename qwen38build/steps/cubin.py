"""cubin: the pthfa kernels compiled for one CUDA arch.

The digest covers the sources, the arch, whether PTX is emitted and the full
``nvcc --version`` text the plan saw, so a new compiler misses the cache and a cache hit
runs no nvcc at all.
"""

from __future__ import annotations

from qwen38build.executor import Context
from qwen38build.kernels import compile_arch, nvcc_version
from qwen38build.steps import ENGINE

KIND = "cubin"
IMPLEMENTATION = (*ENGINE, "qwen38build.kernels")


def run(ctx: Context) -> None:
    p = ctx.step.params
    if nvcc_version() != p["nvcc"]:
        from qwen38build.errors import KernelBuildError

        raise KernelBuildError(
            f"nvcc changed since the plan was made (arch {p['arch']}); nothing was stored.",
            hint="run the build again",
        )
    sources = [ctx.input_path(name) for name, _ in ctx.step.inputs]
    ctx.report(f"nvcc for sm_{str(p['arch']).replace('.', '')}")
    compile_arch(sources, str(p["arch"]), ctx.out, ptx=bool(p["ptx"]))
