"""The workspace's carry onto a new pin, where it stands, and going on from a stop.

``bump --rebase DIR`` starts the carry (git's sequencer picks every topic onto the new
pristine commit) and stops at the first conflict. ``workspace continue DIR`` goes on from
each later stop (``git cherry-pick --continue``, or ``--skip``) and says again what the
first stop said: which topic stopped, the files in conflict, what to do. Without it, every
stop after the first showed git's own text only.
"""

from __future__ import annotations

from pathlib import Path

from qwen38build.bump.report import RebaseResult
from qwen38build.errors import InputError
from qwen38build.workspace import gitrepo, workspace


def carry_state(repo: Path, branch: str, new_tag: str, finished: bool,
                skipped: tuple[str, ...] = ()) -> RebaseResult:
    """The carry's state: the topics on ``branch`` since ``new_tag`` (and those that came
    out empty: upstream has them), and unless ``finished`` the topic that stopped."""
    git = gitrepo.git
    done: list[str] = []
    empty: list[str] = []
    for c in workspace.read_commits(repo, f"{new_tag}..HEAD"):
        topic = c.subject.removeprefix(workspace.SUBJECT_PREFIX)
        done.append(topic)
        parent_tree = git(repo, "rev-parse", f"{c.parent}^{{tree}}").strip() if c.parent else ""
        if parent_tree == c.tree:
            empty.append(topic)
    if finished:
        return RebaseResult(str(repo), branch, tuple(done), tuple(empty), skipped=skipped)
    stuck = git(repo, "log", "-1", "--format=%s", "CHERRY_PICK_HEAD", check=False).strip()
    files = git(repo, "diff", "--name-only", "--diff-filter=U").split()
    return RebaseResult(
        str(repo), branch, tuple(done), tuple(empty),
        stuck.removeprefix(workspace.SUBJECT_PREFIX) or "(see git status)",
        tuple(files) or ("(see git status)",), skipped=skipped,
    )


def continue_carry(repo: Path, *, skip: bool = False) -> tuple[RebaseResult, str]:
    """Go on from a stopped carry in ``repo`` (its conflicts resolved and added, or with
    ``skip`` the stopped topic left for later): (where it stands now, the new pin).

    InputError (exit 2) when ``repo`` is no workspace with a stopped carry, or when files
    are still in conflict: nothing is run then."""
    from qwen38build.proc import run

    repo = repo.resolve()
    git = gitrepo.git
    if not (repo / ".git").exists():
        raise InputError(f"{repo}: not a workspace (no .git).",
                         hint="`qwen38build bump vllm VERSION --rebase DIR` starts a carry")
    if not git(repo, "rev-parse", "-q", "--verify", "CHERRY_PICK_HEAD", check=False).strip():
        raise InputError(f"{repo}: no carry is stopped here (git has no cherry-pick in progress).",
                         hint="`qwen38build export DIR` writes the finished topics")
    branch = git(repo, "rev-parse", "--abbrev-ref", "HEAD").strip()
    prefix = f"{workspace.BRANCH}-"
    if not branch.startswith(prefix):
        raise InputError(f"{repo}: branch {branch} is not a carry's ({prefix}VERSION).")
    version = branch.removeprefix(prefix)
    unresolved = git(repo, "diff", "--name-only", "--diff-filter=U").split()
    if unresolved and not skip:
        raise InputError(f"{repo}: still in conflict: {', '.join(unresolved)}.",
                         hint="resolve them and `git add` each, or `--skip` the topic")
    # the commit message is the topic's, kept as it is (no editor)
    proc = run(["git", "cherry-pick", "--skip" if skip else "--continue"], what="git",
               cwd=repo, env=gitrepo.git_env(GIT_EDITOR="true"))
    state = carry_state(repo, branch, workspace.pin_tag(version), proc.ok)
    return state, version
