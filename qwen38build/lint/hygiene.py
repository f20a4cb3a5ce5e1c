"""The diff-hygiene rule: git headers that agree with the diff, index lines, whitespace."""

from __future__ import annotations

from collections.abc import Iterator

from qwen38build.lint.finding import EXPORT_HINT, Context, Finding
from qwen38build.series import diffheaders
from qwen38build.series.diff import FileDiff, Hunk
from qwen38build.series.patchfile import PatchFile

# -- diff hygiene ------------------------------------------------------------------------


def hygiene(
    ctx: Context, pf: PatchFile, before: dict[str, bytes | None] | None
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
            yield ctx.finding(pf.path, h.git_line, "diff-hygiene", f"{why}.", EXPORT_HINT)
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
    ctx: Context, pf: PatchFile, fd: FileDiff, hunk: Hunk
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
