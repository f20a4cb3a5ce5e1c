"""``plan``, ``show``, ``why`` and ``ci matrix``: what the recipe means, read without building."""

from __future__ import annotations

import json

from qwen38build.cli import stages
from qwen38build.errors import ExitCode, Qwen38BuildError, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any

    from qwen38build.engine.plan import Plan



def cmd_plan(args: argparse.Namespace) -> int:
    from qwen38build.engine.plan import kernel_steps
    from qwen38build.engine.step import walk
    from qwen38build.kernels.kernels import system_nvcc_requested

    loaded = stages.load_recipe(args)
    # the same compiler as `build` with the same flags: else the plan's build hash would be
    # another build's
    system_nvcc = system_nvcc_requested(args.system_nvcc)
    plan = stages.load_plan(loaded, with_=stages.with_groups(args), system_nvcc=system_nvcc)
    store = stages.open_store(args)
    declared = [{"name": d.name, "status": d.reason} for d in plan.declared]
    tops = [plan.top]
    try:
        tops.append(kernel_steps(loaded, system_nvcc=system_nvcc)[-1])
    except Qwen38BuildError as exc:  # e.g. no toolchain in the lock: declared, not planned
        declared.append({"name": "pthfa kernels", "status": f"declared, not planned: {exc}"})
    steps = list(walk(tops))
    built = {s.digest: store.get(s.digest) is not None for s in steps}
    rows = [{"name": s.name, "kind": s.kind, "digest": s.digest, "built": built[s.digest]}
            for s in steps]
    lines = [
        f"{'built' if built[s.digest] else 'to build':9} {s.kind:11} {s.digest[:12]}  {s.name}"
        for s in steps
    ]
    lines += [f"{'declared':9} {'-':11} {'-':12}  {d['name']}: {d['status']}" for d in declared]
    lines.append(f"build hash {plan.build_hash}")
    stages.emit(args, {"build": plan.build_hash, "steps": rows, "declared": declared},
                "\n".join(lines))
    return ExitCode.OK


def _resolve_step(plan: Plan, ref: str) -> Any:
    from qwen38build.engine.step import walk

    candidates = [s for s in walk([plan.top])
                  if ref in (s.name, s.kind) or (len(ref) >= 6 and s.digest.startswith(ref))]
    if len(candidates) != 1:
        names = ", ".join(f"{s.kind}:{s.name}" for s in walk([plan.top]))
        raise UsageError(
            f"step {ref!r} {'is ambiguous' if candidates else 'is not in the plan'}.",
            hint=f"name one of: {names} (a kind, a name, or 6+ digest characters)",
        )
    return candidates[0]


def cmd_show(args: argparse.Namespace) -> int:
    plan = stages.load_plan(stages.load_recipe(args))
    step = _resolve_step(plan, args.step)
    drv = step.derivation()
    drv["digest"] = step.digest

    print(json.dumps(drv, indent=2, sort_keys=True))
    return ExitCode.OK


def cmd_why(args: argparse.Namespace) -> int:
    from qwen38build.engine.why import explain

    plan = stages.load_plan(stages.load_recipe(args))
    step = _resolve_step(plan, args.step)
    lines = explain(stages.open_store(args), step)
    print("\n".join(lines))
    return ExitCode.OK


def cmd_ci_matrix(args: argparse.Namespace) -> int:
    loaded = stages.load_recipe(args)
    include = [{"arch": a, "sm": a.replace(".", "")} for a in loaded.recipe.cuda.archs]

    print(json.dumps({"include": include}, separators=(",", ":")))
    return ExitCode.OK
