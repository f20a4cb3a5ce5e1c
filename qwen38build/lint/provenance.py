"""The provenance rule: FA2 pinned and its diff present, vendored trees matching their MANIFEST."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from pathlib import Path

from qwen38build.inputs.tree import source_files
from qwen38build.lint.finding import Context, Finding

HEX_RE = re.compile(r"[0-9a-fA-F]{7,40}")
_MANIFEST_RE = re.compile(r"^(?P<sha>[0-9a-f]{64})  (?P<path>\S.*)$")




# -- provenance --------------------------------------------------------------------------


def provenance(ctx: Context) -> Iterator[Finding]:
    yield from _fa2(ctx)
    yield from _pthfa(ctx)
    yield from _overlays(ctx)


def _overlays(ctx: Context) -> Iterator[Finding]:
    """Each series group's overlay against its MANIFEST, as the vendored pthfa tree."""
    from qwen38build.inputs.groups import overlay_folder

    for group in ctx.recipe.series.groups:
        folder = overlay_folder(ctx.loaded, group)
        if folder is not None and folder.is_dir():
            yield from _manifest(ctx, folder, folder / "MANIFEST")


def _fa2(ctx: Context) -> Iterator[Finding]:
    fa2 = ctx.recipe.fa2
    source = ctx.recipe.sources[fa2.source]  # the recipe refuses an fa2.source it lacks
    diff = ctx.root / fa2.diff
    readme = diff.parent / "README.md"
    from qwen38build.engine.reads import probe

    probe(diff)  # its presence decides the rule: the no-op's key must cover it
    if not diff.is_file():
        return  # declared, not written yet: plan says so; nothing to check
    try:
        text = readme.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        yield ctx.finding(
            readme, 1, "provenance",
            f"{ctx.rel(readme).as_posix()} is missing; it must name the repository and the "
            "commit the fa2 diff is cut against.",
            f"write it, naming {source.repository} and commit {source.commit}",
        )
        return
    repo = source.repository.removesuffix("/").removesuffix(".git")
    short = "/".join(repo.split("/")[-2:])
    if repo not in text and short not in text:
        yield ctx.finding(
            readme, 1, "provenance",
            f"{ctx.rel(readme).as_posix()} does not name the repository {source.repository} "
            f"of [sources.{fa2.source}] in recipe.toml.",
            f"name {source.repository} in the README, or fix the recipe's source",
        )
    commit = source.commit.lower()
    named = [t.lower() for t in HEX_RE.findall(text)]
    if not any(t.startswith(commit) or commit.startswith(t) for t in named):
        yield ctx.finding(
            readme, 1, "provenance",
            f"{ctx.rel(readme).as_posix()} does not name commit {source.commit}, the one "
            f"[sources.{fa2.source}] pins.",
            "name the commit the diff is cut against in the README, and make recipe.toml "
            "pin the same",
        )


def _pthfa(ctx: Context) -> Iterator[Finding]:
    pthfa = ctx.recipe.pthfa
    folder = ctx.root / pthfa.path
    pin_path, manifest_path = folder / "PIN", folder / "MANIFEST"
    where = ctx.rel(folder).as_posix()
    if not folder.is_dir():
        yield ctx.finding(
            ctx.loaded.path, ctx.recipe_line("[pthfa]"), "provenance",
            f"the pthfa folder {where}/ does not exist.",
            f"vendor pth-flash-attn {pthfa.tag} into {where}/, or fix pthfa.path",
        )
        return
    try:
        pin_lines = pin_path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        yield ctx.finding(
            pin_path, 1, "provenance",
            f"{where}/PIN is missing; it must name the tag the files are vendored from.",
            f"write {pthfa.tag} on the first line of {where}/PIN",
        )
    else:
        first = pin_lines[0].strip() if pin_lines else ""
        if first != pthfa.tag:
            yield ctx.finding(
                pin_path, 1, "provenance",
                f"{where}/PIN names {first!r} but recipe.toml pins pthfa tag {pthfa.tag!r}.",
                "re-vendor the tag the recipe pins, or change pthfa.tag, so the two agree",
            )
        if pthfa.commit and not any(
            t.lower().startswith(pthfa.commit) or pthfa.commit.startswith(t.lower())
            for t in HEX_RE.findall("\n".join(pin_lines))
        ):
            yield ctx.finding(
                pin_path, 1, "provenance",
                f"{where}/PIN does not name commit {pthfa.commit}, which recipe.toml pins.",
                "write the commit the tag points at in PIN, or fix pthfa.commit",
            )
    yield from _manifest(ctx, folder, manifest_path)


def _manifest(ctx: Context, folder: Path, manifest_path: Path) -> Iterator[Finding]:
    where = ctx.rel(folder).as_posix()
    regen = f"regenerate {where}/MANIFEST (sha256sum of every file but PIN and MANIFEST, " \
        "sorted) after changing the vendored files on purpose"
    try:
        lines = manifest_path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        yield ctx.finding(
            manifest_path, 1, "provenance",
            f"{where}/MANIFEST is missing; nothing checks the vendored files.", regen,
        )
        return
    on_disk = set(vendored_files(folder))
    listed: dict[str, int] = {}
    for no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        m = _MANIFEST_RE.match(line)
        if not m:
            yield ctx.finding(
                manifest_path, no, "provenance",
                f"{where}/MANIFEST line {no} is not '<sha256>  <path>'.", regen,
            )
            continue
        rel = m.group("path")
        if rel in listed:
            yield ctx.finding(
                manifest_path, no, "provenance",
                f"{where}/MANIFEST lists {rel} twice (also line {listed[rel]}).", regen,
            )
            continue
        listed[rel] = no
        if rel not in on_disk:
            yield ctx.finding(
                manifest_path, no, "provenance",
                f"{where}/MANIFEST lists {rel}, which is missing from {where}/.",
                f"restore {where}/{rel} from the vendored tag, or {regen}",
            )
            continue
        actual = hashlib.sha256((folder / rel).read_bytes()).hexdigest()
        if actual != m.group("sha"):
            yield ctx.finding(
                manifest_path, no, "provenance",
                f"{where}/{rel} has sha256 {actual[:12]}..., not the {m.group('sha')[:12]}... "
                "that MANIFEST lists: the vendored file changed.",
                f"restore it from the vendored tag, or {regen}",
            )
    for rel in sorted(on_disk - set(listed)):
        yield ctx.finding(
            manifest_path, len(lines) + 1, "provenance",
            f"{where}/{rel} is not listed in {where}/MANIFEST.",
            f"delete it if it is not part of the vendored tag, or {regen}",
        )


def vendored_files(folder: Path) -> list[str]:
    """Files under ``folder`` its MANIFEST must cover (``inputs.tree.source_files``)."""
    return source_files(folder)
