"""``build``: realise the plan's top (the stack, or the parts asked for) and link ./result."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from qwen38build.cli import stages
from qwen38build.errors import LintFailed, StoreError, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any

    from qwen38build.engine.executor import Outcome
    from qwen38build.engine.plan import Plan
    from qwen38build.inputs.recipe import LoadedRecipe
    from qwen38build.store.store import Store

# What each output of the stack is called in the build's report.
LABELS = {"vllm": "wheel", "pthfa": "pthfa", "pylock": "pylock"}


def cmd_build(args: argparse.Namespace) -> int:
    """The full build; ``main`` has already tried the no-op fast path (unless --rebuild)."""
    from qwen38build.engine.reads import Collector, default_excludes
    from qwen38build.engine.report import make_reporter

    store = stages.open_store(args)
    subs = stages.open_substituters(args)  # bad cache settings are bad input: before any work
    recipe_dir = os.path.dirname(os.path.realpath(args.recipe))
    # Every project file read from here on is an input of the no-op's key.
    with Collector(recipe_dir, (*default_excludes(), str(store.root))) as reads:
        loaded = stages.load_recipe(args)
        plan = stages.load_plan(loaded, only=only(args), system_nvcc=args.system_nvcc,
                                with_=stages.with_groups(args))
        stages.check_patch_files(loaded)  # every input is valid before the store is touched
        reporter = make_reporter(quiet=args.quiet)
        # One store session for the whole build: its temporary roots keep everything it
        # makes or uses from gc until the record, the root and ./result are in place.
        with store.hold():
            return _build_held(args, store, loaded, plan, reporter, reads, subs)


def only(args: argparse.Namespace) -> list[str] | None:
    """The outputs --only names, in order, each once; None for the recipe's default."""
    from qwen38build.engine.fastpath import requested

    names = requested(getattr(args, "only", None))
    if names == []:
        raise UsageError("command line: --only names no output.",
                         hint="give vllm, pthfa, fa2, pylock or vllm-py (repeat --only, or "
                         "separate by commas)")
    return names


def _build_held(
    args: argparse.Namespace, store: Store, loaded: LoadedRecipe, plan: Plan, reporter: Any,
    reads: Any, subs: Any,
) -> int:
    from qwen38build.engine import fastpath
    from qwen38build.engine.executor import realise
    from qwen38build.engine.result import report_build
    from qwen38build.lint import lint
    from qwen38build.store import record
    from qwen38build.store.temproots import drop_dead_temps

    # The ledger's rules run before anything is applied. Where the series is applied (the
    # vllm part), all of them: the env-knob rule needs the pristine envs.py, so the
    # (fixed-output) wheel is fetched first. Otherwise only the vendored trees' provenance:
    # a kernels-only build needs nothing of vLLM.
    if "vllm" in plan.targets:
        realise([plan.targets["fetch"]], store, reporter, substituters=subs)
        findings, waived = lint.check_waived(loaded, pristine_envs=pristine_wheel(store, plan))
    else:
        findings, waived = lint.check_waived(loaded, rules=("provenance",))
    if findings:
        for f in findings:
            print(f"lint: {f}", file=sys.stderr)
        raise LintFailed(findings, hint="nothing was applied; fix them, or run "
                         "`qwen38build lint` for each finding's hint")
    said = [str(w) for w in waived]
    for line in said:  # on every build, the no-op's included
        print(f"lint: {line}", file=sys.stderr)
    outcomes = realise([plan.top], store, reporter, substituters=subs, jobs=args.jobs)
    groups = built_groups(plan)
    record.write_build(store, plan.top, outcomes, root_name=stages.root_name(loaded),
                       waived=said, groups=groups)
    outputs = _outputs(plan, outcomes)
    files, dirs = reads.inputs()
    fastpath.save(store.root, loaded.path, files, dirs, plan.build_hash, outputs,
                  only=only(args), system_nvcc=args.system_nvcc, waived=said,
                  with_=stages.with_groups(args), groups=groups)
    drop_dead_temps(loaded.root, ".result.")  # a killed build's half-made link
    code = report_build(store.root, plan.build_hash, outputs, loaded.root,
                        link=not args.no_link, as_json=args.json, groups=groups)
    if code is None:  # cannot happen while this build's temporary roots hold it
        raise StoreError(f"build {plan.build_hash[:12]} left the store mid-build.")
    return code


def _outputs(plan: Plan, outcomes: dict[str, Outcome]) -> list[list[str]]:
    """[label, entry digest, file name] of each output the build made, in recipe order."""
    out = []
    for part, label in LABELS.items():
        step = plan.targets.get(part)
        if step is None or step.digest not in outcomes:
            continue
        entry = outcomes[step.digest].entry
        name = entry.the_output(".whl").name if part != "pylock" else step.inputs[0][0]
        out.append([label, step.digest, name])
    return out


def built_groups(plan: Plan) -> list[str] | None:
    """The series groups the build applies, in order; None when it applies none (a build
    without the vllm part)."""
    if "vllm" not in plan.targets:
        return None
    return [str(g) for g in plan.targets["patch"].params["groups"]]


def pristine_wheel(store: Store, plan: Plan) -> Path | None:
    """The locked vLLM wheel in the store, or None when it has not been fetched."""
    entry = store.get(plan.targets["fetch"].digest)
    return entry.the_output(".whl") if entry else None
