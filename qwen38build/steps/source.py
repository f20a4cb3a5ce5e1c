"""source: a fixed-output source tree (``[sources.<name>]``), checked against the lock's
tree hash.

The digest is the tree hash alone (Nix: a fixed-output derivation), so a mirror's archive
and the origin's give one entry, and no code can change its bytes. Where to look (the
repository, commit, paths, archive URL and mirror folders) travels as hints.
"""

from __future__ import annotations

from pathlib import Path

from qwen38build.cache.config import offline_env
from qwen38build.engine.executor import Context
from qwen38build.steps import ENGINE
from qwen38build.trees.obtain import TreeRequest, obtain

KIND = "source"
FIXED_OUTPUT = True
IMPLEMENTATION = (
    *ENGINE,
    "qwen38build.cache.config",
    "qwen38build.cache.signing",
    "qwen38build.cache.transport",
    "qwen38build.trees.archive",
    "qwen38build.trees.obtain",
    "qwen38build.trees.treehash",
)


def run(ctx: Context) -> None:
    h = ctx.step.hints
    request = TreeRequest(
        name=ctx.step.name, repository=str(h["repository"]), commit=str(h["commit"]),
        paths=tuple(str(p) for p in h["paths"]), archive=h.get("archive"),
        want=str(ctx.step.params["tree_sha256"]),
    )
    mirrors = [Path(m) for m in h.get("mirrors", [])]
    work = ctx.scratch / "obtain"
    work.mkdir()
    got = obtain(request, mirrors, work, offline=offline_env(), say=ctx.report)
    ctx.report(f"tree {got.tree_sha256[:12]} from {got.origin}")
    ctx.hashed.update(got.files)  # hashed once, for the tree hash
    # the tree's files become the entry's outputs, where they are
    for child in sorted(got.path.iterdir()):
        child.rename(ctx.out / child.name)
