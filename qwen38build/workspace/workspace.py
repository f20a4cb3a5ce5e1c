"""The topic workspace: the series as git commits on the pristine package, and export back.

``create`` makes a git repository whose first commit is the pristine ``vllm/`` package of
the pin (tagged ``v<pin>``), then one commit per series entry, in series order, subject
``[qwen38] <row name>``, body the patch file's prose and header block exactly as the file
has them. Patches are applied with GNU patch at fuzz 0 (the definition of "applies").
Authors, committers and dates are fixed, and git runs without the user's global or system
configuration, so the same pin and series give the same commit ids on any machine.

A series group's local overlay is a topic too (``[qwen38] <dir>:overlay``, before the
group's first patch): :mod:`qwen38build.workspace.overlay` commits its files and exports
them back into the overlay folder with its MANIFEST.

What the pristine commit holds: every member of the wheel's ``vllm/`` package whose suffix
is in :data:`TEXT_SUFFIXES` (Python sources, JSON configs, templates and the like), plus any
member the series touches whatever its suffix. Compiled libraries and the vendored C/CUDA
headers (about 60 MB the series never touches) are left out to keep ``create`` fast.

``export`` turns the workspace's commits back into patch files: the diff of each topic's
commit (``git diff -U3`` with ``a/``/``b/`` prefixes relative to the package), headed by
the commit body and the marker line. ``fixup!`` (and ``squash!``) commits fold into the
topic their subject names, wherever they stand in the history. A commit whose subject
names no topic of the series is an error naming the commit.

The marker's commit: an export whose topic's text (body and diff) is unchanged keeps the
patch file as it is, marker included, so a round trip (create, export with no edits) is
byte-identical and unedited topics do not churn in review. A topic whose text changed gets
the marker of its workspace commit. ``export(check=True)`` lists the files whose text,
marker commit aside, differs from the workspace.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from qwen38build.engine.fetch import locked_wheel
from qwen38build.errors import InputError, PatchFailed, Qwen38BuildError
from qwen38build.inputs.recipe import LoadedRecipe, SeriesEntry
from qwen38build.proc import run
from qwen38build.series.gnupatch import describe_failure, run_patch
from qwen38build.series.patchfile import MARKER_PREFIX, PatchFile, marker_for
from qwen38build.store.store import Store
from qwen38build.wheels import wheelzip
from qwen38build.workspace.gitrepo import commit_tree, git, git_env, local_identity
from qwen38build.workspace.overlay import (
    OverlayEntry,
    commit_overlay,
    export_overlay,
    workspace_entries,
)

PACKAGE = "vllm"
EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
BRANCH = "qwen38"
SUBJECT_PREFIX = "[qwen38] "
FOLD_PREFIXES = ("fixup! ", "squash! ", "amend! ")
TEXT_SUFFIXES = frozenset({
    ".py", ".pyi", ".json", ".jinja", ".md", ".txt", ".typed", ".ini", ".sh", ".toml",
    ".yaml", ".yml", ".cfg", ".js", ".css", ".html", ".gitkeep",
})
DIFF_ARGS = (
    "-c", "core.abbrev=7", "diff", "--no-color", "--no-ext-diff", "--no-textconv",
    "--no-renames", "-U3", "--diff-algorithm=myers", "--indent-heuristic",
    f"--relative={PACKAGE}/", "--src-prefix=a/", "--dst-prefix=b/",
)


def pin_tag(version: str) -> str:
    return f"v{version}"


def pristine_subject(version: str) -> str:
    return f"vllm {version} (pristine)"


# -- the pristine package -----------------------------------------------------------------


def is_text_member(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    dot = base.rfind(".")
    return dot >= 0 and base[dot:] in TEXT_SUFFIXES


def extract_package(wheel: Path, dest: Path, also: Iterable[str] = ()) -> list[str]:
    """Write the package's text members (and the package paths in ``also``) under ``dest``.

    Returns the package-relative paths written, sorted. Through the one extraction routine
    (``wheelzip.extract``): every member is checked, nothing lands outside ``dest``.
    """
    prefix = f"{PACKAGE}/"
    wanted = set(also)
    chosen = [
        name for name in wheelzip.member_infos(wheel)
        if name.startswith(prefix) and not name.endswith("/")
        and (is_text_member(name) or name[len(prefix):] in wanted)
    ]
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".q38-extract.", dir=dest.parent) as tmp:
        written = wheelzip.extract(wheel, Path(tmp), chosen)
        src = Path(tmp) / PACKAGE
        for name in written:
            rel = name[len(prefix):]
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src / rel, target)
    return sorted(name[len(prefix):] for name in written)


def touched_by_series(entries: Iterable[SeriesEntry]) -> set[str]:
    out: set[str] = set()
    for e in entries:
        out.update(PatchFile.parse(e.path).touched_paths)
    return out


# -- create -----------------------------------------------------------------------------


def commit_message(row_name: str, patch_path: Path) -> str:
    """``[qwen38] <row>``, a blank line, then the file's text above the marker, verbatim."""
    preamble = _preamble(patch_path.read_bytes().decode("utf-8"))
    subject = SUBJECT_PREFIX + row_name
    return f"{subject}\n\n{preamble}" if preamble.strip() else f"{subject}\n"


def _preamble(text: str) -> str:
    """A patch file's text above its export marker (its prose and header block)."""
    idx = text.find("\n" + MARKER_PREFIX)
    if text.startswith(MARKER_PREFIX):
        idx = -1
    return text[: idx + 1] if idx >= 0 else ""


def create(loaded: LoadedRecipe, store: Store, dest: Path) -> Path:
    """Make the workspace at ``dest`` (absent or empty); return its path.

    Commits: the pristine package tagged ``v<pin>``, then one per series entry, on branch
    ``qwen38``. A patch that does not apply at fuzz 0 raises PatchFailed naming it; the
    repository is left as it stands for inspection.
    """
    dest = dest.resolve()
    if dest.exists() and any(dest.iterdir()):
        raise InputError(
            f"{dest}: not empty; the workspace is made in a new directory.",
            hint="pass a new DIR, or remove that one",
        )
    dest.mkdir(parents=True, exist_ok=True)
    pin = loaded.recipe.vllm.version
    entries = workspace_entries(loaded)
    wheel = locked_wheel(loaded, store)
    git(dest, "init", "-q", "-b", BRANCH)
    git(dest, "config", "core.autocrlf", "false")
    local_identity(dest)
    git(dest, "config", "core.looseCompression", "1")  # speed over size: a scratch repo
    extract_package(wheel, dest / PACKAGE, touched_by_series(loaded.series_entries()))
    git(dest, "add", "-A", "--", PACKAGE)
    head = commit_tree(dest, None, pristine_subject(pin) + "\n")
    git(dest, "tag", pin_tag(pin), head)
    for entry in entries:
        head = (commit_overlay(dest, entry, head, PACKAGE, SUBJECT_PREFIX)
                if isinstance(entry, OverlayEntry) else apply_entry(dest, entry, head))
    # The index and the work tree already hold ``head``'s tree: only the branch moves.
    git(dest, "update-ref", f"refs/heads/{BRANCH}", head)
    return dest


def apply_entry(repo: Path, entry: SeriesEntry, parent: str) -> str:
    pf = PatchFile.parse(entry.path)
    result = run_patch(entry.path, repo / PACKAGE)
    if not result.ok:
        err = describe_failure(pf, result, repo / PACKAGE)
        raise PatchFailed(f"{repo}: {err.message}", hint=err.hint)
    paths = [f"{PACKAGE}/{p}" for p in pf.touched_paths]
    git(repo, "add", "-A", "--", *paths)
    return commit_tree(repo, parent, commit_message(entry.row_name, entry.path))


# -- export -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Commit:
    sha: str
    parent: str | None
    tree: str
    subject: str
    body: str  # the message after the subject's blank line, verbatim


@dataclass
class Topic:
    entry: SeriesEntry | OverlayEntry
    commit: Commit
    folded: list[Commit]


def read_commits(repo: Path, rev_range: str) -> list[Commit]:
    """The commits of ``rev_range``, oldest first, with their messages verbatim."""
    shas = git(repo, "rev-list", "--reverse", "--topo-order", rev_range).split()
    if not shas:
        return []
    raw = run(["git", "cat-file", "--batch"], what="git", cwd=repo,
              input=("\n".join(shas) + "\n").encode(), env=git_env(), binary=True,
              fail=Qwen38BuildError).raw
    out: list[Commit] = []
    pos = 0
    for sha in shas:
        nl = raw.index(b"\n", pos)
        size = int(raw[pos:nl].split()[2])
        obj = raw[nl + 1 : nl + 1 + size].decode("utf-8")
        pos = nl + 1 + size + 1
        head, _, message = obj.partition("\n\n")
        fields = [ln.split(" ", 1) for ln in head.split("\n")]
        tree = next(v for k, v in fields if k == "tree")
        parents = [v for k, v in fields if k == "parent"]
        subject, _, body = message.partition("\n")
        out.append(Commit(sha, parents[0] if parents else None, tree, subject,
                          body.removeprefix("\n")))
    return out


def _target_subject(subject: str) -> tuple[str, bool]:
    folded = False
    while subject.startswith(FOLD_PREFIXES):
        subject = subject.split(" ", 1)[1]
        folded = True
    return subject, folded


def topics_of(loaded: LoadedRecipe, repo: Path) -> list[Topic]:
    """The workspace's topics in history order, each with the commits folded into it."""
    pin = loaded.recipe.vllm.version
    tag = pin_tag(pin)
    if not git(repo, "rev-parse", "-q", "--verify", f"refs/tags/{tag}", check=False).strip():
        raise InputError(
            f"{repo}: no tag {tag}; it is not a workspace of vllm {pin}.",
            hint="make one with `qwen38build workspace create DIR`",
        )
    entries = workspace_entries(loaded)
    by_row = {e.row_name: e for e in entries}
    by_row.update({e.topic: e for e in entries if e.topic not in by_row})
    topics: dict[str, Topic] = {}
    for c in read_commits(repo, f"{tag}..HEAD"):
        subject, folded = _target_subject(c.subject)
        row = subject.removeprefix(SUBJECT_PREFIX) if subject.startswith(SUBJECT_PREFIX) else None
        entry = by_row.get(row) if row is not None else None
        if entry is None:
            raise InputError(
                f"{repo}: commit {c.sha[:12]} ({c.subject!r}) names no topic of the series "
                f"in {loaded.path.name}.",
                hint="subjects are '[qwen38] <topic>' or 'fixup! [qwen38] <topic>'; reword "
                "the commit (git rebase -i) or add the topic to the recipe",
            )
        if folded:
            if entry.row_name not in topics:
                raise InputError(
                    f"{repo}: commit {c.sha[:12]} ({c.subject!r}) comes before the commit of "
                    f"topic {entry.row_name}.",
                    hint="move it after its topic's commit",
                )
            topics[entry.row_name].folded.append(c)
        elif entry.row_name in topics:
            raise InputError(
                f"{repo}: topic {entry.row_name} has two commits, "
                f"{topics[entry.row_name].commit.sha[:12]} and {c.sha[:12]}.",
                hint=f"make the second 'fixup! {SUBJECT_PREFIX}{entry.row_name}'",
            )
        else:
            topics[entry.row_name] = Topic(entry, c, [])
    return list(topics.values())


def _pick(repo: Path, commit: Commit, onto: str, topic: str, trees: dict[str, str]) -> str:
    """The tree of ``commit``'s change carried onto tree ``onto`` (git apply --3way).

    Done in a throwaway index: neither the work tree nor the user's index is touched.
    """
    if commit.parent is not None and trees.get(commit.parent) == onto:
        return commit.tree
    parent = commit.parent or EMPTY_TREE
    diff = git(repo, "diff-tree", "-p", "--binary", "--full-index", "--no-renames",
               parent, commit.sha)
    with tempfile.TemporaryDirectory(prefix="q38-fold.") as tmp:
        env = git_env(GIT_INDEX_FILE=str(Path(tmp) / "index"))
        git(repo, "read-tree", onto, env=env)
        proc = run(["git", "apply", "--cached", "--3way"], what="git", cwd=repo, input=diff,
                   env=env)
        if not proc.ok:
            said = " ".join(proc.stderr.split())
            raise InputError(
                f"{repo}: commit {commit.sha[:12]} ({commit.subject!r}) does not fold into "
                f"topic {topic} without conflicts: {said}",
                hint="move it next to its topic and resolve it (git rebase -i --autosquash)",
            )
        return git(repo, "write-tree", env=env).strip()


def topic_trees(
    repo: Path, topics: list[Topic], base: Commit
) -> list[tuple[str, str]]:
    """For each topic, (tree before, tree after) in the history with fixups squashed."""
    trees = {base.sha: base.tree}
    for t in topics:
        for c in (t.commit, *t.folded):
            trees[c.sha] = c.tree
    out = []
    cur = base.tree
    for t in topics:
        before = cur
        for c in (t.commit, *t.folded):
            cur = _pick(repo, c, cur, t.entry.row_name, trees)
        out.append((before, cur))
    return out


def render(topic: Topic, diff: str, commit: str, pin: str | None = None) -> str:
    """The patch file's text: the commit body, the marker, the diff. With ``pin`` (the
    version the workspace's hunks are cut on), a ``Cut-against:`` header that starts with
    another version starts with ``pin`` instead: after a bump the hunks are the new pin's."""
    body = topic.commit.body
    if pin is not None:
        body = _CUT_AGAINST.sub(lambda m: m.group(1) + pin, body, count=1)
    return body + marker_for(commit, topic.entry.topic) + "\n" + diff


_CUT_AGAINST = re.compile(r"^(Cut-against:[ \t]*)\d+(?:\.\d+)+(?=[:;,\s]|$)", re.MULTILINE)


def _same_but_marker(old: str, new: str) -> bool:
    def strip(text: str) -> list[str]:
        return [
            ln.split(" (", 1)[1] if ln.startswith(MARKER_PREFIX) else ln
            for ln in text.split("\n")
        ]
    return strip(old) == strip(new)


@dataclass(frozen=True)
class Exported:
    """The files written (with ``check``: that disagree), and the topics with no commit yet
    (a carry stopped at a conflict, a topic not committed), in series order."""

    changed: list[Path]
    unfinished: list[str]
    #: an unfinished topic's commit on the branch a bump carried from (``qwen38``), where
    #: there is one: a carry that skipped it (``git cherry-pick --skip``) left it there
    earlier: dict[str, str] = field(default_factory=dict)


def export(
    loaded: LoadedRecipe, dest: Path, topics: Sequence[str] | None = None, check: bool = False
) -> list[Path]:
    """:func:`export_topics`, the files written (or, with ``check``, disagreeing) alone."""
    return export_topics(loaded, dest, topics, check).changed


def export_topics(
    loaded: LoadedRecipe, dest: Path, topics: Sequence[str] | None = None, check: bool = False
) -> Exported:
    """Write the patch files of workspace ``dest``'s finished topics; name the others.

    ``topics`` limits it to those topics (topic or row names). With ``check`` nothing is
    written and the files that disagree are returned. A topic with no commit is named as
    unfinished, its file left as it is. Commits must be in series order (else InputError).
    """
    repo = dest.resolve()
    if not (repo / ".git").exists():
        raise InputError(
            f"{dest}: {'is not a git workspace' if repo.is_dir() else 'does not exist'}.",
            hint="give the folder `qwen38build workspace create` made",
        )
    pin = loaded.recipe.vllm.version
    found = topics_of(loaded, repo)
    order = [e.row_name for e in workspace_entries(loaded)]
    have = [t.entry.row_name for t in found]
    if have != [r for r in order if r in have]:
        raise InputError(
            f"{repo}: the workspace's topics are in another order than the series in "
            f"{loaded.path.name}: {', '.join(have)}.",
            hint="reorder the commits (git rebase -i) or the recipe's series",
        )
    missing = [e for e in workspace_entries(loaded) if e.row_name not in have]
    wanted = _select(found, topics, repo, missing)
    base_sha = git(repo, "rev-parse", f"{pin_tag(pin)}^{{commit}}").strip()
    trees = topic_trees(repo, found, read_commits(repo, base_sha + "^!")[-1])
    changed: list[Path] = []
    for t, (before, after) in zip(found, trees, strict=True):
        if t.entry.row_name not in wanted:
            continue
        if isinstance(t.entry, OverlayEntry):
            changed += export_overlay(repo, t.entry, before, after, PACKAGE, check=check)
            continue
        diff = git(repo, *DIFF_ARGS, before, after)
        path = t.entry.path
        old = path.read_bytes().decode("utf-8") if path.exists() else None
        topic = t
        if not t.commit.body.strip() and old is not None:
            # a topic committed with a subject alone: its file's prose and headers stay
            topic = Topic(t.entry, replace(t.commit, body=_preamble(old)), t.folded)
        new = render(topic, diff, t.commit.sha, pin)
        if old is not None and _same_but_marker(old, new):
            continue
        changed.append(path)
        if not check:
            from qwen38build.files import atomic_write

            atomic_write(path, new.encode("utf-8"))
    unfinished = [e.row_name for e in missing if e.row_name in wanted]
    return Exported(changed, unfinished, _earlier_commits(repo, unfinished))


def _earlier_commits(repo: Path, rows: Sequence[str]) -> dict[str, str]:
    """Row name → its newest commit on branch ``qwen38`` that HEAD does not hold: after a
    bump's carry (on ``qwen38-<new>``), the pre-bump commit of a topic it skipped."""
    if not rows or not git(repo, "rev-parse", "-q", "--verify", f"refs/heads/{BRANCH}",
                           check=False).strip():
        return {}
    subjects = {SUBJECT_PREFIX + r: r for r in rows}
    found: dict[str, str] = {}
    log = git(repo, "log", "--format=%H %s", f"refs/heads/{BRANCH}", "--not", "HEAD")
    for line in log.splitlines():
        sha, _, subject = line.partition(" ")
        row = subjects.get(subject)
        if row is not None and row not in found:
            found[row] = sha
    return found


def _select(found: list[Topic], topics: Sequence[str] | None, repo: Path,
            missing: Sequence[SeriesEntry | OverlayEntry] = ()) -> set[str]:
    entries = [*(t.entry for t in found), *missing]
    if not topics:
        return {e.row_name for e in entries}
    names = {e.row_name: e.row_name for e in entries}
    names.update({e.topic: e.row_name for e in entries})
    unknown = [t for t in topics if t not in names]
    if unknown:
        raise InputError(
            f"{repo}: no topic {', '.join(unknown)} in the workspace.",
            hint="name topics as the series does (e.g. speed-knobs-envs, kvarn/<topic>)",
        )
    return {names[t] for t in topics}
