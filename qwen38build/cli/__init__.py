"""The command line: argument parsing, small named stages, and the one error boundary.

``main(argv) -> int`` never raises for a user's mistake: a Qwen38BuildError becomes
``error: ...`` (and ``hint: ...``) on stderr and its exit code. Heavy imports stay inside
the commands so that a no-op ``build`` answers from the fast path in a few milliseconds.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from qwen38build.errors import ExitCode, Qwen38BuildError, UsageError

# Not typing.TYPE_CHECKING: importing typing alone costs a tenth of the no-op budget.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any

    from qwen38build.cache.substituter import Substituters
    from qwen38build.engine.plan import Plan
    from qwen38build.inputs.recipe import LoadedRecipe
    from qwen38build.store.store import Store

DESCRIPTION = """\
Build a patched vLLM wheel from recipe.toml and lock/, cached by input digest in a
content-addressed store. Exit codes: 0 ok, 1 a build or check failed, 2 bad input."""


# -- stages -----------------------------------------------------------------------------


def open_store(args: argparse.Namespace) -> Store:
    """The store named by --store (or the default); a file where it, or a folder above
    it, should be is bad input, found before anything is read or written there."""
    from qwen38build.store.store import Store, default_root

    root = Path(args.store) if args.store else default_root()
    probe = root
    while not os.path.lexists(probe) and probe != probe.parent:
        probe = probe.parent
    if os.path.lexists(probe) and not os.path.isdir(probe):
        raise UsageError(
            f"{probe}: the store {root} needs a folder here, but a file stands there.",
            hint="pass --store DIR naming a folder (or a path that does not exist yet)",
        )
    _STORES.append(str(root))
    return Store(root)


# The stores this run opened: an OSError that names no file (a write into an open file
# on a full disk) is then said to be about the store, the only place the tool writes.
_STORES: list[str] = []


def load_recipe(args: argparse.Namespace) -> LoadedRecipe:
    from qwen38build.inputs import recipe

    return recipe.load(Path(args.recipe))


def load_plan(
    loaded: LoadedRecipe, *, only: list[str] | None = None, system_nvcc: bool = False
) -> Plan:
    from qwen38build.engine.plan import make_plan
    from qwen38build.inputs import lock
    from qwen38build.kernels.kernels import system_nvcc_requested

    return make_plan(loaded, lock.read(loaded.root), only=only,
                     system_nvcc=system_nvcc_requested(system_nvcc))


def check_patch_files(loaded: LoadedRecipe) -> None:
    """Parse every patch of the series strictly: a link, a mode change, a binary diff or a
    path out of the package is bad input (exit 2), found before anything is fetched."""
    from qwen38build.series.patchfile import PatchFile

    for entry in loaded.series_entries():
        PatchFile.parse(entry.path)


def check_args(args: argparse.Namespace) -> None:
    """The arguments' own rules, checked before any command runs."""
    from qwen38build.store.record import check_build_hash

    if args.store is not None and not args.store.strip():
        raise UsageError("command line: --store is empty.",
                         hint="give a store directory, or leave --store out for the default")
    if not args.recipe.strip():
        raise UsageError("command line: --recipe is empty.", hint="give the recipe.toml path")
    for name in ("build_hash", "build"):
        value = getattr(args, name, None)
        if isinstance(value, str):
            check_build_hash(value)
    if getattr(args, "jobs", 1) < 1:
        raise UsageError(f"command line: --jobs {args.jobs} must be 1 or more.",
                         hint="give how many arches to compile at once")


def check_archs(loaded: LoadedRecipe, wanted: list[str] | None) -> list[str] | None:
    """``--arch`` values, canonical, each one of the recipe's ``cuda.archs``."""
    from qwen38build.inputs.recipe import normalise_arch

    if not wanted:
        return None
    have = list(loaded.recipe.cuda.archs)
    out = []
    for value in wanted:
        try:
            arch = normalise_arch(value)
        except ValueError:
            arch = None
        if arch not in have:
            raise UsageError(
                f"command line: --arch {value!r} is not one of {loaded.path.name}'s "
                f"cuda.archs ({', '.join(have)}).",
                hint="give one of those, or add the arch to cuda.archs in the recipe",
            )
        out.append(arch)
    return out


def open_substituters(args: argparse.Namespace) -> Substituters | None:
    """The caches this run may substitute from (user config, env, flags); None when none."""
    from qwen38build.cache import config as cacheconfig
    from qwen38build.cache.substituter import Substituters

    cfg = cacheconfig.load(substituters=args.substituter, trusted_keys=args.trusted_public_key,
                           offline=args.offline)
    return Substituters(cfg) if cfg.active else None


def emit(args: argparse.Namespace, data: Any, text: str) -> None:
    import json

    print(json.dumps(data, indent=2, sort_keys=True) if getattr(args, "json", False) else text)


# -- build ------------------------------------------------------------------------------


def cmd_build(args: argparse.Namespace) -> int:
    """The full build; ``main`` has already tried the no-op fast path (unless --rebuild)."""
    from qwen38build.engine.reads import Collector, default_excludes
    from qwen38build.engine.report import make_reporter

    store = open_store(args)
    subs = open_substituters(args)  # bad cache settings are bad input: before any work
    recipe_dir = os.path.dirname(os.path.realpath(args.recipe))
    # Every project file read from here on is an input of the no-op's key.
    with Collector(recipe_dir, (*default_excludes(), str(store.root))) as reads:
        loaded = load_recipe(args)
        plan = load_plan(loaded, only=_only(args), system_nvcc=args.system_nvcc)
        check_patch_files(loaded)  # every input is valid before the store is touched
        reporter = make_reporter(quiet=args.quiet)
        # One store session for the whole build: its temporary roots keep everything it
        # makes or uses from gc until the record, the root and ./result are in place.
        with store.hold():
            return _build_held(args, store, loaded, plan, reporter, reads, subs)


# What each output of the stack is called in the build's report.
LABELS = {"vllm": "wheel", "pthfa": "pthfa", "pylock": "pylock"}


def _only(args: argparse.Namespace) -> list[str] | None:
    if not getattr(args, "only", None):
        return None
    names = [n.strip() for arg in args.only for n in arg.split(",") if n.strip()]
    if not names:
        raise UsageError("command line: --only names no output.",
                         hint="give vllm, pthfa or pylock (repeat --only, or separate by commas)")
    return list(dict.fromkeys(names))


def _build_held(
    args: argparse.Namespace, store: Store, loaded: LoadedRecipe, plan: Plan, reporter: Any,
    reads: Any, subs: Any,
) -> int:
    from qwen38build.engine import fastpath
    from qwen38build.engine.executor import realise
    from qwen38build.lint import lint
    from qwen38build.store import record
    from qwen38build.store.temproots import drop_dead_temps

    # The ledger's rules run before anything is applied; the env-knob rule needs the
    # pristine envs.py, so the (fixed-output) wheel is fetched first.
    realise([plan.targets["fetch"]], store, reporter, substituters=subs)
    findings = lint.check(loaded, pristine_envs=_pristine_wheel(store, plan))
    if findings:
        for f in findings:
            print(f"lint: {f}", file=sys.stderr)
        raise _lint_failed(len(findings))
    outcomes = realise([plan.top], store, reporter, substituters=subs)
    record.write_build(store, plan.top, outcomes, root_name=_root_name(loaded))
    outputs = _outputs(plan, outcomes)
    files, dirs = reads.inputs()
    fastpath.save(store.root, loaded.path, files, dirs, plan.build_hash, outputs)
    drop_dead_temps(loaded.root, ".result.")  # a killed build's half-made link
    code = report_build(store.root, plan.build_hash, outputs, loaded.root,
                        link=not args.no_link, as_json=args.json)
    if code is None:  # cannot happen while this build's temporary roots hold it
        from qwen38build.errors import StoreError

        raise StoreError(f"build {plan.build_hash[:12]} left the store mid-build.")
    return code


def _outputs(plan: Plan, outcomes: dict[str, Any]) -> list[list[str]]:
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


def _pristine_wheel(store: Store, plan: Plan) -> Path | None:
    entry = store.get(plan.targets["fetch"].digest)
    return entry.the_output(".whl") if entry else None


def _lint_failed(n: int) -> Qwen38BuildError:
    from qwen38build.errors import CheckFailed

    return CheckFailed(
        f"{n} lint finding(s) above; nothing was applied.",
        hint="fix them, or run `qwen38build lint` for the same report",
    )


def _root_name(loaded: LoadedRecipe) -> str:
    from qwen38build.digest import sha256_bytes

    return "recipe-" + sha256_bytes(str(loaded.path).encode())[:16]


def report_build(
    store_root: Path, build_hash: str, outputs: list[list[str]], root: Path, *, link: bool,
    as_json: bool,
) -> int | None:
    """Point ``result`` at the build (like Nix) and print its hash and each output.

    ``outputs`` holds [label, entry digest, file name] per output. The link is made under a
    temporary root on the build and registered as an indirect root, so gc keeps what it
    points at and never leaves it dangling. None (nothing linked or printed) if gc took the
    build first: the no-op fast path then runs the full build.
    """
    objects = Path(os.path.abspath(store_root / "objects"))
    if link:
        from qwen38build.store.store import Store

        if not Store(store_root).link_result(build_hash, root / "result"):
            return None
    paths = {label: str(objects / digest / name) for label, digest, name in outputs}
    if as_json:
        import json

        print(json.dumps({"build": build_hash, "result": str(objects / build_hash),
                          "outputs": paths, "store": str(store_root), **(
                              {"wheel": paths["wheel"]} if "wheel" in paths else {})},
                         indent=2, sort_keys=True))
    else:
        print("\n".join([f"build {build_hash}", *(f"{k} {v}" for k, v in paths.items())]))
    return ExitCode.OK


# -- plan, show, why --------------------------------------------------------------------


def cmd_plan(args: argparse.Namespace) -> int:
    from qwen38build.engine.plan import kernel_steps
    from qwen38build.engine.step import walk

    loaded = load_recipe(args)
    plan = load_plan(loaded)
    store = open_store(args)
    declared = [{"name": d.name, "status": d.reason} for d in plan.declared]
    tops = [plan.top]
    from qwen38build.kernels.kernels import system_nvcc_requested

    try:
        tops.append(kernel_steps(loaded, system_nvcc=system_nvcc_requested(args.system_nvcc))[-1])
    except Qwen38BuildError as exc:  # e.g. no toolchain in the lock: declared, not planned
        declared.append({"name": "pthfa kernels", "status": f"declared, not planned: {exc}"})
    rows: list[dict[str, Any]] = [
        {"name": s.name, "kind": s.kind, "digest": s.digest,
         "built": store.get(s.digest) is not None}
        for s in walk(tops)
    ]
    lines = [
        f"{'built' if r['built'] else 'to build':9} {r['kind']:11} {r['digest'][:12]}  "
        f"{r['name']}"
        for r in rows
    ]
    lines += [f"{'declared':9} {'-':11} {'-':12}  {d['name']}: {d['status']}" for d in declared]
    lines.append(f"build hash {plan.build_hash}")
    emit(args, {"build": plan.build_hash, "steps": rows, "declared": declared}, "\n".join(lines))
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
    plan = load_plan(load_recipe(args))
    step = _resolve_step(plan, args.step)
    drv = step.derivation()
    drv["digest"] = step.digest
    import json

    print(json.dumps(drv, indent=2, sort_keys=True))
    return ExitCode.OK


def cmd_why(args: argparse.Namespace) -> int:
    from qwen38build.engine.why import explain

    plan = load_plan(load_recipe(args))
    step = _resolve_step(plan, args.step)
    lines = explain(open_store(args), step)
    print("\n".join(lines))
    return ExitCode.OK


# -- reproduce, lock --------------------------------------------------------------------


def cmd_reproduce(args: argparse.Namespace) -> int:
    from qwen38build.engine.report import make_reporter
    from qwen38build.engine.reproduce import reproduce

    result = reproduce(open_store(args), args.build_hash, make_reporter(quiet=args.quiet),
                       keep=args.keep)
    emit(args, result.as_json(), result.text())
    return ExitCode.OK if result.ok else ExitCode.FAILED


def cmd_lock(args: argparse.Namespace) -> int:
    from qwen38build.pinning import pylock as envlock
    from qwen38build.pinning.sources import check_lock, relock

    loaded = load_recipe(args)
    if args.check:
        check_lock(loaded)
        env = envlock.check(loaded)
        print(f"lock is current for {loaded.path.name} (sources and {env.name})")
        return ExitCode.OK
    store = open_store(args)
    path = relock(loaded, store)
    env = envlock.relock(loaded, store)  # refuses a torch the pin excludes, before uv runs
    print(f"wrote {path}\nwrote {env}")
    return ExitCode.OK


def cmd_env(args: argparse.Namespace) -> int:
    from qwen38build.wheels.venv import make

    made = make(load_recipe(args), open_store(args), Path(args.dir), python=args.python,
                offline=args.offline)  # UV_OFFLINE reaches uv by itself
    emit(args, {"env": str(made.dest), "python": made.python,
                "site_packages": str(made.site_packages), "locked_packages": made.packages,
                "wheels": list(made.wheels)},
         f"env {made.dest}: {made.packages} locked package(s) and {', '.join(made.wheels)}; "
         f"verified {made.site_packages}")
    return ExitCode.OK


# -- verify, apply ----------------------------------------------------------------------


def _manifest(args: argparse.Namespace) -> tuple[dict[str, Any], Path]:
    from qwen38build.store.record import check_build_hash, read_build, roots
    from qwen38build.wheels.installed import read_manifest

    store = open_store(args)
    build = args.build
    if build is None:
        link = Path(args.recipe).parent / "result"
        if link.is_symlink():
            build = Path(os.readlink(link)).name  # read_build checks it is a hash
        else:
            build = _last_vllm_build(store, roots(store))
    rec = read_build(store, build)
    try:
        patched = next(s for s in rec["steps"] if s["derivation"]["kind"] == "patch")
        wheel = next(s for s in rec["steps"] if s["derivation"]["kind"] == "wheel")
        tree = store.objects / check_build_hash(str(patched["digest"])) / "tree"
        wheel_digest = check_build_hash(str(wheel["digest"]))
    except (KeyError, TypeError, StopIteration, UsageError):
        from qwen38build.errors import StoreError

        raise StoreError(f"{store.builds / rec['build']}.json: the record has no valid "
                         "patch and wheel steps.",
                         hint="remove it, and rebuild that build") from None
    # The patched wheel's own entry (a stack links to it): its manifest, re-hashed.
    store.verified(wheel_digest, "manifest.json")
    return read_manifest(store.objects / wheel_digest), tree


def _last_vllm_build(store: Store, known: dict[str, str]) -> str:
    """The first root (by name) whose build holds a patched vLLM wheel (a kernels-only
    root does not)."""
    from qwen38build.store.record import read_build

    for name in sorted(known):
        try:
            rec = read_build(store, known[name])
        except Qwen38BuildError:
            continue
        if any(s.get("derivation", {}).get("kind") == "wheel" for s in rec["steps"]
               if isinstance(s, dict)):
            return known[name]
    raise UsageError("no build of a patched vLLM wheel to compare with.",
                     hint="run `qwen38build build` first, or give --build HASH")


def cmd_verify(args: argparse.Namespace) -> int:
    from qwen38build.wheels.installed import verify_tree

    manifest, _ = _manifest(args)
    problems = verify_tree(Path(args.path), manifest, full=args.full)
    ok = not problems
    text = (f"{args.path}: holds exactly build {manifest['local_version']}" if ok else
            "\n".join(str(p) for p in problems) + f"\n{len(problems)} difference(s)")
    emit(args, {"ok": ok, "problems": [p.as_json() for p in problems]},
         text)
    return ExitCode.OK if ok else ExitCode.FAILED


def cmd_apply(args: argparse.Namespace) -> int:
    from qwen38build.wheels.installed import apply_tree

    manifest, tree = _manifest(args)
    changed = apply_tree(Path(args.path), manifest, tree)
    print("\n".join(f"wrote {c}" for c in changed) or "already up to date")
    return ExitCode.OK


# -- workspace, export, bump -------------------------------------------------------------


def cmd_workspace_create(args: argparse.Namespace) -> int:
    from qwen38build.workspace.workspace import create

    loaded = load_recipe(args)
    check_patch_files(loaded)  # before the folder is made or the wheel fetched
    dest = Path(args.dir) if args.dir else loaded.root / "workspace"
    repo = create(loaded, open_store(args), dest)
    print(f"workspace {repo} (tag v{loaded.recipe.vllm.version}, one commit per topic)")
    return ExitCode.OK


def cmd_export(args: argparse.Namespace) -> int:
    from qwen38build.errors import CheckFailed
    from qwen38build.workspace.workspace import export

    loaded = load_recipe(args)
    dest = Path(args.dir) if args.dir else loaded.root / "workspace"
    files = export(loaded, dest, args.topics or None, check=args.check)
    if args.check:
        if files:
            raise CheckFailed(
                "these patch files disagree with their workspace commits: "
                + ", ".join(str(f.relative_to(loaded.root)) for f in files) + ".",
                hint=f"run `qwen38build export {dest}` to regenerate them",
            )
        print("every patch file matches its workspace commit")
        return ExitCode.OK
    print("\n".join(f"wrote {f.relative_to(loaded.root)}" for f in files) or "nothing changed")
    return ExitCode.OK


def cmd_bump(args: argparse.Namespace) -> int:
    from qwen38build.bump.bump import bump

    if args.package != "vllm":
        raise UsageError(f"cannot bump {args.package!r}; only vllm is pinned by version.")
    if args.retire and args.dry_run:
        raise UsageError("--retire changes the recipe; it cannot go with --dry-run.")
    loaded = load_recipe(args)
    check_patch_files(loaded)
    report = bump(loaded, open_store(args), args.version, dry_run=args.dry_run,
                  rebase=Path(args.rebase) if args.rebase else None, retire=args.retire)
    emit(args, report.to_json(), report.to_markdown())
    ok = report.ok and (report.rebase is None or report.rebase.ok)
    return ExitCode.OK if ok else ExitCode.FAILED


# -- kernels ----------------------------------------------------------------------------


def cmd_kernels(args: argparse.Namespace) -> int:
    import shutil
    from concurrent.futures import ThreadPoolExecutor

    from qwen38build.engine.executor import Outcome, realise
    from qwen38build.engine.plan import kernel_steps
    from qwen38build.engine.report import make_reporter
    from qwen38build.kernels.kernels import system_nvcc_requested
    from qwen38build.store import record

    loaded = load_recipe(args)
    steps = kernel_steps(loaded, check_archs(loaded, args.arch),
                         system_nvcc=system_nvcc_requested(args.system_nvcc))
    cubins, wheel = steps[:-1], steps[-1]
    store = open_store(args)
    reporter = make_reporter(quiet=args.quiet)
    subs = open_substituters(args)
    outcomes: dict[str, Outcome] = {}
    # The toolchain first, once; then the arches, which are independent: side by side
    # (each under its digest's lock).
    outcomes.update(realise([d for _, d in cubins[0].deps], store, reporter, substituters=subs))
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for result in pool.map(lambda s: realise([s], store, reporter, substituters=subs),
                               cubins):
            outcomes.update(result)
    outcomes.update(realise([wheel], store, reporter, substituters=subs))
    record.write_build(store, wheel, outcomes, root_name=_root_name(loaded) + "-kernels")
    out = outcomes[wheel.digest].entry.the_output(".whl")
    copied: list[str] = []
    if args.out:
        dest = Path(args.out)
        dest.mkdir(parents=True, exist_ok=True)
        for entry in [outcomes[s.digest].entry for s in cubins] + [outcomes[wheel.digest].entry]:
            for name in entry.outputs:
                if name.endswith((".cubin", ".ptx", ".whl")):
                    copied.append(str(shutil.copyfile(entry.file(name), dest / name)))
    emit(args, {"build": wheel.digest, "wheel": str(out), "copied": copied,
                "cubins": {s.params["arch"]: s.digest for s in cubins}},
         "\n".join([f"build {wheel.digest}", f"wheel {out}", *(f"copied {c}" for c in copied)]))
    return ExitCode.OK


# -- push, cache ------------------------------------------------------------------------


def cmd_push(args: argparse.Namespace) -> int:
    from qwen38build.cache import config as cacheconfig
    from qwen38build.cache.push import closure_digests, push
    from qwen38build.cache.signing import SecretKey
    from qwen38build.engine.report import make_reporter

    cfg = cacheconfig.load(offline=args.offline)
    if cfg.offline:
        raise UsageError("push needs the network, and --offline (or $QWEN38BUILD_OFFLINE) "
                         "forbids it.")
    url = cacheconfig.check_url(args.url, "push URL")
    key_file = Path(args.key) if args.key else cfg.secret_key_file
    if key_file is None:
        raise UsageError("push needs a signing key: an unsigned entry is never used.",
                         hint="give --key FILE (from `qwen38build cache keygen NAME`), or set "
                         "QWEN38BUILD_SECRET_KEY_FILE or cache.secret-key-file")
    key = SecretKey.load(key_file)
    store = open_store(args)
    builds = args.build or _default_builds(args, store)
    result = push(store, url, closure_digests(store, builds), key, timeout=cfg.timeout,
                  reporter=make_reporter(quiet=args.quiet))
    emit(args, {"url": url, "sent": result.sent, "present": result.present,
                "bytes": result.bytes_sent},
         f"pushed {len(result.sent)} entries ({result.bytes_sent / 1e6:.1f} MB) to {url}; "
         f"{len(result.present)} were there already")
    return ExitCode.OK


def _default_builds(args: argparse.Namespace, store: Store) -> list[str]:
    """./result's build, and the last kernels build of this recipe, when recorded."""
    from qwen38build.store.record import roots

    found = []
    link = Path(args.recipe).parent / "result"
    if link.is_symlink():
        found.append(Path(os.readlink(link)).name)
    recorded = roots(store)
    if Path(args.recipe).is_file():
        name = _root_name(load_recipe(args))
        for root in (name, name + "-kernels"):
            if root in recorded and recorded[root] not in found:
                found.append(recorded[root])
    if not found:
        raise UsageError("no build to push.", hint="name a build hash, or build first")
    return found


def cmd_cache_keygen(args: argparse.Namespace) -> int:
    from qwen38build.cache.signing import SecretKey, write_key_pair

    key = SecretKey.generate(args.name)
    out = Path(args.dir)
    secret, public = out / f"{args.name}.sec", out / f"{args.name}.pub"
    write_key_pair(key, secret, public)
    print(f"secret key {secret} (keep it private; push --key {secret})\n"
          f"public key {public}: {key.public()}")
    return ExitCode.OK


# -- ci, gc, store ----------------------------------------------------------------------


def cmd_ci_matrix(args: argparse.Namespace) -> int:
    loaded = load_recipe(args)
    include = [{"arch": a, "sm": a.replace(".", "")} for a in loaded.recipe.cuda.archs]
    import json

    print(json.dumps({"include": include}, separators=(",", ":")))
    return ExitCode.OK


def cmd_gc(args: argparse.Namespace) -> int:
    from qwen38build.store.gc import collect

    report = collect(open_store(args), dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    lines = [f"{verb} {d}" for d in report.removed]
    lines += [f"removed tmp/{t} (its owner is dead)" for t in report.tmp_removed]
    print("\n".join(lines) or "nothing to remove")
    for problem in report.problems:
        print(f"warning: {problem}", file=sys.stderr)
    return ExitCode.OK


def cmd_store_verify(args: argparse.Namespace) -> int:
    from qwen38build.store.check import damage, verify

    found = verify(open_store(args))
    bad = damage(found)
    lines = [*map(str, found), *([] if bad else ["every store entry is intact"])]
    emit(args, {"ok": not bad, "findings": [f.as_json() for f in found]}, "\n".join(lines))
    return ExitCode.FAILED if bad else ExitCode.OK


# -- lint, table ------------------------------------------------------------------------


def cmd_lint(args: argparse.Namespace) -> int:
    from qwen38build.lint import lint

    # Lint reports a series that disagrees with its folders as findings with their lines,
    # so it loads the recipe's schema only.
    loaded = lint.load_for_lint(Path(args.recipe))
    # A listed patch that is missing is the same error as for build: nothing to lint.
    from qwen38build.errors import RecipeError
    from qwen38build.inputs.recipe import entry_problems

    missing = entry_problems(loaded)
    if missing:
        raise RecipeError(args.recipe, missing)
    try:
        pristine = _pristine_wheel(open_store(args), load_plan(loaded))
    except Qwen38BuildError:
        pristine = None  # no usable lock: the knob rule says it could not read envs.py
    findings = lint.check(loaded, pristine_envs=pristine)
    for f in findings:
        print(f)
        print(f"  hint: {f.hint}")
    print(f"{len(findings)} finding(s)" if findings else "lint: clean")
    return ExitCode.FAILED if findings else ExitCode.OK


def cmd_table(args: argparse.Namespace) -> int:
    from qwen38build.series import table

    loaded = load_recipe(args)
    md = loaded.root / "PATCHES.md"
    if args.check:
        diff = table.check(loaded, md)
        if diff:
            print(diff)
            print(f"{md.name}: the table is stale; run `qwen38build table`", file=sys.stderr)
            return ExitCode.FAILED
        print(f"{md.name}: table is current")
        return ExitCode.OK
    changed = table.write(loaded, md)
    print(f"{md.name}: {'updated' if changed else 'already current'}")
    return ExitCode.OK


COMMANDS = ("build", "plan", "show", "why", "reproduce", "lock", "env", "verify", "apply",
            "workspace", "export", "bump", "kernels", "ci", "gc", "store", "lint", "table",
            "push", "cache")


# -- parser -----------------------------------------------------------------------------


class _Skipped:
    """Stands in for the sub-parser of a command this run does not use: building all
    twenty sub-parsers costs more than most commands' own work (verify's, say)."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: self


def _command_of(argv: list[str]) -> str | None:
    """The sub-command ``argv`` names, past the global options; None if unsure."""
    i = 0
    while i < len(argv) and argv[i] in ("--recipe", "--store", "--substituter",
                                        "--trusted-public-key", "--offline"):
        i += 1 if argv[i] == "--offline" else 2
    return argv[i] if i < len(argv) and not argv[i].startswith("-") else None


def parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``only``, that command's sub-parser alone is built."""
    import argparse

    class Parser(argparse.ArgumentParser):
        """argparse, but a usage mistake is a UsageError: one line, exit 2, via main."""

        def error(self, message: str) -> Any:
            raise UsageError(f"command line: {message}.",
                             hint=f"run `{self.prog} --help` for the usage")

    p = Parser(prog="qwen38build", description=DESCRIPTION,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default="recipe.toml", help="the recipe (default: ./recipe.toml)")
    p.add_argument("--store", help="store directory (default: $QWEN38BUILD_STORE or the user "
                   "cache dir)")
    p.add_argument("--offline", action="store_true", help="ask no binary cache; never touch "
                   "the network for one")
    p.add_argument("--substituter", action="append", metavar="URL", help="a binary cache to "
                   "substitute from (repeatable; replaces the configured ones)")
    p.add_argument("--trusted-public-key", action="append", metavar="NAME:KEY",
                   help="a key whose signatures are trusted (repeatable; replaces the "
                   "configured ones)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, func: Any, help: str, *, json_flag: bool = False) -> Any:
        if only is not None and name != only:
            return _Skipped()
        sp = sub.add_parser(name, help=help, description=help)
        sp.set_defaults(func=func)
        if json_flag:
            sp.add_argument("--json", action="store_true", help="machine-readable output")
        return sp

    b = add("build", cmd_build, "build the stack: the patched vLLM wheel, the pthfa wheel "
            "for every arch, the checked environment lock (cache hits do no work)",
            json_flag=True)
    b.add_argument("--only", action="append", metavar="OUTPUT",
                   help="build only these outputs: vllm, pthfa, pylock (repeatable or "
                   "comma-separated; default: the recipe's [build] outputs)")
    b.add_argument("--system-nvcc", action="store_true", help="compile the kernels with the "
                   "nvcc on PATH instead of the locked toolchain (recorded in the digests)")
    b.add_argument("--no-link", action="store_true", help="do not (re)point ./result")
    b.add_argument("--rebuild", action="store_true", help="skip the no-op fast path")
    b.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    pl = add("plan", cmd_plan, "list the steps, their digests and whether each is built",
             json_flag=True)
    pl.add_argument("--system-nvcc", action="store_true", help="plan the kernels with the "
                    "nvcc on PATH instead of the locked toolchain")
    add("show", cmd_show, "print a step's whole derivation").add_argument("step")
    add("why", cmd_why, "say which inputs changed since the last build of a step").add_argument(
        "step")
    r = add("reproduce", cmd_reproduce, "rebuild a build's closure in an empty store and compare",
            json_flag=True)
    r.add_argument("build_hash")
    r.add_argument("--keep", action="store_true", help="keep the temporary store")
    r.add_argument("-q", "--quiet", action="store_true")
    lk = add("lock", cmd_lock, "pin every external input by sha256 into lock/")
    lk.add_argument("--check", action="store_true", help="fail if the lock is stale")
    en = add("env", cmd_env, "make a virtual environment of the stack from the locks and "
             "the store, with uv", json_flag=True)
    en.add_argument("dir", help="where to make it")
    en.add_argument("--python", help="interpreter (path or version; default: the recipe's)")
    en.add_argument("--offline", action="store_true", help="no network: the store and uv's "
                    "cache must hold everything (also UV_OFFLINE=1)")
    for name, func, text in (("verify", cmd_verify, "check a tree holds exactly a build's bytes"),
                             ("apply", cmd_apply, "write a build's files into an installed vLLM")):
        sp = add(name, func, text, json_flag=name == "verify")
        sp.add_argument("path", help="site-packages, or a directory holding vllm/")
        sp.add_argument("--build", help="build hash (default: ./result, else the last build)")
        if name == "verify":
            sp.add_argument("--full", action="store_true", help="hash every file, not only "
                            "the patched ones")
    ws = add("workspace", None, "a git workspace of the series: one commit per topic")
    ws_sub = ws.add_subparsers(dest="workspace_command", required=True, metavar="WHAT")
    wc = ws_sub.add_parser("create", help="pristine pin (tagged) plus one commit per topic")
    wc.add_argument("dir", nargs="?", help="where (default: ./workspace)")
    wc.set_defaults(func=cmd_workspace_create)
    ex = add("export", cmd_export, "regenerate patch files from the workspace's commits")
    ex.add_argument("dir", nargs="?", help="the workspace (default: ./workspace)")
    ex.add_argument("topics", nargs="*", help="only these topics")
    ex.add_argument("--check", action="store_true", help="fail when a file and its commit "
                    "disagree; write nothing")
    bp = add("bump", cmd_bump, "move the pin and report, per patch, what the new pin means",
             json_flag=True)
    bp.add_argument("package", help="what to bump (vllm)")
    bp.add_argument("version", help="the new version, e.g. 0.33.0")
    bp.add_argument("--dry-run", action="store_true", help="report only; leave recipe and lock")
    bp.add_argument("--rebase", metavar="DIR", help="carry the workspace onto the new pin")
    bp.add_argument("--retire", action="store_true", help="retire the (likely) upstreamed "
                    "patches: series.retired, files deleted, prose kept in PATCHES.md")
    k = add("kernels", cmd_kernels, "compile pthfa per CUDA arch and pack its wheel",
            json_flag=True)
    k.add_argument("--arch", action="append", help="only this arch (repeatable; e.g. 9.0)")
    k.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1,
                   help="arches compiled at once (default: the number of cores)")
    k.add_argument("-q", "--quiet", action="store_true")
    k.add_argument("--system-nvcc", action="store_true", help="compile with the nvcc on PATH "
                   "instead of the locked toolchain (also QWEN38BUILD_NVCC=system); the "
                   "digests record the choice and that nvcc's --version")
    k.add_argument("-o", "--out", metavar="DIR", help="also copy the cubins and the wheel "
                   "into DIR (for CI artifacts)")
    ci = add("ci", None, "continuous-integration helpers")
    ci_sub = ci.add_subparsers(dest="ci_command", required=True, metavar="WHAT")
    ci_sub.add_parser("matrix", help="GitHub Actions matrix, one entry per CUDA arch"
                      ).set_defaults(func=cmd_ci_matrix)
    g = add("gc", cmd_gc, "remove store entries no root reaches")
    g.add_argument("--dry-run", action="store_true")
    st = add("store", None, "store maintenance")
    st_sub = st.add_subparsers(dest="store_command", required=True, metavar="WHAT")
    sv = st_sub.add_parser("verify", help="re-hash every entry; name any that changed")
    sv.set_defaults(func=cmd_store_verify)
    sv.add_argument("--json", action="store_true", help="machine-readable output")
    pu = add("push", cmd_push, "upload builds' closures to a binary cache, signed",
             json_flag=True)
    pu.add_argument("url", help="the cache: http(s)://HOST[:PORT]/PREFIX (GET, HEAD, PUT)")
    pu.add_argument("build", nargs="*", help="build hashes (default: ./result and the last "
                    "kernels build of this recipe)")
    pu.add_argument("--key", metavar="FILE", help="the ed25519 secret key file that signs")
    pu.add_argument("-q", "--quiet", action="store_true")
    ca = add("cache", None, "binary cache helpers")
    ca_sub = ca.add_subparsers(dest="cache_command", required=True, metavar="WHAT")
    kg = ca_sub.add_parser("keygen", help="make an ed25519 key pair NAME.sec and NAME.pub")
    kg.add_argument("name", help="the key's name, e.g. q38-ci-1 (signatures carry it)")
    kg.add_argument("--dir", default=".", help="where to write the two files (default: .)")
    kg.set_defaults(func=cmd_cache_keygen)
    add("lint", cmd_lint, "check the series against the ledger's rules")
    t = add("table", cmd_table, "write PATCHES.md's table from the patch headers")
    t.add_argument("--check", action="store_true", help="fail with a diff when stale")
    return p


def main(argv: list[str] | None = None) -> int:
    """The one error boundary: every error becomes one ``error:`` line and an exit code.

    Our errors carry their own exit code; a foreign one that got past its seam is
    translated here (an OSError names its file), and anything else is reported as an
    internal error in one line. No traceback reaches a user.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        return _run(argv)
    except Qwen38BuildError as exc:
        return _fail(exc, argv)
    except BrokenPipeError:
        # `qwen38build plan --json | head -1`: the reader left; say nothing more.
        _quiet_stdout()
        return int(ExitCode.BROKEN_PIPE)
    except KeyboardInterrupt:
        print("error: interrupted; the store is unchanged by the unfinished step",
              file=sys.stderr)
        return 130
    except Exception as exc:  # the last-resort net
        return _fail(_translate(exc), argv)


def _run(argv: list[str]) -> int:
    from qwen38build.engine.fastpath import try_noop

    done = try_noop(argv)
    if done is not None:
        return done
    command = _command_of(argv)
    args = parser(command if command in COMMANDS else None).parse_args(argv)
    check_args(args)
    if not args.offline:
        return int(args.func(args))
    # For the whole command, a fetch step must not reach the index either; put back after,
    # so an in-process caller (a test, a script) is not left offline.
    before = os.environ.get("QWEN38BUILD_OFFLINE")
    os.environ["QWEN38BUILD_OFFLINE"] = "1"
    try:
        return int(args.func(args))
    finally:
        if before is None:
            del os.environ["QWEN38BUILD_OFFLINE"]
        else:
            os.environ["QWEN38BUILD_OFFLINE"] = before


def _fail(exc: Qwen38BuildError, argv: list[str]) -> int:
    from qwen38build.errors import as_json, one_line

    if "--json" in argv:
        import json

        line = json.dumps(as_json(exc), sort_keys=True)
    elif exc.exit_code == ExitCode.BAD_INPUT or "\n" not in exc.message:
        line = "error: " + one_line(exc)  # bad input: exactly one line
    else:  # a failed build or check: its details (hunk, file, line) are the point
        line = f"error: {exc}" + (f"\nhint: {exc.hint}" if exc.hint else "")
    import contextlib

    with contextlib.suppress(OSError):
        print(line, file=sys.stderr)
    return int(exc.exit_code)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush cannot complain."""
    import contextlib

    with contextlib.suppress(OSError, ValueError, AttributeError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _translate(exc: Exception) -> Qwen38BuildError:
    """A foreign error that escaped its seam, as one of ours (never a traceback)."""
    import json
    import subprocess
    import zipfile

    from qwen38build.errors import InputError, from_os_error

    if isinstance(exc, OSError):
        if exc.filename is None and _STORES:
            exc.filename = _STORES[-1]
            return from_os_error(exc, "writing to the store")
        return from_os_error(exc)
    if isinstance(exc, json.JSONDecodeError):
        return InputError(f"(a JSON file):{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}.",
                          hint="run again with the file fixed or removed")
    if isinstance(exc, zipfile.BadZipFile):
        return InputError(f"(a zip file): {exc}.", hint="fetch or re-pin the wheel")
    if isinstance(exc, subprocess.SubprocessError):
        return Qwen38BuildError(f"a subprocess failed: {exc}.")
    if type(exc).__name__ == "ValidationError":  # pydantic's, not imported here for speed
        return InputError(f"invalid data: {' '.join(str(exc).split())}.")
    return Qwen38BuildError(
        f"internal error: {type(exc).__name__}: {' '.join(str(exc).split())}.",
        hint="this is a bug in qwen38build; please report it with the command line",
    )
