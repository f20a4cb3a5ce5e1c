"""Retire topics that the new pin carries: out of the series, into the ledger's prose.

A retired topic leaves three traces, all written here: its name moves from its group's
``patches`` to ``series.retired`` in recipe.toml (layout and comments kept, via tomlkit),
its patch file is deleted (git history keeps it; the lint refuses a retired topic's file),
and a paragraph at the end of ``PATCHES.md`` says when and why, keeping the file's prose
and its ``What`` header, as the ledger's retired section does by hand. The table is then
regenerated from the remaining headers.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from qwen38build.errors import InputError
from qwen38build.files import atomic_write
from qwen38build.inputs.recipe import LoadedRecipe, Recipe, load
from qwen38build.series import table
from qwen38build.series.headers import header_text
from qwen38build.series.patchfile import PatchFile


def retire(loaded: LoadedRecipe, reasons: dict[str, str], version: str) -> list[Path]:
    """Retire each series row in ``reasons`` (row name → why) at ``version``; the files
    written or deleted, in order."""
    import tomlkit

    entries = {e.row_name: e for e in loaded.series_entries()}
    unknown = sorted(set(reasons) - set(entries))
    if unknown:
        raise InputError(f"{loaded.path}: no series entry {', '.join(unknown)} to retire.")
    doc = tomlkit.parse(loaded.path.read_text(encoding="utf-8"))
    series = doc["series"]
    retired = series.setdefault("retired", tomlkit.array())
    paragraphs = []
    for row, why in reasons.items():
        entry = entries[row]
        for group in series["groups"]:
            if group["dir"] == entry.group and entry.file in group["patches"]:
                group["patches"].remove(entry.file)
        retired.append(entry.topic)
        pf = PatchFile.parse(entry.path, strict=False)
        what = header_text(pf.headers.get("What", "")).rstrip(".")
        prose = " ".join(pf.prose.split())
        paragraphs.append(
            f"Retired at {version} and removed from the tree: `{row}` ({why}). "
            + (f"It did: {what}. " if what else "") + prose
        )
    new_text = tomlkit.dumps(doc)
    try:  # the schema only: the files follow below
        Recipe.model_validate(tomlkit.parse(new_text).unwrap())
    except ValidationError as exc:
        raise InputError(f"{loaded.path}: retiring {', '.join(reasons)} would make the "
                         f"recipe invalid: {exc.errors()[0]['msg']}.") from None
    md = loaded.root / table.LEDGER_FILE
    written: list[Path] = []
    if md.exists():
        text = md.read_text(encoding="utf-8")
        atomic_write(md, (text.rstrip("\n") + "\n\n"
                          + "\n\n".join(p.rstrip() for p in paragraphs) + "\n").encode("utf-8"))
        written.append(md)
    for row in reasons:
        entries[row].path.unlink()
        written.append(entries[row].path)
    atomic_write(loaded.path, new_text.encode("utf-8"))
    written.append(loaded.path)
    if md.exists():
        table.write(load(loaded.path), md)
    return written
