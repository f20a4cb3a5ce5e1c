"""bump: what moving the vLLM pin means for every patch of the series, at once.

``bump`` locks the new wheel, extracts from the old and the new pristine wheels only the
files the series touches (never the whole wheel), and tries every patch in series order
with GNU patch at fuzz 0 against the new pristine files, on top of the earlier patches that
applied. Each patch gets one outcome:

``clean``
    applies exactly.
``offset``
    applies, some hunks at other lines (which hunks, by how many lines).
``upstreamed``
    does not apply, but reverse-applies cleanly to the same tree (the new pristine files
    plus the earlier patches that applied): upstream carries it; a retire candidate.
``deleted``
    a file it changes is in the old wheel but not in the new one (deleted or moved; files
    of the new wheel with the same name are named as the likely new place).
``likely-upstreamed``
    does not apply, but every failing hunk's change is in the new pin in other words
    (:mod:`qwen38build.series.upstreamed`: its added lines in the upstream diff, or a change
    alike in the same region); shown side by side with the similarity. A retire
    candidate, as ``upstreamed`` is; ``--retire`` retires both.
``depends-on-failed``
    every hunk that fails stands, in the old pin's tree with the series applied up to
    it, on lines that an earlier patch which fails now brought in, and its own context
    lines (the rest) still stand in the new tree: fixing that patch comes first, and its
    own failure would be a false conflict. Where its own lines are gone too (upstream
    re-indented the region, say) it is a conflict of its own.
``conflict``
    anything else; each failing hunk is named with its file and the patch file's line, with
    the upstream change in that region (a unified diff of the old and new pristine file
    around the hunk).

The old tree with the series applied (for ``depends-on-failed`` and for locating a hunk in
the old pristine file; :class:`~qwen38build.series.lineage.Lineage`, in memory) is only built
when some patch fails. ``BumpReport.ok`` is True when
every patch is ``clean`` or ``offset``. Unless ``dry_run``, ``recipe.toml`` gets the new
``[vllm] version`` (edited with tomlkit: comments and layout stay) and ``lock/`` the new
wheel. With ``rebase=DIR``, the workspace in DIR (made first when DIR is new) is carried
onto the new pristine tree with git cherry-pick, stopping at the first conflict.

Where the new wheel comes from, in order: a fetch entry of the store for that exact file
(its sha256 is the one recorded when it was fetched); a file of that name in a directory of
``$QWEN38BUILD_SOURCES``; pip. The wheel then goes through the store like any fetch.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from qwen38build.bump import kept, members
from qwen38build.bump.carry import carry_state
from qwen38build.bump.overlay import overlay_in_upstream
from qwen38build.bump.report import (
    RETIRABLE,
    BumpReport,
    EnvReport,
    RebaseResult,
)
from qwen38build.bump.trial import try_series
from qwen38build.digest import sha256_file
from qwen38build.engine.fetch import locked_wheel, wheel_in_store
from qwen38build.errors import FetchError, InputError, LockError, Qwen38BuildError
from qwen38build.inputs import lock as lockmod
from qwen38build.inputs.env import source_dirs
from qwen38build.inputs.recipe import LoadedRecipe
from qwen38build.pinning import envmove
from qwen38build.pinning import pylock as envlock
from qwen38build.proc import run
from qwen38build.series.patchfile import PatchFile
from qwen38build.store.store import Store
from qwen38build.workspace import gitrepo, workspace
from qwen38build.workspace.workspace import PACKAGE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from packaging.requirements import Requirement

# -- resolving the new wheel -------------------------------------------------------------


def resolve_wheel(
    loaded: LoadedRecipe, store: Store, version: str
) -> tuple[lockmod.LockedWheel, Path]:
    """Lock ``vllm==version`` (same tags as the recipe) and return it with its store path."""
    pin = loaded.recipe.vllm.model_copy(update={"version": version})
    filename = pin.wheel_filename
    python = loaded.recipe.toolchain.python

    def entry(sha: str, size: int, name: str = filename) -> lockmod.LockedWheel:
        return lockmod.LockedWheel(
            name=pin.name, version=version, filename=name, python_tag=pin.python_tag,
            abi_tag=pin.abi_tag, platform_tag=pin.platform_tag, sha256=sha, size=size,
        )

    found = _in_store(store, filename)
    if found is not None:
        e = entry(*found)
        return e, wheel_in_store(loaded, store, e)
    for d in source_dirs():
        p = d / filename
        if p.is_file():
            e = entry(sha256_file(p), p.stat().st_size)
            return e, wheel_in_store(loaded, store, e)
    from qwen38build.cache.config import offline_env
    from qwen38build.steps.fetch import pip_download

    if offline_env():
        raise FetchError(
            f"{filename} is in no local store or sources folder, and offline mode forbids "
            "fetching it.", hint="run once without --offline, or set QWEN38BUILD_SOURCES")
    with tempfile.TemporaryDirectory(prefix="q38-bump.") as tmp:
        got = pip_download(pin.name, version, python=python, platform=pin.platform_tag,
                           dest=Path(tmp))
        if got.name != filename:
            raise LockError(
                f"pip fetched {got.name} for {pin.name}=={version}, but the recipe's tags "
                f"ask for {filename}.",
                hint="check [vllm] python_tag, abi_tag and platform_tag",
            )
        e = entry(sha256_file(got), got.stat().st_size)
        return e, wheel_in_store(loaded, store, e, source_dirs=[Path(tmp)])


def _in_store(store: Store, filename: str) -> tuple[str, int] | None:
    """(sha256, size) of a fetched ``filename`` in the store: a fetch is keyed by its file
    name (which carries name, version and tags) and sha256 alone."""
    for digest in store.entries():
        try:
            meta = json.loads(store.meta_path(digest).read_bytes())
        except (OSError, ValueError):
            continue
        drv = meta.get("derivation", {})
        params = drv.get("params", {})
        if drv.get("kind") != "fetch" or params.get("filename") != filename:
            continue
        entry = store.get(digest)
        if entry is None:
            continue  # changed since written: not to be trusted
        return str(params["sha256"]), int(entry.outputs[filename]["size"])
    return None


# -- bump -------------------------------------------------------------------------------


def bump(
    loaded: LoadedRecipe, store: Store, new_version: str, dry_run: bool = True,
    rebase: Path | None = None, retire: bool = False,
) -> BumpReport:
    """Try the series on vllm ``new_version``; unless ``dry_run``, re-pin recipe and lock,
    and with ``retire`` retire every upstreamed and likely-upstreamed patch
    (:mod:`qwen38build.series.retire`)."""
    from packaging.version import InvalidVersion, Version

    t0 = time.perf_counter()
    try:
        Version(new_version)
    except InvalidVersion:
        raise InputError(f"{new_version!r} is not a PEP 440 version.") from None
    loaded = _from_lock(loaded)
    old_version = loaded.recipe.vllm.version
    old_wheel = locked_wheel(loaded, store)
    new_entry, new_wheel = resolve_wheel(loaded, store, new_version)
    old_sha = lockmod.locked_vllm(loaded, lockmod.read(loaded.root)).sha256
    caches = (store.root / members.FOLDER / old_sha,
              store.root / members.FOLDER / new_entry.sha256)
    versions = (old_version, new_version)
    patches, _ = kept.trial(
        loaded, store, (old_sha, new_entry.sha256), versions,
        lambda: try_series(loaded, old_wheel, new_wheel, versions, caches))
    report = BumpReport(old_version, new_version, new_entry, patches, dry_run,
                        overlays=overlay_in_upstream(loaded, new_wheel, store))
    reasons = {p.patch: f"{p.outcome} in {new_version}: {p.summary()}"
               for p in patches if p.outcome in RETIRABLE} if retire and not dry_run else {}
    report.environment, env_lock = relock_environment(loaded, new_entry, new_wheel, store,
                                                      caches[1])
    if rebase is not None:
        topics = {e.row_name: e.topic for e in loaded.series_entries()}
        report.rebase = rebase_workspace(loaded, store, rebase, new_version, new_wheel,
                                         skip=frozenset(topics[r] for r in reasons))
    if not dry_run:
        torch = report.environment.torch if report.environment is not None else None
        repin(loaded, new_entry, torch=torch[1] if torch else None)
        if env_lock is not None:
            envlock.write(loaded.root, env_lock)
        if reasons:
            from qwen38build.series.retire import retire as retire_topics

            retire_topics(loaded, reasons, new_version)
            report.retired = tuple(reasons)
    report.seconds = time.perf_counter() - t0
    return report


def _from_lock(loaded: LoadedRecipe) -> LoadedRecipe:
    """``loaded`` with the locked vLLM version as its pin when the recipe's pin was edited
    by hand (the version moved, the tags did not): the old pin is what the lock holds, so
    `bump vllm X` after editing the recipe to X moves from there, as the build's hint says."""
    import dataclasses

    entry = lockmod.read(loaded.root).get(loaded.recipe.vllm.name)
    if entry is None or not lockmod.moved_pin(loaded, entry):
        return loaded
    vllm = loaded.recipe.vllm.model_copy(update={"version": entry.version})
    return dataclasses.replace(loaded, recipe=loaded.recipe.model_copy(update={"vllm": vllm}))


#: The store's folder of environment locks bump made, each named by the key of what it was
#: locked from (:func:`_relock_key`): a later bump to the same pin takes it, with no uv run.
ENVLOCKS = "envlocks"


def relock_environment(
    loaded: LoadedRecipe, entry: lockmod.LockedWheel, wheel: Path, store: Store,
    cache: Path | None = None,
) -> tuple[EnvReport | None, envlock.Locked | None]:
    """Lock the environment for the new pin (nothing written) and compare with the current.

    A project without an environment lock gets None. When the recipe's torch is excluded
    by the new pin but the pin names one version, the lock takes that one and the report
    says the recipe's torch moves with it. A failure (uv, the network) is reported, not
    raised: the per-patch report stands on its own. The lock is cached in the store by
    what it is made from, so a bump to the same pin asks uv once. Offline (``--offline``,
    ``QWEN38BUILD_OFFLINE=1``) uv is never run, as it would ask the index: without a
    cached lock the report says the lock was not re-made.
    """
    from email.parser import BytesHeaderParser

    from qwen38build.cache.config import offline_env

    path = envlock.pylock_path(loaded.root)
    if not path.is_file():
        return None, None
    try:
        pin = f"{entry.name} {entry.version}"
        meta = BytesHeaderParser().parsebytes(members.metadata(wheel, cache))
        reqs = envlock.pin_requirements(loaded, entry, wheel, meta)
        torch = envlock.torch_for(loaded, pin, reqs)
        key = store.root / ENVLOCKS / f"{_relock_key(loaded, entry, reqs, torch)}.json"
        locked = _cached_lock(key)
        cached = locked is not None
        if locked is None:
            if offline_env():
                return EnvReport(None, offline=True), None
            locked = envlock.compute(loaded, entry, wheel, torch=torch)
            key.parent.mkdir(parents=True, exist_ok=True)
            store.write_json(key, {"text": locked.text, "inputs": locked.inputs,
                                   "requirements": locked.requirements})
        # what moves for the stack's Python (the lock covers every one the pin supports)
        env = envlock.marker_env(loaded.recipe.toolchain.python,
                                 envlock.target_platform(loaded, entry))
        old = envlock.versions(envlock.read_text(path), str(path), env)
        new = envlock.versions(locked.text, f"the lock of {pin}", env)
    except Qwen38BuildError as exc:
        return EnvReport(None, error=str(exc).replace("\n", " ")), None
    was = loaded.recipe.toolchain.torch
    return EnvReport(envmove.diff(old, new), (was, torch) if torch != was else None,
                     cached=cached), locked


def _relock_key(loaded: LoadedRecipe, entry: lockmod.LockedWheel, reqs: list[Requirement],
                torch: str) -> str:
    """What a lock of the new pin is made from: the lock's inputs (pin, its sha256, Python,
    platform, torch, CUDA), the requirements, uv's version, and uv's configuration as far
    as this process names it (its ``UV_*`` variables, the bytes of its config file)."""
    import importlib.metadata
    import os

    from platformdirs import user_config_dir

    from qwen38build.digest import sha256_json

    conf = Path(os.environ.get("UV_CONFIG_FILE") or Path(user_config_dir("uv")) / "uv.toml")
    return sha256_json({
        "format": 1, "inputs": envlock.inputs(loaded, entry, torch),
        "requirements": [str(r) for r in reqs], "uv": importlib.metadata.version("uv"),
        "uv_env": {k: v for k, v in os.environ.items()
                   if k.startswith("UV_") and k not in ("UV_CACHE_DIR", "UV_OFFLINE")},
        "uv_config": sha256_file(conf) if conf.is_file() else None,
    })


def _cached_lock(path: Path) -> envlock.Locked | None:
    """The lock cached at ``path``, or None (absent or not well formed: made again)."""
    try:
        data = json.loads(path.read_bytes())
        inputs: envlock.LockInputs = data["inputs"]  # the cache's own file, written by save
        locked = envlock.Locked(str(data["text"]), inputs,
                                [str(r) for r in data["requirements"]])
        if not envlock.versions(locked.text, str(path), {}):  # parses, or raises
            return None
    except (OSError, ValueError, KeyError, TypeError, Qwen38BuildError):
        return None
    return locked


def repin(loaded: LoadedRecipe, entry: lockmod.LockedWheel, *, torch: str | None = None) -> None:
    """Set ``[vllm] version`` (and ``[toolchain] torch`` when given) in recipe.toml, layout
    and comments kept, and lock the wheel."""
    import tomlkit

    from qwen38build.inputs.recipe import validate

    text = loaded.path.read_text(encoding="utf-8")
    doc = tomlkit.parse(text)
    doc["vllm"]["version"] = entry.version
    if torch is not None:
        doc["toolchain"]["torch"] = torch
    new_text = tomlkit.dumps(doc)
    validate(tomlkit.parse(new_text).unwrap(), loaded.path)
    others = [e for n, e in lockmod.read(loaded.root).items() if n != entry.name]
    from qwen38build.files import atomic_write

    atomic_write(loaded.path, new_text.encode("utf-8"))
    lockmod.write(loaded.root, [*others, entry])


# -- rebase -----------------------------------------------------------------------------


def rebase_workspace(
    loaded: LoadedRecipe, store: Store, repo: Path, new_version: str, new_wheel: Path,
    skip: frozenset[str] = frozenset(),
) -> RebaseResult:
    """Carry the workspace's topics onto the new pristine package with git cherry-pick.

    The new pristine package is committed as a child of ``v<old>`` and tagged
    ``v<new>``; branch ``qwen38-<new>`` starts there and gets each topic commit of
    ``v<old>..HEAD`` in order (3-way, diff3 conflict style). At a conflict it stops, with
    git's cherry-pick state in place: resolve, ``git add``, ``workspace continue DIR``
    (:mod:`.carry`).
    """
    repo = repo.resolve()
    if not repo.exists() or not any(repo.iterdir()):
        workspace.create(loaded, store, repo)
    git = gitrepo.git
    gitrepo.local_identity(repo, keep=True)  # a workspace made before it was written
    old_tag = workspace.pin_tag(loaded.recipe.vllm.version)
    new_tag = workspace.pin_tag(new_version)
    branch = f"{workspace.BRANCH}-{new_version}"
    if git(repo, "status", "--porcelain", "--untracked-files=no").strip():
        raise InputError(f"{repo}: the workspace has uncommitted changes.",
                         hint="commit or stash them first")
    if git(repo, "rev-parse", "-q", "--verify", f"refs/tags/{new_tag}", check=False).strip():
        raise InputError(f"{repo}: tag {new_tag} exists already: the carry was started.",
                         hint=f"continue on branch {branch}, or use a fresh workspace")
    touched: set[str] = set()
    for e in loaded.series_entries():
        touched.update(PatchFile.parse(e.path).touched_paths)
    with tempfile.TemporaryDirectory(prefix="q38-rebase.") as tmp:
        tree_dir = Path(tmp) / "tree"
        workspace.extract_package(new_wheel, tree_dir / PACKAGE, touched)
        env = gitrepo.git_env(GIT_INDEX_FILE=str(Path(tmp) / "index"))

        def tgit(*args: str, stdin: str | None = None) -> str:
            return git(repo, f"--work-tree={tree_dir}", *args, stdin=stdin, env=env)

        tgit("add", "-A", "--", PACKAGE)
        tree = tgit("write-tree").strip()
        base = git(repo, "rev-parse", f"{old_tag}^{{commit}}").strip()
        pristine = git(repo, "commit-tree", tree, "-p", base,
                       stdin=workspace.pristine_subject(new_version) + "\n").strip()
    old_head = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "tag", new_tag, pristine)
    git(repo, "checkout", "-q", "-B", branch, pristine)
    # One range (or one list), so that git's sequencer carries the rest after
    # `cherry-pick --continue`; topics in ``skip`` (and their fixups) are left out.
    picks = [f"{old_tag}..{old_head}"]
    skipped: list[str] = []
    if skip:
        picks = []
        for c in workspace.read_commits(repo, f"{old_tag}..{old_head}"):
            subject = c.subject
            for prefix in workspace.FOLD_PREFIXES:
                subject = subject.removeprefix(prefix)
            topic = subject.removeprefix(workspace.SUBJECT_PREFIX)
            if topic in skip:
                skipped.append(topic)
            else:
                picks.append(c.sha)
    # In the workspace's own config, not `-c`: every pick that `cherry-pick --continue`
    # makes later shows its conflicts with the base too, as the first one does.
    gitrepo.git(repo, "config", "merge.conflictStyle", "diff3")
    proc = run(["git", "cherry-pick", "--keep-redundant-commits", "--allow-empty", *picks],
               what="git", cwd=repo, env=gitrepo.git_env()) if picks else None
    return carry_state(repo, branch, new_tag, proc is None or proc.ok,
                       tuple(dict.fromkeys(skipped)))
