"""``kernels``: the pthfa cubins per CUDA arch (in parallel) and its wheel."""

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
    from qwen38build.engine.plan import kernel_steps
    from qwen38build.engine.report import make_reporter
    from qwen38build.kernels.kernels import system_nvcc_requested
    from qwen38build.store import record

    if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        raise UsageError(f"command line: --out {args.out}: a file stands there, not a folder.",
                         hint="give a folder (it is made if missing)")
    loaded = stages.load_recipe(args)
    steps = kernel_steps(loaded, stages.check_archs(loaded, args.arch),
                         system_nvcc=system_nvcc_requested(args.system_nvcc))
    cubins, wheel = steps[:-1], steps[-1]
    store = stages.open_store(args)
    reporter = make_reporter(quiet=args.quiet)
    subs = stages.open_substituters(args)
    # The arches are independent: side by side, once the toolchain is there.
    outcomes = realise([*cubins, wheel], store, reporter, substituters=subs, jobs=args.jobs)
    record.write_build(store, wheel, outcomes, root_name=stages.root_name(loaded) + "-kernels")
    out = outcomes[wheel.digest].entry.the_output(".whl")
    copied: list[str] = []
    if args.out:
        dest = Path(args.out)
        dest.mkdir(parents=True, exist_ok=True)
        for entry in [outcomes[s.digest].entry for s in cubins] + [outcomes[wheel.digest].entry]:
            for name in entry.outputs:
                if name.endswith((".cubin", ".ptx", ".whl")):
                    copied.append(str(shutil.copyfile(entry.file(name), dest / name)))
    stages.emit(args, {"build": wheel.digest, "wheel": str(out), "copied": copied,
                "cubins": {s.params["arch"]: s.digest for s in cubins}},
         "\n".join([f"build {wheel.digest}", f"wheel {out}", *(f"copied {c}" for c in copied)]))
    return ExitCode.OK
