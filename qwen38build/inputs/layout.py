"""The recipe against the project's folders: paths that stay inside, the series and its files.

Checked after the schema (pydantic) and before anything is read through those paths: a path
out of the project, a folder where a patch should be, a series that disagrees with its
folders. Each problem is a key path and a sentence; the lint says the series ones at their
lines."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from qwen38build.inputs.recipe import LoadedRecipe




def outside_problem(root: Path, rel: str, *, want: str) -> str | None:
    """Why ``rel`` (a recipe path) is unusable, or None.

    It must be relative, resolve (links followed) to a place inside ``root``, and, when it
    exists, be of the kind wanted (``dir`` or ``file``; ``any`` takes either).
    """
    if not rel or "\0" in rel or "\\" in rel:
        return f"{rel!r} is not a usable path; write a relative path inside the project"
    if os.path.isabs(rel):
        return f"{rel!r} is absolute; write a path relative to the project"
    real_root = os.path.realpath(root)
    target = os.path.realpath(os.path.join(root, rel))
    if os.path.commonpath([real_root, target]) != real_root:
        return f"{rel!r} leads outside the project (to {target}); keep it inside the project"
    try:
        st = os.stat(target)
    except FileNotFoundError:
        if os.path.islink(os.path.join(root, rel)) or os.path.islink(target):
            return f"{rel!r} is a dangling link; point it at a file or remove it"
        return None  # absence is reported by the check that needs the file
    except OSError as exc:
        return f"{rel!r} cannot be read ({exc.strerror}); fix the link or the permissions"
    if want == "dir" and not stat.S_ISDIR(st.st_mode):
        return f"{rel!r} is not a folder; point it at a folder"
    if want == "file" and not stat.S_ISREG(st.st_mode):
        return f"{rel!r} is not a regular file; point it at a file"
    return None


def path_problems(loaded: LoadedRecipe) -> list[str]:
    """Every recipe path that would leave the project (links included) or has the wrong kind."""
    r, root = loaded.recipe, loaded.root
    checks = [(f"series.groups.{i}.dir", g.dir, "dir") for i, g in enumerate(r.series.groups)]
    checks += [("pthfa.path", r.pthfa.path, "dir"), ("fa2.diff", r.fa2.diff, "file")]
    problems = overlay_problems(loaded)
    checks += [(f"series.groups.{i}.overlay", f"{g.dir}/{g.overlay}", "dir")
               for i, g in enumerate(r.series.groups) if g.overlay is not None and not g.source]
    for where, rel, want in checks:
        why = outside_problem(root, rel, want=want)
        if why is not None:
            problems.append(f"{where}: {why}")
    # lock/ is read by name, not from the recipe, but stays inside the project too, links
    # resolved (never another checkout's lock); what it holds is the lock reader's check.
    real_root = os.path.realpath(root)
    for rel in ("lock", "lock/sources.json", "lock/pylock.toml", "lock/pylock.inputs.json"):
        target = os.path.realpath(os.path.join(root, rel))
        if os.path.commonpath([real_root, target]) != real_root:
            problems.append(f"{rel}: {rel!r} leads outside the project (to {target}); keep "
                            "the lock inside the project")
            break
    return problems


def overlay_problems(loaded: LoadedRecipe) -> list[str]:
    """A group's overlay is a folder below the group's own (or its source tree's top),
    named without ``..``; a local one must exist (its files are an input of every build of
    the group)."""
    problems = []
    for i, g in enumerate(loaded.recipe.series.groups):
        if g.overlay is None:
            continue
        where = f"series.groups.{i}.overlay"
        parts = g.overlay.replace("\\", "/").split("/")
        if os.path.isabs(g.overlay) or ".." in parts or not g.overlay.strip("./"):
            inside = f"source tree {g.source!r}" if g.source else f"folder {g.dir}/"
            problems.append(f"{where}: {g.overlay!r} must name a folder inside the group's "
                            f"{inside} (relative, no '..')")
        elif g.source is None and os.path.isdir(loaded.root / g.dir) and not os.path.lexists(
                loaded.root / g.dir / g.overlay):
            problems.append(f"{where}: folder {g.dir}/{g.overlay}/ does not exist; create "
                            "it (with its MANIFEST) or remove the overlay key")
    return problems


def entry_problems(loaded: LoadedRecipe, *, missing_ok: bool = False) -> list[str]:
    """Every series entry that is not a regular file inside the project: a folder, a
    dangling link, a link out of the project, or (unless ``missing_ok``) absent."""
    problems = []
    for gi, group in enumerate(loaded.recipe.series.groups):
        if not os.path.isdir(os.path.join(loaded.root, group.dir)):
            continue  # the group's own problem is reported once, by series_problem_lines
        for pi, name in enumerate(group.patches):
            rel = f"{group.dir}/{name}"
            why = outside_problem(loaded.root, rel, want="file")
            if why is None and not missing_ok and not os.path.isfile(loaded.root / rel):
                why = f"{rel} does not exist"
            if why is not None:
                problems.append(f"series.groups.{gi}.patches.{pi}: {why}")
    return problems


def hard_problems(loaded: LoadedRecipe, *, missing_ok: bool = False) -> list[str]:
    """The problems no command may work around: paths leaving the project, wrong kinds."""
    return path_problems(loaded) + entry_problems(loaded, missing_ok=missing_ok)


@dataclass(frozen=True)
class SeriesProblem:
    """One way the series and its folders disagree: the one rule that both ``load`` (a
    RecipeError) and the lint's series rule (a finding with its line) apply, each in its
    own words. ``what``: ``group-twice``, ``no-folder``, ``topic-twice``, ``retired-listed``,
    ``no-file`` (a listed patch with no file), ``unlisted`` or ``retired-file`` (a file the
    series does not list)."""

    what: str
    group: int
    dir: str
    name: str = ""
    index: int = -1  # the entry's index in its group's patches (listed problems)
    also_dir: str = ""  # topic-twice: where the topic first stood
    also_index: tuple[int, int] = (-1, -1)


def series_problems(loaded: LoadedRecipe) -> list[SeriesProblem]:
    """Every disagreement of the series with its folders, in recipe order."""
    recipe, root = loaded.recipe, loaded.root
    retired = set(recipe.series.retired)
    out: list[SeriesProblem] = []
    seen: dict[str, tuple[str, int, int]] = {}
    dirs_seen: set[str] = set()
    for gi, group in enumerate(recipe.series.groups):
        if group.dir in dirs_seen:
            out.append(SeriesProblem("group-twice", gi, group.dir))
            continue
        dirs_seen.add(group.dir)
        folder = root / group.dir
        if not folder.is_dir():
            out.append(SeriesProblem("no-folder", gi, group.dir))
            continue
        on_disk = {p.name for p in folder.glob("*.patch")}
        for pi, name in enumerate(group.patches):
            topic = name.removesuffix(".patch")
            if topic in seen:
                first_dir, fg, fp = seen[topic]
                out.append(SeriesProblem("topic-twice", gi, group.dir, name, pi, first_dir,
                                         (fg, fp)))
            seen.setdefault(topic, (group.dir, gi, pi))
            if topic in retired:
                out.append(SeriesProblem("retired-listed", gi, group.dir, name, pi))
            if name not in on_disk:
                out.append(SeriesProblem("no-file", gi, group.dir, name, pi))
        for name in sorted(on_disk - set(group.patches)):
            what = "retired-file" if name.removesuffix(".patch") in retired else "unlisted"
            out.append(SeriesProblem(what, gi, group.dir, name))
    return out


def series_problem_lines(loaded: LoadedRecipe) -> list[str]:
    """The series rule as a recipe error's lines, by TOML key path (a listed patch with no
    file is entry_problems' to say)."""
    problems: list[str] = []
    for p in series_problems(loaded):
        where = f"series.groups.{p.group}"
        loc = f"{where}.patches.{p.index}"
        if p.what == "group-twice":
            problems.append(f"{where}.dir: group {p.dir!r} is listed twice")
        elif p.what == "no-folder":
            problems.append(f"{where}.dir: folder {p.dir}/ does not exist")
        elif p.what == "topic-twice":
            fg, fp = p.also_index
            problems.append(f"{loc}: {p.name} is listed twice (also "
                            f"series.groups.{fg}.patches.{fp})")
        elif p.what == "retired-listed":
            problems.append(f"{loc}: {p.name} is a retired topic (series.retired); "
                            "remove the entry and the file")
        elif p.what in ("unlisted", "retired-file"):
            problems.append(f"{where}.patches: {p.dir}/{p.name} is in the folder but not in "
                            "the series; list it or delete it")
    return problems
