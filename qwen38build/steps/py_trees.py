"""py-trees: the pinned and the patched vLLM package's ``.py`` files, as one zip.

A GPU machine that cannot run vLLM's compiled ops (or reach the package index) still runs the
series' Triton kernels and Python halves from the source: ``tests/gpu`` loads them from this
zip (``QWEN38_VLLM_TREES``), the patched tree and the pristine one it is compared with. It
holds ``pristine/vllm/**.py``, ``patched/vllm/**.py`` and ``trees.json`` naming both wheels;
the patched wheel's name carries its step's digest, so a carried zip can be checked against
what the recipe plans. About 22 MB against the wheels' 650: small enough to carry.
"""

from __future__ import annotations

import json

from qwen38build.engine.executor import Context
from qwen38build.steps import ENGINE
from qwen38build.wheels.wheelzip import open_wheel

KIND = "py-trees"
IMPLEMENTATION = (*ENGINE, "qwen38build.wheels.record", "qwen38build.wheels.wheelzip",
                  "qwen38build.wheels.zipwrite")
OUTPUT = "vllm-py-trees.zip"
INDEX = "trees.json"


def run(ctx: Context) -> None:
    from qwen38build.wheels.zipwrite import write_zip

    package = str(ctx.step.params["package"])
    files: dict[str, bytes] = {}
    names: dict[str, str] = {}
    for side in ("pristine", "patched"):
        wheel = ctx.dep_entry(side).the_output(".whl")
        names[side] = wheel.name
        # open_wheel checks every member name once (no absolute path, no `..`); shared,
        # so not closed here.
        zf = open_wheel(wheel)
        for name in zf.namelist():
            if name.startswith(f"{package}/") and name.endswith(".py"):
                files[f"{side}/{name}"] = zf.read(name)
        ctx.report(f"{side}: {sum(n.startswith(side) for n in files)} .py files of {wheel.name}")
    files[INDEX] = (json.dumps({**names, "package": package}, indent=1, sort_keys=True)
                    + "\n").encode()
    write_zip(ctx.out / OUTPUT, files)
