"""recipe + lock → the step graph.

The stack has three outputs, each a part of the graph:

- ``vllm``: ``fetch`` (the locked wheel) → ``patch`` (the series) → ``wheel``;
- ``pthfa``: ``fetch`` (each locked compiler wheel) → ``toolchain`` → ``cubin`` per arch →
  ``pthfa-wheel``;
- ``pylock``: the environment lock, checked against what it was locked from;
- ``fa2``: the pinned FlashAttention tree → its diff → a library per arch → a wheel;
- ``vllm-py``: the pristine and patched package's ``.py`` files, for a GPU machine that
  runs the series' kernels without vLLM's compiled ops.

With more than one output, a ``stack`` step links them into one directory and its digest
is the build hash; with one, that part's top step is. Parts of the recipe that have no
buildable content yet are listed as declared, with the reason, and never as steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from qwen38build.digest import sha256_file
from qwen38build.engine.step import Step
from qwen38build.engine.tools import identity
from qwen38build.inputs import lock as lockmod
from qwen38build.inputs.groups import (
    built_groups,
    not_built,
    overlay_label,
    overlay_of,
    source_overlay,
)
from qwen38build.inputs.recipe import Group, LoadedRecipe
from qwen38build.inputs.tree import manifest_files
from qwen38build.steps import implementation


@dataclass(frozen=True)
class Declared:
    """A recipe part that is declared but has nothing to build, and why."""

    name: str
    reason: str


@dataclass(frozen=True)
class Plan:
    """``top`` is what the build makes (the build hash is its digest); ``targets`` names
    every step a caller may need: fetch, patch, wheel, and each output built (vllm, pthfa,
    pylock)."""

    top: Step
    targets: dict[str, Step]
    declared: list[Declared] = field(default_factory=list)

    @property
    def build_hash(self) -> str:
        return self.top.digest


def fetch_step(loaded: LoadedRecipe, entry: lockmod.LockedWheel) -> Step:
    """A fixed-output fetch: its digest is the file name and sha256, nothing else."""
    return Step(
        kind="fetch", implementation=implementation("fetch"), name=entry.filename,
        params={"filename": entry.filename, "sha256": entry.sha256},
        hints={"name": entry.name, "version": entry.version, "size": entry.size,
               "python": loaded.recipe.toolchain.python,
               # pip is asked for the recipe's target system; it takes any wheel it installs
               "platform": loaded.recipe.vllm.platform_tag},
    )


def make_plan(
    loaded: LoadedRecipe, locked: dict[str, lockmod.LockedWheel], *,
    only: list[str] | None = None, system_nvcc: bool = False, with_: Sequence[str] = (),
) -> Plan:
    """The whole graph of a recipe (or of the outputs in ``only``); pure but for hashing
    the input files and checking the environment lock. ``with_`` names the optional groups
    this build adds (UsageError for a name that is none)."""
    entry = lockmod.locked_vllm(loaded, locked)
    fetch = fetch_step(loaded, entry)
    built = built_groups(loaded, with_)
    patch = patch_step(loaded, built, fetch)
    wheel = Step(
        kind="wheel", implementation=implementation("wheel"),
        name=f"{entry.name}-{entry.version}+q38",
        params={"name": entry.name, "version": entry.version, "package": "vllm"},
        deps=(("wheel", fetch), ("patched", patch)),
    )
    targets = {"fetch": fetch, "patch": patch, "wheel": wheel}
    outputs = list(loaded.recipe.build.outputs) if only is None else only
    parts: dict[str, Step] = {}
    for name in outputs:
        if name == "vllm":
            parts[name] = wheel
        elif name == "pthfa":
            parts[name] = kernel_steps(loaded, locked=locked, system_nvcc=system_nvcc)[-1]
        elif name == "pylock":
            parts[name] = pylock_step(loaded)
        elif name == "vllm-py":
            parts[name] = Step(
                kind="py-trees", implementation=implementation("py-trees"),
                name=f"{entry.name}-{entry.version}-py-trees", params={"package": "vllm"},
                deps=(("pristine", fetch), ("patched", wheel)),
            )
        elif name == "fa2":
            why = fa2_missing(loaded)
            if why is None:
                parts[name] = fa2_steps(loaded, locked, system_nvcc=system_nvcc)[-1]
            elif only is not None:
                from qwen38build.errors import UsageError

                raise UsageError(f"command line: --only fa2: fa2 is declared, not built: {why}.",
                                 hint="plan lists what each declared part lacks")
        else:
            from qwen38build.errors import UsageError
            from qwen38build.inputs.recipe import OUTPUTS

            raise UsageError(f"command line: --only {name!r} is not an output of the stack.",
                             hint=f"name one of {', '.join(OUTPUTS)}")
    targets.update(parts)
    top = next(iter(parts.values())) if len(parts) == 1 else Step(
        kind="stack", implementation=implementation("stack"),
        name=f"{entry.name}-{entry.version}-stack", params={"outputs": list(parts)},
        deps=tuple(parts.items()),
    )
    return Plan(top=top, targets=targets, declared=declared_parts(loaded, built))


def patch_step(loaded: LoadedRecipe, built: list[Group], fetch: Step) -> Step:
    """The series of the ``built`` groups applied to the fetched wheel, each group's overlay
    copied in before the group's first patch: ``overlays`` holds [series index, label,
    paths, folder] for each. A local overlay's files are inputs (``<dir>:overlay/<path>``,
    folder None); a source group's overlay is the ``folder`` of its tree, a dependency by
    the label (its digest is the locked tree hash), its paths read when it is applied."""
    series = loaded.series_entries([g.dir for g in built])
    inputs = [(e.row_name, sha256_file(e.path)) for e in series]
    paths = {e.row_name: e.path for e in series}
    overlays: list[list[object]] = []
    deps: list[tuple[str, Step]] = [("wheel", fetch)]
    at = 0
    for g in built:
        overlay = overlay_of(loaded, g)
        if overlay is not None:
            overlays.append([at, overlay.label, [rel for rel, _ in overlay.files], None])
            for rel, path in overlay.files:
                inputs.append((f"{overlay.label}/{rel}", sha256_file(path)))
                paths[f"{overlay.label}/{rel}"] = path
        elif g.source is not None:
            tree = source_step(loaded, g.source)
            assert tree is not None, "built_groups() leaves out a group whose source is unlocked"
            overlays.append([at, overlay_label(g.dir), None, source_overlay(g)])
            deps.append((overlay_label(g.dir), tree))
        at += len(g.patches)
    return Step(
        kind="patch", implementation=implementation("patch"), name="series",
        # GNU patch is the machine's: the release the recipe names is part of what the step
        # is (checked against the machine's where the series is applied).
        params={"package": "vllm", "series": [e.row_name for e in series],
                "groups": [g.dir for g in built], "overlays": overlays,
                "gnu_patch": loaded.recipe.toolchain.gnu_patch},
        inputs=tuple(inputs), deps=tuple(deps), input_paths=paths,
    )


def pylock_step(loaded: LoadedRecipe) -> Step:
    """The environment lock as an output; LockError when it is missing, edited or stale."""
    from qwen38build.pinning import pylock as envlock

    path = envlock.check(loaded)
    return Step(
        kind="pylock", implementation=implementation("pylock"), name=path.name,
        params={}, inputs=((path.name, sha256_file(path)),), input_paths={path.name: path},
    )


def declared_parts(loaded: LoadedRecipe, built: list[Group] | None = None) -> list[Declared]:
    r = loaded.recipe
    out: list[Declared] = []
    built = r.series.groups if built is None else built
    for g in built:
        if not g.patches and g.overlay is None and g.source is None:
            out.append(Declared(f"series group {g.dir}/", "declared, empty: no patches yet"))
    for name, reason in not_built(loaded, built):
        out.append(Declared(f"series group {name}/", f"declared, not built: {reason}"))
    why = fa2_missing(loaded)
    if why is not None:
        out.append(Declared("fa2", f"declared, not built: {why}"))
    return out


def fa2_missing(loaded: LoadedRecipe) -> str | None:
    """What FA2 lacks to be built (its diff, its build description, a locked source), or
    None when it can be."""
    from qwen38build.engine.reads import probe

    r, root = loaded.recipe, loaded.root
    missing = []
    for rel in (r.fa2.diff, r.fa2.build):
        probe(root / rel)
        if not (root / rel).is_file():
            missing.append(f"{rel} does not exist")
    trees = lockmod.read_trees(root) if lockmod.lock_path(root).is_file() else {}
    missing += [f"source {n!r} is not locked" for n in (r.fa2.source, r.fa2.cutlass)
                if n not in trees]
    return "; ".join(missing) or None


def source_step(loaded: LoadedRecipe, name: str,
                trees: dict[str, lockmod.LockedTree] | None = None) -> Step | None:
    """The fixed-output tree ``[sources.<name>]``: its digest is the locked tree hash alone.
    None when the lock holds no such tree; LockError when it holds another one."""
    trees = lockmod.read_trees(loaded.root) if trees is None else trees
    locked = trees.get(name)
    if locked is None:
        return None
    why = lockmod.tree_mismatch(loaded, name, locked)
    if why is not None:
        from qwen38build.errors import LockError

        raise LockError(f"{lockmod.lock_path(loaded.root)}: {why}.",
                        hint="run `qwen38build lock` to re-pin it")
    spec = loaded.recipe.sources[name]
    return Step(
        kind="source", implementation=implementation("source"), name=name,
        params={"tree_sha256": locked.tree_sha256},
        hints={"repository": spec.repository, "commit": spec.commit, "paths": list(spec.paths),
               "archive": spec.archive, "mirrors": [str(m) for m in loaded.mirrors()]},
    )


def fa2_steps(loaded: LoadedRecipe, locked: dict[str, lockmod.LockedWheel],
              archs: list[str] | None = None, *, system_nvcc: bool = False) -> list[Step]:
    """FA2: the pinned tree → the diff applied at fuzz 0 → a library per arch (the locked
    nvcc, or the system's when asked; ``fa2/build.py`` as the builder) → the fa2fp8 wheel."""
    import os

    from qwen38build.inputs.recipe import normalise_arch
    from qwen38build.inputs.tree import tree_files

    r, root = loaded.recipe, loaded.root
    tree, cutlass = source_step(loaded, r.fa2.source), source_step(loaded, r.fa2.cutlass)
    assert tree is not None and cutlass is not None, "fa2_missing() said FA2 can be built"
    diff = root / r.fa2.diff
    patched = Step(
        kind="tree-patch", implementation=implementation("tree-patch"), name="fa2-patched",
        params={"gnu_patch": r.toolchain.gnu_patch},
        inputs=((diff.name, sha256_file(diff)),), input_paths={diff.name: diff},
        deps=(("tree", tree),),
    )
    folder = (root / r.fa2.build).parent
    builder = {n: p for n, p in tree_files(folder, ".")
               if n in ("build.py", "build.toml") or n.startswith("csrc/")}
    compiler, tc = compiler_of(loaded, locked, system_nvcc)
    libs = [
        Step(kind="fa2-lib", implementation=implementation("fa2-lib"),
             name=f"fa2-sm_{a.replace('.', '')}", params={"arch": a, **compiler},
             inputs=tuple((n, sha256_file(p)) for n, p in builder.items()),
             input_paths=builder, hints={"jobs": os.cpu_count() or 1},
             deps=(("tree", patched), ("cutlass", cutlass), *tc))
        for a in ([normalise_arch(a) for a in archs] if archs else r.cuda.archs)
    ]
    package = dict(tree_files(folder, "python/fa2fp8"))
    wheel = Step(
        kind="fa2-wheel", implementation=implementation("fa2-wheel"), name="fa2-wheel",
        params={"version": "0.1.0"},
        inputs=tuple((n, sha256_file(p)) for n, p in package.items()), input_paths=package,
        deps=tuple((lib.name, lib) for lib in libs),
    )
    return [tree, cutlass, patched, *libs, wheel]


def toolchain_step(loaded: LoadedRecipe, locked: dict[str, lockmod.LockedWheel]) -> Step:
    """The CUDA toolchain: a fetch step per locked compiler wheel, extracted as one entry.

    Its digest covers each wheel's locked file name and sha256 (through the fetch steps) and
    the recipe's CUDA series; LockError when the lock does not serve that series.
    """
    from qwen38build.kernels import toolchain

    entries = toolchain.locked_toolchain(loaded, locked)
    cuda = toolchain.series(loaded)
    return Step(
        kind="toolchain", implementation=implementation("toolchain"), name=f"cuda-{cuda}-toolchain",
        params={"cuda": cuda, "top": toolchain.top_dir(cuda)},
        deps=tuple((e.name, fetch_step(loaded, e)) for e in entries),
    )


def compiler_of(
    loaded: LoadedRecipe, locked: dict[str, lockmod.LockedWheel] | None, system_nvcc: bool,
) -> tuple[dict[str, object], tuple[tuple[str, Step], ...]]:
    """A compile step's compiler: (its params, its deps). The locked toolchain (a dependency,
    so its wheels' sha256s are in the digest) unless ``system_nvcc``: then the nvcc on PATH,
    its ``--version`` text and its bytes' identity in the digest (KernelBuildError when
    there is none)."""
    from qwen38build.kernels.kernels import Nvcc, nvcc_version

    if system_nvcc:
        return {"nvcc": "system", "nvcc_version": nvcc_version(Nvcc.find_system()),
                "nvcc_identity": identity("nvcc", content=True)}, ()
    tc = toolchain_step(loaded, lockmod.read(loaded.root) if locked is None else locked)
    return {"nvcc": "toolchain"}, (("toolchain", tc),)


def kernel_steps(
    loaded: LoadedRecipe, archs: list[str] | None = None, *,
    locked: dict[str, lockmod.LockedWheel] | None = None, system_nvcc: bool = False,
) -> list[Step]:
    """One cubin step per CUDA arch (PTX for the newest), then the pthfa wheel step.

    The cubins compile with the locked toolchain (a dependency of each; ``locked`` defaults
    to reading lock/), so they are planned without any nvcc on this machine. Only with
    ``system_nvcc`` do they use the nvcc on PATH, and then its ``--version`` text is in
    their digest (KernelBuildError when there is none).
    """
    from qwen38build.inputs.recipe import normalise_arch
    from qwen38build.kernels.kernels import NVCC_FLAGS

    r = loaded.recipe
    src = loaded.root / r.pthfa.path
    if not (src / "csrc").is_dir():
        from qwen38build.errors import KernelBuildError

        raise KernelBuildError(f"{src / 'csrc'} does not exist; there are no kernel sources.")
    # The vendored tree is read one safe way: regular files only, each as MANIFEST lists it
    # (a link to a host file, or a file nobody listed, is refused before anything is built).
    found = manifest_files(src, "csrc", suffixes=(".cu", ".cuh", ".h"))
    if any("/" in rel for rel, _ in found):
        from qwen38build.errors import KernelBuildError

        raise KernelBuildError(f"{src / 'csrc'}: kernel sources live at its top level.")
    csrc = [p for _, p in found]
    sources = tuple((p.name, sha256_file(p)) for p in csrc)
    compiler, deps = compiler_of(loaded, locked, system_nvcc)
    all_archs = list(r.cuda.archs)
    newest = max(all_archs, key=lambda a: tuple(int(x) for x in a.rstrip("af").split(".")))
    wanted = [normalise_arch(a) for a in archs] if archs else all_archs
    cubins = [
        Step(kind="cubin", implementation=implementation("cubin"),
             name=f"pthfa-sm_{a.replace('.', '')}",
             params={"arch": a, "flags": list(NVCC_FLAGS), "ptx": a == newest, **compiler},
             inputs=sources, input_paths={p.name: p for p in csrc}, deps=deps)
        for a in wanted
    ]
    names = dict(manifest_files(src, "python/pthfa"))
    # vLLM finds pthfa's backend by the plugin entry point in the wheel's dist-info.
    points = dict(manifest_files(src, ".", suffixes=("entry_points.txt",)))
    if "entry_points.txt" in points:
        names["dist-info/entry_points.txt"] = points["entry_points.txt"]
    wheel = Step(
        kind="pthfa-wheel", implementation=implementation("pthfa-wheel"), name="pthfa-wheel",
        params={"version": r.pthfa.tag.lstrip("v"), "archs": wanted},
        inputs=tuple((n, sha256_file(p)) for n, p in names.items()),
        deps=tuple((c.name, c) for c in cubins), input_paths=names,
    )
    return [*cubins, wheel]
