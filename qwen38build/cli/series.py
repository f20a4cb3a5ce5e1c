"""``workspace``, ``export``, ``bump``, ``lint`` and ``table``: working on the series."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from qwen38build.cli import stages
from qwen38build.cli.build import pristine_wheel
from qwen38build.errors import (
    CheckFailed,
    ExitCode,
    FetchError,
    LintFailed,
    Qwen38BuildError,
    RecipeError,
    TableStale,
    UsageError,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from qwen38build.bump.report import BumpReport
    from qwen38build.inputs.recipe import LoadedRecipe
    from qwen38build.lint.finding import Finding


def cmd_workspace_create(args: argparse.Namespace) -> int:
    from qwen38build.workspace.workspace import create

    loaded = stages.load_recipe(args)
    stages.check_patch_files(loaded)  # before the folder is made or the wheel fetched
    dest = Path(args.dir) if args.dir else loaded.root / "workspace"
    repo = create(loaded, stages.open_store(args), dest)
    print(f"workspace {repo} (tag v{loaded.recipe.vllm.version}, one commit per topic)")
    return ExitCode.OK


def cmd_workspace_continue(args: argparse.Namespace) -> int:
    """``workspace continue DIR [--skip]``: the carry goes on from its stop; the next stop
    says what the first one said (``bump/carry.py``)."""
    from qwen38build.bump.carry import continue_carry
    from qwen38build.bump.report import carry_lines

    state, version = continue_carry(Path(args.dir), skip=args.skip)
    print("\n".join(carry_lines(state, version)))
    if not state.ok:
        raise CheckFailed(f"the carry onto {version} stopped again, at {state.stopped_at}.")
    return ExitCode.OK


def cmd_export(args: argparse.Namespace) -> int:
    from qwen38build.workspace.workspace import export_topics

    loaded = stages.load_recipe(args)
    dest = Path(args.dir) if args.dir else loaded.root / "workspace"
    done = export_topics(loaded, dest, args.topics or None, check=args.check)
    files, unfinished = done.changed, done.unfinished
    if args.check:
        if files:
            raise CheckFailed(
                "these patch files disagree with their workspace commits: "
                + ", ".join(str(f.relative_to(loaded.root)) for f in files) + ".",
                hint=f"run `qwen38build export {dest}` to regenerate them",
            )
        if not unfinished:
            print("every patch file matches its workspace commit")
            return ExitCode.OK
    else:
        print("\n".join(f"wrote {f.relative_to(loaded.root)}" for f in files)
              or "nothing changed")
    if unfinished:
        again = "; ".join(f"`git -C {dest} cherry-pick {sha[:12]}` carries {row}'s commit "
                          "again" for row, sha in done.earlier.items())
        raise CheckFailed(
            f"not exported, no commit in {dest} yet: {', '.join(unfinished)} (every other "
            "topic was " + ("checked" if args.check else "exported") + ").",
            hint="finish them in the workspace (after a stopped carry: resolve, `git add`, "
            f"`qwen38build workspace continue {dest}`; else commit '[qwen38] TOPIC'"
            + (f"; a skipped one: {again}" if again else "") + "), then export again; "
            "one the new pin carries (the bump report's upstream diff does its change): "
            "`qwen38build retire TOPIC --why '...'` takes it out of the series",
        )
    return ExitCode.OK


def cmd_bump(args: argparse.Namespace) -> int:
    from qwen38build.bump.bump import bump

    if args.package != "vllm":
        return _bump_source(args)
    if args.retire and args.dry_run:
        raise UsageError("--retire changes the recipe; it cannot go with --dry-run.")
    loaded = stages.load_recipe(args)
    stages.check_patch_files(loaded)
    report = bump(loaded, stages.open_store(args), args.version, dry_run=args.dry_run,
                  rebase=Path(args.rebase) if args.rebase else None, retire=args.retire)
    if args.json:
        stages.emit(args, report.to_json(), "")
    else:  # a screen per class of patch; the whole report, every diff once, to a file
        from qwen38build.files import atomic_write

        path = Path(args.report) if args.report else _report_path(report)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, report.to_markdown().encode("utf-8"))
        print(report.to_screen(str(path)), end="")
    if not report.ok or (report.rebase is not None and not report.rebase.ok):
        raise CheckFailed(f"moving vllm to {args.version}: some patches do not carry over "
                          "(the report above names each, and what to do next).")
    return ExitCode.OK


def cmd_retire(args: argparse.Namespace) -> int:
    """``retire TOPIC... --why TEXT``: what ``bump --retire`` does for the topics its labels
    found upstream, for topics a maintainer found there reading the report (a conflict whose
    upstream diff makes the same change in its own words), at the recipe's pin."""
    from qwen38build.series.retire import retire

    loaded = stages.load_recipe(args)
    version = loaded.recipe.vllm.version
    written = retire(loaded, dict.fromkeys(args.topics, args.why), version)
    for path in written:
        rel = path.relative_to(loaded.root) if path.is_relative_to(loaded.root) else path
        print(f"{'wrote' if path.exists() else 'deleted'} {rel}")
    print(f"Retired at {version}: {', '.join(args.topics)} (series.retired; the prose is in "
          "PATCHES.md's retired section). A workspace carry no longer waits for them: "
          "`qwen38build export DIR` leaves them out.")
    tests = [t for t in (loaded.root / "tests" / "patches" / f"test_{name.replace('-', '_')}.py"
                         for name in args.topics) if t.exists()]
    if tests:  # the ledger's convention: a patch's behaviour test goes with it
        print("Their behaviour tests still stand: run them once on the new pin (the evidence: "
              "upstream's code passes the patched side, or shows how upstream chose otherwise), "
              "then delete them: "
              + ", ".join(str(t.relative_to(loaded.root)) for t in tests) + ".")
    return ExitCode.OK


def _bump_source(args: argparse.Namespace) -> int:
    """``bump <source> <commit>``: a ``[sources.*]`` tree moved, its diff tried hunk by hunk."""
    from qwen38build.bump.source import bump_source
    from qwen38build.cache.config import offline_env

    loaded = stages.load_recipe(args)
    if args.package not in loaded.recipe.sources:
        names = ", ".join(["vllm", *loaded.recipe.sources])
        raise UsageError(f"cannot bump {args.package!r}; the recipe pins {names}.")
    if args.rebase or args.retire:
        raise UsageError("--rebase and --retire move the series; a source's diff is re-cut "
                         "by hand in its tree.")
    if not re.fullmatch(r"[0-9a-f]{40}", args.version):
        raise UsageError(f"{args.version!r} is not a full git commit (40 lowercase hex "
                         f"digits) of {loaded.recipe.sources[args.package].repository}.")
    result = bump_source(loaded, args.package, args.version, dry_run=args.dry_run,
                         offline=offline_env())
    stages.emit(args, result.to_json(), result.text())
    if not result.ok:
        raise CheckFailed(f"moving {args.package} to {args.version[:12]}: its diff does not "
                          "carry over as it is (the report above names each hunk).")
    return ExitCode.OK


def _report_path(report: BumpReport) -> Path:
    """``bump-OLD-NEW.md`` in the user cache dir (``~/.cache/qwen38build/reports``)."""
    from platformdirs import user_cache_dir

    name = f"bump-{report.old_version}-{report.new_version}.md"
    return Path(user_cache_dir("qwen38build")) / "reports" / name


def cmd_lint(args: argparse.Namespace) -> int:
    from qwen38build.lint import lint

    # Lint reports a series that disagrees with its folders as findings with their lines,
    # so it loads the recipe's schema only.
    loaded = lint.load_for_lint(Path(args.recipe))
    # A listed patch that is missing is the same error as for build: nothing to lint.
    from qwen38build.inputs.layout import entry_problems

    missing = entry_problems(loaded)
    if missing:
        raise RecipeError(args.recipe, missing)
    try:
        pristine = pristine_wheel(stages.open_store(args), stages.load_plan(loaded))
    except Qwen38BuildError:
        pristine = None  # no usable lock: the knob rule says it could not read envs.py
    findings, waived = lint.check_waived(loaded, pristine_envs=pristine)
    findings += _fa2_upstream(args, loaded)
    for w in waived:
        print(f"waived: {w}")
    for f in findings:
        print(f)
        print(f"  hint: {f.hint}")
    if findings:
        raise LintFailed(findings,
                         hint="fix each as its hint says, then run `qwen38build lint` again")
    print("lint: clean")
    return ExitCode.OK


def _fa2_upstream(args: argparse.Namespace, loaded: LoadedRecipe) -> list[Finding]:
    """The ``fa2-upstream`` rule where FA2 can be built: its pinned tree realised (the
    store, a mirror or the origin, hash-checked) and the diff dry-run against it."""
    from qwen38build.engine.executor import realise
    from qwen38build.engine.plan import fa2_missing, source_step
    from qwen38build.engine.report import Reporter
    from qwen38build.lint.finding import Context
    from qwen38build.lint.upstream import fa2_upstream

    if fa2_missing(loaded) is not None:
        return []
    step = source_step(loaded, loaded.recipe.fa2.source)
    assert step is not None
    store = stages.open_store(args)
    try:
        realise([step], store, Reporter(quiet=True))
    except FetchError as exc:
        # No mirror holds the tree and the origin is out of reach (a machine that reaches
        # only a package index): the rule cannot run here, which is said, not hidden.
        print(f"lint: fa2-upstream not checked: {exc.message}", file=sys.stderr)
        return []
    entry = store.get(step.digest)
    assert entry is not None
    return list(fa2_upstream(Context(loaded), entry.path))


def cmd_table(args: argparse.Namespace) -> int:
    from qwen38build.series import table

    loaded = stages.load_recipe(args)
    md = loaded.root / "PATCHES.md"
    if args.check:
        diff = table.check(loaded, md)
        if diff:
            raise TableStale(md.name, diff)
        print(f"{md.name}: table is current")
        return ExitCode.OK
    changed = table.write(loaded, md)
    print(f"{md.name}: {'updated' if changed else 'already current'}")
    return ExitCode.OK
