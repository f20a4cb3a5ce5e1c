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
- ``provenance``: ``fa2/README.md`` names the repository and the commit the recipe pins;
  ``pthfa/PIN`` names the recipe's tag; ``pthfa/MANIFEST`` lists the sha256 of every file.
"""

from __future__ import annotations

import ast
import fnmatch
import hashlib
import os
import re
import tempfile
import tomllib
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from qwen38build.errors import PatchFileError, RecipeError
from qwen38build.inputs import recipe as recipe_mod
from qwen38build.inputs.recipe import LoadedRecipe, SeriesEntry
from qwen38build.series import diffheaders, knobs, lineage
from qwen38build.series.patchfile import KINDS, REQUIRED_HEADERS, FileDiff, Hunk, PatchFile
from qwen38build.wheels import wheelzip

RULES = ("headers", "series", "env-knobs", "diff-hygiene", "provenance")
# The patch that registers this stack's local knobs in envs.py (the ledger's registry).
KNOB_REGISTRY = "speed-knobs-envs"
ENVS_PY = "envs.py"
_HEX_RE = re.compile(r"[0-9a-fA-F]{7,40}")
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_REGISTER_RE = re.compile(rf"""^\s*(["'])(?P<name>{_NAME})\1\s*:""")
_MANIFEST_RE = re.compile(r"^(?P<sha>[0-9a-f]{64})  (?P<path>\S.*)$")
_PIN_FILES = ("PIN", "MANIFEST")
# Byte code, and measured evidence (results/): neither is vendored source.
_ALWAYS_IGNORED = ("__pycache__/", "*.pyc", "/results/")
_EXPORT_HINT = "fix the commit in the pinned vLLM checkout and regenerate the file with " \
    "qwen38build export; the patch files are not edited by hand"


@dataclass(frozen=True)
class Finding:
    """One broken rule: where (``file`` relative to the recipe root, 1-based ``line``), which
    rule, what is wrong (a sentence) and what to do (``hint``)."""

    file: Path
    line: int
    rule: str
    message: str
    hint: str

    def __str__(self) -> str:
        return f"{self.file.as_posix()}:{self.line}: [{self.rule}] {self.message}"


def check(
    loaded: LoadedRecipe,
    *,
    pristine_knobs: frozenset[str] | None = None,
    pristine_envs: Path | None = None,
    knob_registry: str = KNOB_REGISTRY,
) -> list[Finding]:
    """Run every rule; the findings come series first, then patch by patch, then provenance.

    ``pristine_knobs`` are the knobs pristine vLLM registers (the build passes them, read
    from the pinned wheel); else they are read from ``pristine_envs`` (a wheel or an
    ``envs.py``) when given. With neither, only knobs the series registers count as
    registered, and each env-knob finding says that pristine envs.py was not read.
    """
    if pristine_knobs is None and pristine_envs is not None:
        pristine_knobs = read_pristine_knobs(pristine_envs)
    ctx = _Context(loaded)
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
            per_patch = [
                *_headers(ctx, entry, pf),
                *_env_knobs(ctx, pf, own_reads, registered, knob_registry, pristine_knobs),
                *_hygiene(ctx, pf, before),
            ]
            findings.extend(sorted(per_patch, key=lambda f: f.line))
    findings.extend(_provenance(ctx))
    return findings


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
        hard = recipe_mod.hard_problems(loaded, missing_ok=True)
        if hard:
            raise RecipeError(str(path), hard) from None
        return loaded


class _Context:
    """The recipe, its root and the text of recipe.toml (for line numbers)."""

    def __init__(self, loaded: LoadedRecipe) -> None:
        self.loaded = loaded
        self.recipe = loaded.recipe
        self.root = loaded.root
        try:
            self.recipe_lines = loaded.path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            self.recipe_lines = []

    def rel(self, path: Path) -> Path:
        try:
            return path.resolve().relative_to(self.root)
        except ValueError:
            return path

    def finding(self, path: Path, line: int, rule: str, message: str, hint: str) -> Finding:
        return Finding(self.rel(path), max(line, 1), rule, message, hint)

    def recipe_line(self, needle: str, after: int = 0) -> int:
        """The 1-based line of recipe.toml holding ``needle`` at or after line ``after``."""
        for i in range(max(after - 1, 0), len(self.recipe_lines)):
            if needle in self.recipe_lines[i]:
                return i + 1
        return 1


# -- series ------------------------------------------------------------------------------


def _series(ctx: _Context) -> Iterator[Finding]:
    series = ctx.recipe.series
    retired = set(series.retired)
    recipe_path = ctx.loaded.path
    seen: dict[str, str] = {}
    dirs_seen: set[str] = set()
    for group in series.groups:
        dir_line = next(
            (
                no for no, text in enumerate(ctx.recipe_lines, start=1)
                if text.strip().startswith("dir") and f'"{group.dir}"' in text
            ),
            1,
        )
        if group.dir in dirs_seen:
            yield ctx.finding(
                recipe_path, dir_line, "series",
                f"group {group.dir}/ is listed twice in series.groups.",
                "merge the two groups into one [[series.groups]] table",
            )
            continue
        dirs_seen.add(group.dir)
        folder = ctx.root / group.dir
        if not folder.is_dir():
            yield ctx.finding(
                recipe_path, dir_line, "series",
                f"group folder {group.dir}/ does not exist.",
                f"create {group.dir}/ or remove the group from series.groups",
            )
            continue
        on_disk = {p.name for p in folder.glob("*.patch")}
        for name in group.patches:
            line = ctx.recipe_line(f'"{name}"', dir_line)
            topic = name.removesuffix(".patch")
            if topic in seen:
                yield ctx.finding(
                    recipe_path, line, "series",
                    f"{group.dir}/{name} is listed twice in the series (also in "
                    f"{seen[topic]}/).",
                    "keep one entry, at the place in the apply order where it belongs",
                )
            seen.setdefault(topic, group.dir)
            if topic in retired:
                yield ctx.finding(
                    recipe_path, line, "series",
                    f"{group.dir}/{name} is a retired topic (series.retired) but is listed "
                    "in the series.",
                    "remove the entry and the file, or take the topic out of series.retired "
                    "if it really comes back",
                )
            if name not in on_disk:
                yield ctx.finding(
                    recipe_path, line, "series",
                    f"series entry {group.dir}/{name} has no file.",
                    f"export the topic to {group.dir}/{name}, or remove the entry",
                )
        for name in sorted(on_disk - set(group.patches)):
            topic = name.removesuffix(".patch")
            if topic in retired:
                yield ctx.finding(
                    folder / name, 1, "series",
                    f"{group.dir}/{name} is a retired topic (series.retired) and must not be "
                    "in the tree.",
                    "delete the file; git history keeps it, and the ledger says why it retired",
                )
            else:
                yield ctx.finding(
                    folder / name, 1, "series",
                    f"{group.dir}/{name} is in the folder but not in the recipe's series.",
                    f"add {name!r} to the patches of the {group.dir!r} group in recipe.toml, "
                    "in apply order, or delete the file",
                )


# -- headers -----------------------------------------------------------------------------


def _headers(ctx: _Context, entry: SeriesEntry, pf: PatchFile) -> Iterator[Finding]:
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


def _marker(ctx: _Context, path: Path, pf: PatchFile) -> Iterator[Finding]:
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
    if not _HEX_RE.fullmatch(pf.marker_commit):
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


# -- env knobs ---------------------------------------------------------------------------


def registered_knobs(pf: PatchFile) -> set[str]:
    """Knobs the patch registers: keys its added lines put in ``envs.py``."""
    names: set[str] = set()
    for fd in pf.files:
        if fd.new_path != ENVS_PY:
            continue
        for hunk in fd.hunks:
            for _, text in hunk.added():
                m = _REGISTER_RE.match(text)
                if m:
                    names.add(m.group("name"))
    return names


def read_pristine_knobs(source: Path) -> frozenset[str]:
    """The knobs vLLM's own ``envs.py`` registers; ``source`` is the wheel or the envs.py."""
    try:
        if source.suffix == ".whl":
            text = wheelzip.read(source, f"vllm/{ENVS_PY}").decode("utf-8")
        else:
            text = source.read_text(encoding="utf-8")
    except (OSError, KeyError, zipfile.BadZipFile, UnicodeDecodeError) as exc:
        raise PatchFileError(
            f"{source}: cannot read vLLM's envs.py: {exc}.",
            hint="pass the pinned vLLM wheel or its vllm/envs.py",
        ) from exc
    return frozenset(_envs_keys(text))


def _envs_keys(text: str) -> set[str]:
    """The string keys of the ``environment_variables`` dict (what ``vllm.envs`` serves)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return {m.group("name") for ln in text.splitlines() if (m := _REGISTER_RE.match(ln))}
    keys: set[str] = set()
    for node in ast.walk(tree):
        target: ast.expr | None = None
        if isinstance(node, ast.AnnAssign):
            target = node.target
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if (
            isinstance(target, ast.Name)
            and target.id == "environment_variables"
            and isinstance(node, ast.Assign | ast.AnnAssign)
            and isinstance(node.value, ast.Dict)
        ):
            keys.update(
                k.value for k in node.value.keys
                if isinstance(k, ast.Constant) and isinstance(k.value, str)
            )
    return keys


def _env_knobs(
    ctx: _Context,
    pf: PatchFile,
    reads: list[knobs.KnobRead],
    registered: dict[str, set[str]],
    registry: str,
    pristine: frozenset[str] | None,
) -> Iterator[Finding]:
    own = registered.get(pf.topic, set())
    from_registry = registered.get(registry, set())
    known = own | from_registry | (pristine or frozenset()) | set(ctx.recipe.lint.env_allow)
    for r in reads:
        if r.name in known:
            continue
        others = sorted(t for t, names in registered.items() if r.name in names)
        elsewhere = (
            f" {', '.join(others)} registers it, but a patch may rely only on its "
            f"own hunks or on {registry}."
            if others else ""
        )
        unread = (
            " Pristine envs.py was not read (no wheel given), so a knob vLLM "
            "itself registers is reported too."
            if pristine is None else ""
        )
        yield ctx.finding(
            pf.path, r.patch_line, "env-knobs",
            f"{pf.topic} reads env knob {r.name} ({r.form}) in {r.file}, but no "
            f"envs.py hunk of {pf.topic} or {registry} registers it.{elsewhere}{unread}",
            f"register {r.name} in envs.py's environment_variables in a hunk of "
            f"{pf.topic} (or in {registry} for a local knob) and read it through "
            "vllm.envs, so it is in the torch.compile cache key; if it is another "
            "program's variable, list it in recipe.toml's [lint] env_allow",
        )


# -- diff hygiene ------------------------------------------------------------------------


def _hygiene(
    ctx: _Context, pf: PatchFile, before: dict[str, bytes | None] | None
) -> Iterator[Finding]:
    """``before``: the touched files as the earlier patches left them, where known."""
    for problem in pf.problems:
        if problem.rule == "diff-hygiene":
            yield ctx.finding(pf.path, problem.line, "diff-hygiene", problem.message,
                              problem.hint)
    try:
        text_lines = pf.path.read_bytes().decode("utf-8").split("\n")
    except (OSError, UnicodeDecodeError):
        text_lines = []
    for fd, h in diffheaders.headers(pf, text_lines):
        if why := diffheaders.name_mismatch(h):
            yield ctx.finding(pf.path, h.git_line, "diff-hygiene", f"{why}.", _EXPORT_HINT)
        pre = fd.old_path or fd.path
        if before is not None and pre in before and (
            why := diffheaders.index_mismatch(h, before[pre] if fd.old_path else None)
        ):
            yield ctx.finding(
                pf.path, h.index_line, "diff-hygiene", f"{fd.path}: {why}.",
                "re-cut the topic on the pinned tree with the series before it "
                "(qwen38build workspace) and re-export",
            )
    for fd in pf.files:  # binary diffs and modes are parse problems, reported above
        for hunk in fd.hunks:
            yield from _hunk_whitespace(ctx, pf, fd, hunk)


def _hunk_whitespace(
    ctx: _Context, pf: PatchFile, fd: FileDiff, hunk: Hunk
) -> Iterator[Finding]:
    kept = [ln[1:] for ln in hunk.lines if ln[:1] in (" ", "-")]
    target_crlf = bool(kept) and all(ln.endswith("\r") for ln in kept)
    ws_hint = "fix the whitespace in the topic's commit (git diff --check shows it) and " \
        "re-export"
    for line, raw in hunk.added():
        text = raw.removesuffix("\r")
        if raw.endswith("\r") and not target_crlf:
            yield ctx.finding(
                pf.path, line, "diff-hygiene",
                f"added line in {fd.path} ends with CRLF, but the file has LF line "
                "endings.",
                "convert the line endings of the change to LF in the topic's commit "
                "and re-export",
            )
        if text != text.rstrip(" \t"):
            yield ctx.finding(
                pf.path, line, "diff-hygiene",
                f"added line in {fd.path} has trailing whitespace.", ws_hint,
            )
        indent = text[: len(text) - len(text.lstrip(" \t"))]
        if " \t" in indent:
            yield ctx.finding(
                pf.path, line, "diff-hygiene",
                f"added line in {fd.path} has a space before a tab in its indent.", ws_hint,
            )
    # git apply's blank-at-eof: a hunk with no trailing context ends at the end of the file,
    # so blank lines it adds last are added at the end of the file.
    body = [(k, ln) for k, ln in enumerate(hunk.lines) if not ln.startswith("\\")]
    first_blank: int | None = None
    for k, ln in reversed(body):
        if not (ln.startswith("+") and not ln[1:].strip()):
            break
        first_blank = k
    if first_blank is not None:
        yield ctx.finding(
            pf.path, hunk.patch_line + 1 + first_blank, "diff-hygiene",
            f"the hunk adds blank lines at the end of {fd.path}.", ws_hint,
        )


# -- provenance --------------------------------------------------------------------------


def _provenance(ctx: _Context) -> Iterator[Finding]:
    yield from _fa2(ctx)
    yield from _pthfa(ctx)


def _fa2(ctx: _Context) -> Iterator[Finding]:
    fa2 = ctx.recipe.fa2
    diff = ctx.root / fa2.diff
    readme = diff.parent / "README.md"
    from qwen38build.engine.reads import probe

    probe(diff)  # its presence decides the rule: the no-op's key must cover it
    if fa2.commit is None:
        if diff.exists():
            yield ctx.finding(
                ctx.loaded.path, ctx.recipe_line("[fa2]"), "provenance",
                f"{fa2.diff} exists but recipe.toml pins no fa2.commit, so nothing says "
                "which flash-attention tree it was cut against.",
                "set fa2.commit to the flash-attention commit vLLM pins, and name it in "
                f"{ctx.rel(readme).as_posix()}",
            )
        return  # declared, not written yet: nothing to check
    if not diff.is_file():
        yield ctx.finding(
            ctx.loaded.path, ctx.recipe_line("diff", ctx.recipe_line("[fa2]")), "provenance",
            f"recipe.toml pins fa2.commit {fa2.commit} but {fa2.diff} does not exist.",
            f"write the diff to {fa2.diff}, or unset fa2.commit until it exists",
        )
    try:
        text = readme.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        yield ctx.finding(
            readme, 1, "provenance",
            f"{ctx.rel(readme).as_posix()} is missing; it must name the repository and the "
            "commit the fa2 diff is cut against.",
            f"write it, naming {fa2.repository} and commit {fa2.commit}",
        )
        return
    repo = fa2.repository.removesuffix("/").removesuffix(".git")
    short = "/".join(repo.split("/")[-2:])
    if repo not in text and short not in text:
        yield ctx.finding(
            readme, 1, "provenance",
            f"{ctx.rel(readme).as_posix()} does not name the repository {fa2.repository} "
            "that recipe.toml pins.",
            f"name {fa2.repository} in the README, or fix fa2.repository in recipe.toml",
        )
    commit = fa2.commit.lower()
    named = [t.lower() for t in _HEX_RE.findall(text)]
    if not any(t.startswith(commit) or commit.startswith(t) for t in named):
        yield ctx.finding(
            readme, 1, "provenance",
            f"{ctx.rel(readme).as_posix()} does not name commit {fa2.commit}, the one "
            "recipe.toml pins for fa2.",
            "name the commit the diff is cut against in the README, and make recipe.toml "
            "pin the same",
        )


def _pthfa(ctx: _Context) -> Iterator[Finding]:
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
            for t in _HEX_RE.findall("\n".join(pin_lines))
        ):
            yield ctx.finding(
                pin_path, 1, "provenance",
                f"{where}/PIN does not name commit {pthfa.commit}, which recipe.toml pins.",
                "write the commit the tag points at in PIN, or fix pthfa.commit",
            )
    yield from _manifest(ctx, folder, manifest_path)


def _manifest(ctx: _Context, folder: Path, manifest_path: Path) -> Iterator[Finding]:
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
    """Files under ``folder`` a manifest covers: all but PIN, MANIFEST and ignored build output.

    The folder's own ``.gitignore`` (simple patterns: ``*.cubin``, ``/build/``) is honoured,
    so kernels compiled in place do not count as vendored files.
    """
    patterns = [*_ALWAYS_IGNORED, *_gitignore(folder / ".gitignore")]
    out: list[str] = []
    for path in sorted(folder.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(folder).as_posix()
        if rel in _PIN_FILES or _ignored(rel, patterns):
            continue
        out.append(rel)
    return out


def _gitignore(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]


def _ignored(rel: str, patterns: Iterable[str]) -> bool:
    parts = rel.split("/")
    for pattern in patterns:
        directory = pattern.endswith("/")
        pat = pattern.strip("/")
        anchored = pattern.startswith("/") or "/" in pat
        candidates = parts[:-1] if directory else parts
        if anchored:
            prefixes = ["/".join(parts[: k + 1]) for k in range(len(candidates))]
            if any(fnmatch.fnmatchcase(p, pat) for p in prefixes):
                return True
        elif any(fnmatch.fnmatchcase(c, pat) for c in candidates):
            return True
    return False
