"""The ledger table: one row per patch of the series, written from the patch headers.

The patch files are the source; the table in ``PATCHES.md`` is generated from their headers
and lives between the ``<!-- table:begin ... -->`` and ``<!-- table:end -->`` lines. Only the
lines between those two are ever rewritten, so the prose around the table stays the
author's, byte for byte. A stale table is a failed check, shown as a unified diff.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path

from qwen38build.errors import InputError
from qwen38build.inputs.recipe import LoadedRecipe
from qwen38build.series.headers import header_text
from qwen38build.series.patchfile import PatchFile

LEDGER_FILE = "PATCHES.md"
BEGIN_PREFIX = "<!-- table:begin"
END_LINE = "<!-- table:end -->"
COLUMNS = ("patch", "kind", "what", "upstream", "cut against", "retires when")
# The header each column after the first is read from.
COLUMN_HEADERS = ("Kind", "What", "Upstream", "Cut-against", "Retires-when")


def escape_cell(value: str) -> str:
    """A header value as a table cell: one line, ``|`` escaped so it does not split the row."""
    return header_text(value).replace("|", "\\|")


def render_row(row_name: str, headers: dict[str, str]) -> str:
    """One table row; a missing header gives an empty cell (the lint reports it)."""
    cells = [row_name, *(escape_cell(headers.get(h, "")) for h in COLUMN_HEADERS)]
    return "| " + " | ".join(cells) + " |"


def render_rows(rows: Iterable[tuple[str, dict[str, str]]]) -> str:
    """The whole table (column line, rule line, rows) for ``(row name, headers)`` pairs."""
    out = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    out.extend(render_row(name, headers) for name, headers in rows)
    return "\n".join(out) + "\n"


def render(loaded: LoadedRecipe) -> str:
    """The table of the recipe's series, in apply order (recipe order, group by group).

    Patch files are parsed leniently: a structural problem in a diff is the lint's to
    report, and does not stop the table from being written.
    """
    rows = [
        (entry.row_name, PatchFile.parse(entry.path, strict=False).headers)
        for entry in loaded.series_entries()
    ]
    return render_rows(rows)


def splice(md_text: str, table: str, *, path: Path) -> str:
    """``md_text`` with the lines between the table markers replaced by ``table``."""
    lines = md_text.splitlines(keepends=True)
    begin = next((i for i, ln in enumerate(lines) if ln.startswith(BEGIN_PREFIX)), None)
    if begin is None:
        raise InputError(
            f"{path}: no '{BEGIN_PREFIX} ... -->' line; the table has nowhere to go.",
            hint=f"add a '{BEGIN_PREFIX}. generated from the patch headers -->' line and a "
            f"'{END_LINE}' line where the table belongs",
        )
    end = next(
        (i for i in range(begin + 1, len(lines)) if lines[i].rstrip("\r\n") == END_LINE), None
    )
    if end is None:
        raise InputError(
            f"{path}:{begin + 1}: the table begins here but no '{END_LINE}' line follows.",
            hint=f"add a '{END_LINE}' line after the table",
        )
    if not lines[begin].endswith("\n"):
        lines[begin] += "\n"
    return "".join([*lines[: begin + 1], table, *lines[end:]])


def _read(md_path: Path) -> str:
    try:
        return md_path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{md_path}: cannot read the ledger: {exc}.") from exc


def write(loaded: LoadedRecipe, md_path: Path) -> bool:
    """Write the current table into ``md_path``; True when the file changed.

    The file is replaced atomically (temp file, rename), so a reader never sees half a table.
    """
    old = _read(md_path)
    new = splice(old, render(loaded), path=md_path)
    if new == old:
        return False
    from qwen38build.files import atomic_write

    atomic_write(md_path, new.encode("utf-8"))
    return True


def check(loaded: LoadedRecipe, md_path: Path) -> str | None:
    """None when the table in ``md_path`` is current; else the unified diff that would fix it."""
    old = _read(md_path)
    new = splice(old, render(loaded), path=md_path)
    if new == old:
        return None
    try:
        name = md_path.resolve().relative_to(loaded.root).as_posix()
    except ValueError:
        name = str(md_path)
    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True),
            new.splitlines(keepends=True),
            fromfile=f"{name} (in the tree)",
            tofile=f"{name} (from the patch headers)",
        )
    )
