"""fa2-lib: the fp8-KV FlashAttention-2 library compiled for one CUDA arch.

The builder is the project's own ``fa2/build.py`` (Nix: a derivation's builder script), an
input like every file of ``fa2/`` it reads: the one compile description, which the GPU
benchmark runs too. It gets the patched tree, CUTLASS's headers and the locked nvcc, each a
dependency of the step (or, asked for, the system nvcc), and writes ``libfa2fp8_sm<XY>.so``.
"""

from __future__ import annotations

import os
import shutil
import sys

from qwen38build.engine.executor import Context
from qwen38build.errors import KernelBuildError
from qwen38build.proc import BASE_PATH
from qwen38build.proc import run as run_program
from qwen38build.steps import ENGINE, toolchain

KIND = "fa2-lib"
IMPLEMENTATION = (*ENGINE, "qwen38build.steps.toolchain", "qwen38build.kernels.kernels",
                  "qwen38build.engine.tools", "qwen38build.wheels.record",
                  "qwen38build.wheels.wheelzip", "qwen38build.wheels.zipwrite")
BUILDER = "build.py"


def run(ctx: Context) -> None:
    """Stage the inputs under fixed relative names and run the builder there (so no path
    of this machine reaches the compiler), with a scrubbed environment."""
    p = ctx.step.params
    work = ctx.scratch / "w"
    ours = work / "fa2"
    for name, _ in ctx.step.inputs:
        dest = ours / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ctx.input_path(name), dest)
    for dep, folder in (("tree", "flash-attention"), ("cutlass", "cutlass")):
        entry = ctx.dep_entry(dep)
        for name in entry.outputs:
            dest = work / folder / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(entry.file(name), dest)  # read-only, never written: no copy needed
    nvcc = toolchain.compiler(ctx)
    out = work / "out"
    home = ctx.scratch / "home"
    home.mkdir()
    env = {"PATH": f"{nvcc.exe.parent}{os.pathsep}{BASE_PATH}", "LC_ALL": "C", "TZ": "UTC",
           "HOME": str(home), "TMPDIR": str(home), "SOURCE_DATE_EPOCH": "315532800"}
    ctx.report(f"nvcc for sm_{str(p['arch']).replace('.', '')}")
    proc = run_program([sys.executable, f"fa2/{BUILDER}", "--tree", "flash-attention",
                "--cutlass", "cutlass", "--ours", "fa2", "--nvcc", str(nvcc.exe),
                "--arch", str(p["arch"]), "--out", "out", "-j", str(ctx.step.hints.get("jobs", 2))],
               what="fa2/build.py", cwd=work, env=env)
    if not proc.ok:
        raise KernelBuildError(f"fa2 for sm_{p['arch']}: fa2/build.py failed:\n{proc.tail(30)}")
    built = sorted(out.glob("*.so")) if out.is_dir() else []
    if not built:
        raise KernelBuildError(f"fa2 for sm_{p['arch']}: fa2/build.py wrote no library.")
    for lib in built:
        shutil.copyfile(lib, ctx.out / lib.name)
