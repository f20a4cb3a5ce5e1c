"""The series' trial on a new pin, kept in the store by everything it is made from.

Trying the series (:func:`qwen38build.bump.trial.try_series`) runs GNU patch once or twice
per patch and explains every failing hunk (the old tree through the series, the upstream
diff, the evidence of a change made upstream in other words): most of a dry run's time.
Its answer is a pure function of:

- the bytes of every series patch, in order, with the row name and the file name the
  report gives it;
- the two pristine wheels, by the sha256 the lock and the store hold for them, and the
  two version strings the report quotes;
- the programs that decide: GNU patch's and GNU diff's ``--version``, the Python that runs
  difflib (its full version);
- the tool's own code: the implementation digest over every module of the package (as
  ``qwen38build --version`` prints it), so any edit of the tool makes it again.

:func:`key` hashes them all; :func:`trial` returns the kept answer when the store has one
under that key, else tries the series and keeps the answer (the newest :data:`KEEP`
answers are kept). A kept file that does not parse, or whose recorded inputs are not the
key's, is made again. Whatever the trial comes to read besides these must be added to
:func:`inputs` with it: the implementation digest covers the code, not its new inputs.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypedDict, get_args

from qwen38build.bump.report import HunkFailure, HunkOffset, Outcome, PatchReport
from qwen38build.inputs.recipe import LoadedRecipe
from qwen38build.store.store import Store

#: The store's folder of kept trials, each ``<key>.json``.
FOLDER = "bumptrials"
_FORMAT = 1


class TrialInputs(TypedDict):
    """What a trial is made from, as kept beside it (:func:`inputs`)."""

    format: int
    patches: list[list[str]]  # [row name, file, sha256 of its bytes] in series order
    wheels: list[str]  # the old and the new pristine wheel's sha256
    versions: list[str]  # the old and the new version
    gnu_patch: str  # `patch --version`
    gnu_diff: str  # `diff --version`
    python: str  # sys.version
    implementation: str  # the package's implementation digest


def inputs(loaded: LoadedRecipe, shas: tuple[str, str], versions: tuple[str, str]
           ) -> TrialInputs:
    """Everything a trial of the series is made from (see the module's text)."""
    import hashlib

    from qwen38build.cli.version import package_digest
    from qwen38build.proc import run
    from qwen38build.series.gnupatch import patch_program

    patches = []
    for e in loaded.series_entries():
        try:
            file = str(e.path.relative_to(loaded.root))
        except ValueError:
            file = str(e.path)
        patches.append([e.row_name, file, hashlib.sha256(e.path.read_bytes()).hexdigest()])

    def said(args: list[str], what: str) -> str:
        return run(args, what=what).stdout.strip()

    return {
        "format": _FORMAT, "patches": patches, "wheels": list(shas), "versions": list(versions),
        "gnu_patch": said([patch_program(), "--version"], "GNU patch"),
        "gnu_diff": said(["diff", "--version"], "GNU diff"),
        "python": sys.version, "implementation": package_digest(),
    }


def key(made_from: TrialInputs) -> str:
    from qwen38build.digest import sha256_json

    return sha256_json(made_from)


def trial(loaded: LoadedRecipe, store: Store, shas: tuple[str, str], versions: tuple[str, str],
          compute: Callable[[], list[PatchReport]]) -> tuple[list[PatchReport], bool]:
    """The trial of the series (``compute`` makes it) and whether it was kept already."""
    made_from = inputs(loaded, shas, versions)
    path = store.root / FOLDER / f"{key(made_from)}.json"
    found = _read(path, made_from)
    if found is not None:
        return found, True
    reports = compute()
    with contextlib.suppress(OSError):  # a store we may not write: made again next time
        store.write_json(path, {"inputs": made_from, "patches": [to_json(r) for r in reports]})
        _prune(path.parent, keep=KEEP)
    return reports, False


#: How many trials are kept (the newest): each edit of a patch makes another, and gc does
#: not look in this folder.
KEEP = 16


def _prune(folder: Path, keep: int) -> None:
    """Remove all but the ``keep`` newest kept trials of ``folder``."""
    found = []
    for p in folder.glob("*.json"):
        with contextlib.suppress(OSError):
            found.append((p.stat().st_mtime_ns, p.name, p))
    for _, _, p in sorted(found, reverse=True)[keep:]:
        with contextlib.suppress(OSError):
            p.unlink()


def _read(path: Path, made_from: TrialInputs) -> list[PatchReport] | None:
    try:
        data = json.loads(path.read_bytes())
        if data["inputs"] != made_from:
            return None
        return [from_json(r) for r in data["patches"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def to_json(r: PatchReport) -> dict[str, object]:
    import dataclasses

    return dataclasses.asdict(r)


def from_json(d: object) -> PatchReport:
    """A :class:`PatchReport` from :func:`to_json`'s dict (TypeError or KeyError where it
    is not one: a field missing, added or of another type)."""
    if not isinstance(d, dict):
        raise TypeError("a patch report is an object")
    moved = d["moved_to"]
    if not isinstance(moved, dict):
        raise TypeError("moved_to is an object")
    report = PatchReport(
        patch=_str(d["patch"]), file=_str(d["file"]), outcome=d["outcome"],
        offsets=tuple(HunkOffset(file=_str(o["file"]), hunk=_int(o["hunk"]),
                                 line=_int(o["line"]), offset=_int(o["offset"]))
                      for o in _objects(d["offsets"])),
        failures=tuple(_failure(f) for f in _objects(d["failures"])),
        deleted=tuple(_strs(d["deleted"])),
        moved_to={_str(k): _strs(v) for k, v in moved.items()},
        depends_on=tuple(_strs(d["depends_on"])),
    )
    if report.outcome not in _OUTCOMES or json.loads(json.dumps(to_json(report))) != d:
        raise TypeError("not a patch report as kept")
    return report


_OUTCOMES = frozenset(get_args(Outcome))


def _failure(f: dict[str, object]) -> HunkFailure:
    similarity = f["similarity"]
    if similarity is not None and not isinstance(similarity, float):
        raise TypeError("similarity is a number")
    return HunkFailure(
        file=_str(f["file"]), hunk=_int(f["hunk"]), patch_line=_int(f["patch_line"]),
        note=_str(f["note"]), upstream_diff=_str(f["upstream_diff"]),
        depends_on=tuple(_strs(f["depends_on"])), evidence=_str(f["evidence"]),
        similarity=similarity, side_by_side=_str(f["side_by_side"]),
        moved_to=_str(f["moved_to"]),
    )


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError("a string")
    return value


def _int(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError("an integer")
    return value


def _objects(value: object) -> list[dict[str, object]]:
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise TypeError("a list of objects")
    return value


def _strs(value: object) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TypeError("a list of strings")
    return value
