"""toolchain: NVIDIA's locked compiler wheels extracted into one store entry nvcc runs from.

Its dependencies are the fetch steps of the wheels (so its digest covers their locked
sha256s). Every member goes through the one safe-member extractor; the wheels lay out a
standard toolkit tree under ``nvidia/cuMAJOR`` (``bin/nvcc`` with its ``nvcc.profile``,
``nvvm/bin/cicc``, ``include`` with crt and cccl), so nvcc finds everything beside itself.
Unzipping drops the run bits: they are restored from each member's recorded mode, and the
executables nvcc needs are checked to exist and made runnable. The step ends by running
``nvcc --version``: a toolchain that cannot run on this machine never enters the store.
"""

from __future__ import annotations

import json
import os
import zipfile

from qwen38build.engine.executor import Context
from qwen38build.errors import KernelBuildError
from qwen38build.kernels.kernels import Nvcc, nvcc_version
from qwen38build.steps import ENGINE
from qwen38build.store.entry import Entry
from qwen38build.wheels.wheelzip import extract

KIND = "toolchain"
IMPLEMENTATION = (
    *ENGINE,
    "qwen38build.engine.tools",
    "qwen38build.kernels.kernels",
    "qwen38build.wheels.record",
    "qwen38build.wheels.wheelzip",
    "qwen38build.wheels.zipwrite",
)
#: The record of what was extracted and where nvcc is, read by the cubin steps.
MANIFEST = "toolchain.json"
#: Below the toolkit's top folder: what nvcc runs to turn a .cu file into a cubin.
EXECUTABLES = (
    "bin/nvcc", "bin/ptxas", "bin/cudafe++", "bin/fatbinary", "bin/nvlink", "bin/bin2c",
    "nvvm/bin/cicc",
)


def run(ctx: Context) -> None:
    top = str(ctx.step.params["top"])
    owner: dict[str, str] = {}
    for dep, _ in ctx.step.deps:
        wheel = ctx.dep_entry(dep).the_output(".whl")
        with zipfile.ZipFile(wheel) as z:
            infos = [i for i in z.infolist() if not i.is_dir()]
        for info in infos:
            if info.filename in owner:
                raise KernelBuildError(
                    f"toolchain: {wheel.name} and {owner[info.filename]} both hold "
                    f"{info.filename!r}; the lock names wheels that do not fit together.",
                    hint="run `qwen38build lock` to pin one release series",
                )
            owner[info.filename] = wheel.name
        ctx.report(f"extracting {wheel.name}")
        extract(wheel, ctx.out)
        for info in infos:
            if (info.external_attr >> 16) & 0o111:
                os.chmod(ctx.out / info.filename, 0o755)
    for rel in EXECUTABLES:
        path = ctx.out / top / rel
        if not path.is_file():
            raise KernelBuildError(
                f"toolchain: no {top}/{rel} in the locked wheels "
                f"({', '.join(sorted(set(owner.values())))}).",
                hint="check [toolchain] cuda in recipe.toml and run `qwen38build lock`",
            )
        os.chmod(path, 0o755)
    nvcc = f"{top}/bin/nvcc"
    version = nvcc_version(Nvcc(ctx.out / nvcc))
    cuda = str(ctx.step.params["cuda"])
    if f"release {cuda}," not in version:
        raise KernelBuildError(
            f"toolchain: the locked nvcc says {version.strip().splitlines()[-1]!r}, "
            f"not CUDA {cuda}."
        )
    (ctx.out / MANIFEST).write_text(json.dumps(
        {"cuda": cuda, "nvcc": nvcc, "nvcc_version": version,
         "wheels": sorted(set(owner.values()))},
        indent=1, sort_keys=True,
    ) + "\n")


def nvcc_of(entry: Entry) -> Nvcc:
    """The nvcc of a toolchain store entry, by the name its manifest records."""
    manifest = json.loads(entry.file(MANIFEST).read_text())
    return Nvcc(entry.file(str(manifest["nvcc"])))


def compiler(ctx: Context) -> Nvcc:
    """The nvcc a compile step was planned with: the locked toolchain (its ``toolchain``
    dependency), or the system's, refused when it is no longer the one the plan saw."""
    from qwen38build.engine.tools import identity

    p = ctx.step.params
    if p["nvcc"] == "toolchain":
        return nvcc_of(ctx.dep_entry("toolchain"))
    if p["nvcc"] == "system":
        nvcc = Nvcc.find_system()
        if (nvcc_version(nvcc) != p["nvcc_version"]
                or identity("nvcc", content=True) != p.get("nvcc_identity")):
            raise KernelBuildError(
                f"the system nvcc changed since the plan was made ({ctx.step.name}); "
                "nothing was stored.",
                hint="run the build again",
            )
        return nvcc
    raise KernelBuildError(f"step {ctx.step.name}: unknown compiler {p['nvcc']!r}.")

