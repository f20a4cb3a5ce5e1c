"""``verify`` and ``apply``: an installed tree against a build's exact bytes."""

from __future__ import annotations

import os
from pathlib import Path

from qwen38build.cli import stages
from qwen38build.errors import CheckFailed, ExitCode, Qwen38BuildError, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from qwen38build.store.store import Store
    from qwen38build.wheels.manifest import Manifest



def _manifest(args: argparse.Namespace) -> tuple[Manifest, Path]:
    manifest, tree, _ = _build_parts(args)
    return manifest, tree


def _build_parts(args: argparse.Namespace) -> tuple[Manifest, Path, Path | None]:
    """The build's wheel manifest, its patched tree, and its pthfa wheel (None for a build
    without one, or whose pthfa wheel this store never held)."""
    from qwen38build.store.record import check_build_hash, read_build, roots
    from qwen38build.wheels.installed import read_manifest

    store = stages.open_store(args)
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
    pthfa = next((s for s in rec["steps"] if s["derivation"]["kind"] == "pthfa-wheel"
                  and s["outputs"]), None)
    pthfa_wheel = None
    if pthfa is not None:
        entry = store.get(check_build_hash(str(pthfa["digest"])))
        pthfa_wheel = entry.the_output(".whl") if entry is not None else None
    return read_manifest(store.objects / wheel_digest), tree, pthfa_wheel


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
    """Every installed part of the build: the patched vLLM tree, its dist-info, and pthfa
    (when the build has it)."""
    from qwen38build.wheels.installed import (
        find_package,
        verify_dist_info,
        verify_tree,
        verify_wheel_files,
    )

    manifest, _, pthfa = _build_parts(args)
    problems = verify_tree(Path(args.path), manifest, full=args.full)
    site = find_package(Path(args.path), str(manifest["package"])).parent
    problems += verify_dist_info(site, manifest)
    if pthfa is not None:
        problems += verify_wheel_files(site, pthfa)
    ok = not problems
    text = (f"{args.path}: holds exactly build {manifest['local_version']}" if ok else
            "\n".join(str(p) for p in problems) + f"\n{len(problems)} difference(s)")
    stages.emit(args, {"ok": ok, "problems": [p.as_json() for p in problems]}, text)
    if not ok:
        raise CheckFailed(f"{args.path}: does not hold build {manifest['local_version']} "
                          f"({len(problems)} difference(s) above).",
                          hint="run `qwen38build apply` on it, or reinstall the build's wheels")
    return ExitCode.OK


def cmd_apply(args: argparse.Namespace) -> int:
    from qwen38build.wheels.installed import apply_tree

    manifest, tree = _manifest(args)
    changed = apply_tree(Path(args.path), manifest, tree)
    print("\n".join(f"wrote {c}" for c in changed) or "already up to date")
    return ExitCode.OK
