"""``kernels``: the pthfa cubins per CUDA arch (in parallel) and its wheel; with ``--fa2``
FA2's library for the same arches and its wheel too."""

from __future__ import annotations

import shutil
from pathlib import Path

from qwen38build.cli import stages
from qwen38build.errors import ExitCode, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse


def cmd_kernels(args: argparse.Namespace) -> int:

    from qwen38build.engine.executor import realise
    from qwen38build.engine.plan import fa2_missing, fa2_steps, kernel_steps
    from qwen38build.engine.report import make_reporter
    from qwen38build.inputs import lock
    from qwen38build.kernels.kernels import system_nvcc_requested
    from qwen38build.store import record

    if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        raise UsageError(f"command line: --out {args.out}: a file stands there, not a folder.",
                         hint="give a folder (it is made if missing)")
    loaded = stages.load_recipe(args)
    archs = stages.check_archs(loaded, args.arch)
    system_nvcc = system_nvcc_requested(args.system_nvcc)
    steps = kernel_steps(loaded, archs, system_nvcc=system_nvcc)
    cubins, wheel = steps[:-1], steps[-1]
    fa2 = []
    if args.fa2:
        why = fa2_missing(loaded)
        if why is not None:
            raise UsageError(f"command line: --fa2: fa2 is declared, not built: {why}.",
                             hint="plan lists what each declared part lacks")
        fa2 = fa2_steps(loaded, lock.read(loaded.root), archs, system_nvcc=system_nvcc)
    store = stages.open_store(args)
    reporter = make_reporter(quiet=args.quiet)
    subs = stages.open_substituters(args)
    # The arches are independent: side by side, once the toolchain is there.
    tops = [*cubins, wheel, *fa2[-1:]]
    outcomes = realise(tops, store, reporter, substituters=subs, jobs=args.jobs)
    record.write_build(store, wheel, outcomes, root_name=stages.root_name(loaded) + "-kernels")
    if fa2:
        record.write_build(store, fa2[-1], outcomes,
                           root_name=stages.root_name(loaded) + "-kernels-fa2")
    out = outcomes[wheel.digest].entry.the_output(".whl")
    copied: list[str] = []
    if args.out:
        dest = Path(args.out)
        dest.mkdir(parents=True, exist_ok=True)
        for entry in [outcomes[s.digest].entry for s in (*cubins, wheel, *fa2[-1:])]:
            for name in entry.outputs:
                if name.endswith((".cubin", ".ptx", ".whl")):
                    copied.append(str(shutil.copyfile(entry.file(name), dest / name)))
    found: dict[str, object] = {
        "build": wheel.digest, "wheel": str(out), "copied": copied,
        "cubins": {s.params["arch"]: s.digest for s in cubins}}
    lines = [f"build {wheel.digest}", f"wheel {out}"]
    if fa2:
        fa2_wheel = outcomes[fa2[-1].digest].entry.the_output(".whl")
        found["fa2"] = {"build": fa2[-1].digest, "wheel": str(fa2_wheel),
                        "libs": {s.params["arch"]: s.digest for s in fa2 if s.kind == "fa2-lib"}}
        lines.append(f"fa2 wheel {fa2_wheel}")
    stages.emit(args, found, "\n".join([*lines, *(f"copied {c}" for c in copied)]))
    return ExitCode.OK
