"""py-trees: the pinned and the patched vLLM package's ``.py`` files, as one zip.

A GPU machine that cannot run vLLM's compiled ops (or reach the package index) still runs the
series' Triton kernels and Python halves from the source: ``tests/gpu`` loads them from this
zip (``QWEN38_VLLM_TREES``), the patched tree and the pristine one it is compared with. It
holds ``pristine/vllm/**.py``, the patched tree as the files that differ from it
(``patched/vllm/...``) and ``trees.json``: both wheels' names and the ``.py`` files the
series deleted. The patched wheel's name carries its step's digest, so a carried zip can be
checked against what the recipe plans. About 11 MB against the wheels' 650: small enough to
carry.
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
    trees: dict[str, dict[str, bytes]] = {}
    names: dict[str, str] = {}
    for side in ("pristine", "patched"):
        wheel = ctx.dep_entry(side).the_output(".whl")
        names[side] = wheel.name
        # open_wheel checks every member name once (no absolute path, no `..`); shared,
        # so not closed here.
        zf = open_wheel(wheel)
        trees[side] = {name: zf.read(name) for name in zf.namelist()
                       if name.startswith(f"{package}/") and name.endswith(".py")}
    pristine, patched = trees["pristine"], trees["patched"]
    files = {f"pristine/{n}": data for n, data in pristine.items()}
    files.update({f"patched/{n}": data for n, data in patched.items() if pristine.get(n) != data})
    deleted = sorted(set(pristine) - set(patched))
    ctx.report(f"{len(pristine)} .py files of {names['pristine']}; {names['patched']} differs "
               f"in {len(files) - len(pristine)}, deletes {len(deleted)}")
    index = {**names, "package": package, "patched_deleted": deleted}
    files[INDEX] = (json.dumps(index, indent=1, sort_keys=True) + "\n").encode()
    write_zip(ctx.out / OUTPUT, files)
