"""The ledger's rules as code: headers, series, env knobs, diff hygiene, provenance.

``check`` runs every rule over a loaded recipe and returns its findings; an empty list means
the series may be applied. Each finding names the file (relative to the recipe root), the
line, the rule and what to do, because the person reading it is about to fix a patch file,
not to read this module. Nothing here writes a file.

The rules, as ``Finding.rule``:

- ``headers``: the five ledger headers present and non-empty; ``Kind`` one of
  :data:`~qwen38build.series.patchfile.KINDS`; ``Cut-against`` starting with the recipe's vLLM pin;
  the ``--- exported from <sha> (<topic>)`` marker present, with a 7 to 40 hex commit and the
  topic the file is named after.
- ``series``: every file of a group folder is in the series, every entry has its file, no
  entry twice, no retired topic listed or present as a file.
- ``env-knobs``: every environment read a patch adds (found in code by
  :mod:`qwen38build.series.knobs`, in any form or alias) needs its variable registered in
  ``envs.py`` by a hunk of the same patch, or by the registry patch for local knobs
  (:data:`KNOB_REGISTRY`), or by pristine vLLM, whatever its name; other programs'
  variables are listed in the recipe's ``[lint] env_allow``. Registration is what puts a
  knob in the torch.compile cache key.
- ``diff-hygiene``: paths leaving the package, binary diffs, ``diff --git`` names that
  disagree with ``---``/``+++``, ``index`` lines naming another pre-image than the file
  the earlier patches leave (with the pristine wheel; :mod:`~qwen38build.series.diffheaders`),
  whitespace errors of the kinds
  ``git apply --whitespace=error`` reports (trailing whitespace, space before tab in the
  indent, blank lines added at the end of a file), hunk counts that do not match the lines,
  CRLF added to a file that has LF.
- ``enum-alias``: no member a patch adds to an enum takes a value another member of the
  same enum holds (a silent alias; :mod:`~qwen38build.lint.enumalias`), with the pristine
  wheel.
- ``provenance``: ``fa2/README.md`` names the repository and the commit the recipe pins;
  ``pthfa/PIN`` names the recipe's tag; ``pthfa/MANIFEST`` lists the sha256 of every file;
  each local series group overlay's MANIFEST lists the sha256 of every file of it.
"""

from __future__ import annotations

import os
import re
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

from pydantic import ValidationError

from qwen38build.errors import PatchFileError, RecipeError
from qwen38build.inputs import layout
from qwen38build.inputs import recipe as recipe_mod
from qwen38build.inputs.recipe import LoadedRecipe, SeriesEntry
from qwen38build.lint import waivers
from qwen38build.lint.enumalias import enum_aliases
from qwen38build.lint.envknobs import env_knobs, read_pristine_knobs, registered_knobs
from qwen38build.lint.finding import Context, Finding
from qwen38build.lint.hygiene import hygiene
from qwen38build.lint.provenance import HEX_RE, provenance
from qwen38build.lint.waivers import Waived
from qwen38build.series import knobs, lineage
from qwen38build.series.patchfile import KINDS, REQUIRED_HEADERS, PatchFile

RULES = ("headers", "series", "env-knobs", "diff-hygiene", "enum-alias", "provenance")
# The patch that registers this stack's local knobs in envs.py (the ledger's registry).
KNOB_REGISTRY = "speed-knobs-envs"
# Byte code, and measured evidence (results/): neither is vendored source.
def check(
    loaded: LoadedRecipe,
    *,
    pristine_knobs: frozenset[str] | None = None,
    pristine_envs: Path | None = None,
    knob_registry: str = KNOB_REGISTRY,
) -> list[Finding]:
    """The findings no waiver covers (see :func:`check_waived`)."""
    return check_waived(loaded, pristine_knobs=pristine_knobs, pristine_envs=pristine_envs,
                        knob_registry=knob_registry)[0]


def check_waived(
    loaded: LoadedRecipe,
    *,
    pristine_knobs: frozenset[str] | None = None,
    pristine_envs: Path | None = None,
    knob_registry: str = KNOB_REGISTRY,
    rules: tuple[str, ...] = RULES,
) -> tuple[list[Finding], list[Waived]]:
    """Run every rule; the findings come series first, then patch by patch, then provenance,
    then the recipe's waivers that match nothing. Returns them with the waived ones.
    ``rules`` narrows the run (a kernels-only build checks ``provenance`` alone; waivers of
    other rules are then neither used nor reported).

    ``pristine_knobs`` are the knobs pristine vLLM registers (the build passes them, read
    from the pinned wheel); else they are read from ``pristine_envs`` (a wheel or an
    ``envs.py``) when given. With neither, only knobs the series registers count as
    registered, and each env-knob finding says that pristine envs.py was not read.
    """
    ctx = Context(loaded)
    if rules == ("provenance",):
        return waivers.apply(ctx, list(provenance(ctx)), rules=rules)
    if pristine_knobs is None and pristine_envs is not None:
        pristine_knobs = read_pristine_knobs(pristine_envs)
    findings = list(_series(ctx))
    patches: list[tuple[SeriesEntry, PatchFile]] = []
    for entry in loaded.series_entries():
        if not entry.path.is_file():
            continue  # the series rule has said so
        try:
            pf = PatchFile.parse(entry.path, strict=False)
        except PatchFileError as exc:
            findings.append(ctx.finding(
                entry.path, 1, "diff-hygiene", f"{exc.message.rstrip('.')}.",
                "write patch files as UTF-8; regenerate it with qwen38build export",
            ))
            continue
        patches.append((entry, pf))
    registered = {pf.topic: registered_knobs(pf) for _, pf in patches}
    wheel = pristine_envs if pristine_envs is not None and pristine_envs.suffix == ".whl" \
        else None
    with tempfile.TemporaryDirectory(prefix="q38-lint.") as tmp:
        # The touched files patched through the series: what the knob rule parses, and the
        # file each index line must name.
        tree = None if wheel is None else lineage.from_wheel(
            Path(tmp), wheel, [pf for _, pf in patches]
        )
        reads = knobs.series_reads([pf for _, pf in patches], tree)
        for k, (entry, pf) in enumerate(patches):
            own_reads = [r for r in reads if r.patch == k]
            # A patch that does not apply is the build's to report (GNU patch names the
            # hunk); its index line would only repeat that less precisely.
            before = None if tree is None or k in tree.failed else tree.before.get(k)
            after = None if tree is None else tree.after.get(k)
            per_patch = [
                *_headers(ctx, entry, pf),
                *env_knobs(ctx, pf, own_reads, registered, knob_registry, pristine_knobs),
                *hygiene(ctx, pf, before),
                *enum_aliases(ctx, pf, before, after),
            ]
            findings.extend(sorted(per_patch, key=lambda f: f.line))
    findings.extend(provenance(ctx))
    return waivers.apply(ctx, findings)


def load_for_lint(path: Path) -> LoadedRecipe:
    """Load a recipe whose schema is valid even where its series is not.

    ``recipe.load`` refuses a series that disagrees with the folders; the lint reports those
    as ``series`` findings with their lines instead, so it needs the recipe anyway. Schema
    errors are still raised as RecipeError.
    """
    try:
        return recipe_mod.load(path)
    except RecipeError as exc:
        try:
            data = tomllib.loads(path.read_bytes().decode("utf-8"))
            model = recipe_mod.Recipe.model_validate(data)
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, ValidationError):
            raise exc from None
        loaded = LoadedRecipe(model, Path(os.path.realpath(path)))
        # A path out of the project, a folder or a dangling link as a patch: the lint must
        # not read those either, so they stay errors; only listing problems become findings.
        hard = layout.hard_problems(loaded, missing_ok=True)
        if hard:
            raise RecipeError(str(path), hard) from None
        return loaded


# -- series ------------------------------------------------------------------------------


def _series(ctx: Context) -> Iterator[Finding]:
    """The series rule (``recipe.series_problems``), each problem at its line."""
    recipe_path = ctx.loaded.path

    def dir_line(folder: str) -> int:
        return next((no for no, text in enumerate(ctx.recipe_lines, start=1)
                     if text.strip().startswith("dir") and f'"{folder}"' in text), 1)

    for p in layout.series_problems(ctx.loaded):
        at = dir_line(p.dir)
        line = ctx.recipe_line(f'"{p.name}"', at) if p.name else at
        file, name = ctx.root / p.dir / p.name, f"{p.dir}/{p.name}"
        if p.what == "group-twice":
            yield ctx.finding(recipe_path, at, "series",
                              f"group {p.dir}/ is listed twice in series.groups.",
                              "merge the two groups into one [[series.groups]] table")
        elif p.what == "no-folder":
            yield ctx.finding(recipe_path, at, "series",
                              f"group folder {p.dir}/ does not exist.",
                              f"create {p.dir}/ or remove the group from series.groups")
        elif p.what == "topic-twice":
            yield ctx.finding(
                recipe_path, line, "series",
                f"{name} is listed twice in the series (also in {p.also_dir}/).",
                "keep one entry, at the place in the apply order where it belongs")
        elif p.what == "retired-listed":
            yield ctx.finding(
                recipe_path, line, "series",
                f"{name} is a retired topic (series.retired) but is listed in the series.",
                "remove the entry and the file, or take the topic out of series.retired "
                "if it really comes back")
        elif p.what == "no-file":
            yield ctx.finding(recipe_path, line, "series",
                              f"series entry {name} has no file.",
                              f"export the topic to {name}, or remove the entry")
        elif p.what == "retired-file":
            yield ctx.finding(
                file, 1, "series",
                f"{name} is a retired topic (series.retired) and must not be in the tree.",
                "delete the file; git history keeps it, and the ledger says why it retired")
        else:
            yield ctx.finding(
                file, 1, "series", f"{name} is in the folder but not in the recipe's series.",
                f"add {p.name!r} to the patches of the {p.dir!r} group in recipe.toml, "
                "in apply order, or delete the file")


# -- headers -----------------------------------------------------------------------------


def _headers(ctx: Context, entry: SeriesEntry, pf: PatchFile) -> Iterator[Finding]:
    path = entry.path
    block_line = pf.header_line or pf.marker_line or 1
    for problem in pf.problems:
        if problem.rule == "headers":
            yield ctx.finding(path, problem.line, "headers", problem.message, problem.hint)
    for key in REQUIRED_HEADERS:
        if key not in pf.headers:
            yield ctx.finding(
                path, block_line, "headers",
                f"header {key!r} is missing; the ledger row of {pf.topic} is written from it.",
                f"add '{key}: ...' to the commit message of {pf.topic} (above the marker "
                "line) and re-export the file",
            )
        elif not pf.headers[key].strip():
            yield ctx.finding(
                path, pf.header_lines.get(key, block_line), "headers",
                f"header {key!r} is empty.",
                f"give {key} a value (write 'none' where there is nothing to say) and re-export",
            )
    kind = pf.headers.get("Kind", "").strip()
    if kind and kind not in KINDS:
        yield ctx.finding(
            path, pf.header_lines.get("Kind", block_line), "headers",
            f"Kind {kind!r} is not one of {', '.join(KINDS)}.",
            "pick the kind the ledger's intro defines for this change",
        )
    pin = ctx.recipe.vllm.version
    cut = pf.headers.get("Cut-against", "").strip()
    if cut and not re.match(rf"{re.escape(pin)}(?![0-9A-Za-z.])", cut):
        yield ctx.finding(
            path, pf.header_lines.get("Cut-against", block_line), "headers",
            f"Cut-against {cut.split(chr(10))[0]!r} does not start with the recipe's vLLM pin "
            f"{pin}.",
            f"re-cut the topic on v{pin} and start the header with '{pin}' (add ': <what "
            "moved>' if the hunks had to follow upstream)",
        )
    yield from _marker(ctx, path, pf)


def _marker(ctx: Context, path: Path, pf: PatchFile) -> Iterator[Finding]:
    if pf.marker is None:
        after_headers = 1
        if pf.header_lines:
            last = max(pf.header_lines, key=pf.header_lines.__getitem__)
            after_headers = pf.header_lines[last] + pf.headers[last].count("\n") + 1
        yield ctx.finding(
            path, after_headers, "headers",
            "the '--- exported from <commit> (<topic>)' marker line is missing, so nothing "
            "ties this file to the commit it came from.",
            "regenerate the file with qwen38build export, which writes the marker",
        )
        return
    if pf.marker_commit is None or pf.marker_topic is None:
        yield ctx.finding(
            path, pf.marker_line, "headers",
            "the marker line does not read '--- exported from <commit> (<topic>); ...'.",
            "regenerate the file with qwen38build export, which writes the marker",
        )
        return
    if not HEX_RE.fullmatch(pf.marker_commit):
        yield ctx.finding(
            path, pf.marker_line, "headers",
            f"the marker names {pf.marker_commit!r}, which is not a commit (7 to 40 hex "
            "digits).",
            "regenerate the file with qwen38build export from the topic's commit",
        )
    if pf.marker_topic != pf.topic:
        yield ctx.finding(
            path, pf.marker_line, "headers",
            f"the marker names topic {pf.marker_topic!r} but the file is {pf.topic}.patch.",
            f"rename the file to {pf.marker_topic}.patch (and its series entry), or "
            f"re-export the topic {pf.topic}",
        )


