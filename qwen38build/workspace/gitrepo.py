"""git for the topic workspace: one way to run it (no user or system configuration, a fixed
identity and time, so the same series gives the same commit ids anywhere), and a commit of
the index with a message kept verbatim."""

from __future__ import annotations

import os
from pathlib import Path

from qwen38build.errors import Qwen38BuildError
from qwen38build.proc import environment, run

# Fixed identity and time: the same series gives the same commit ids anywhere.
IDENTITY = {
    "GIT_AUTHOR_NAME": "qwen38build",
    "GIT_AUTHOR_EMAIL": "qwen38build@localhost",
    "GIT_AUTHOR_DATE": "946684800 +0000",
    "GIT_COMMITTER_NAME": "qwen38build",
    "GIT_COMMITTER_EMAIL": "qwen38build@localhost",
    "GIT_COMMITTER_DATE": "946684800 +0000",
}

def git_env(*, identity: bool = True, **declared: str) -> dict[str, str]:
    """The environment git runs in: no user or system config, C locale, fixed identity.

    ``HOME`` is passed (git refuses to run without one) but no config of it is read.
    """
    return environment(passed=("HOME",), declared={
        "HOME": os.environ.get("HOME", "/nonexistent"),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_TERMINAL_PROMPT": "0",
        **(IDENTITY if identity else {}),
        **declared,
    })


def local_identity(repo: Path, *, keep: bool = False) -> None:
    """Write the workspace's identity into its own ``.git/config``, so that the user's git
    (``git cherry-pick --continue``, ``git commit``) works with any HOME, one with no
    identity included. With ``keep``, an identity the repository already has stays."""
    for key, env in (("user.name", "GIT_COMMITTER_NAME"), ("user.email", "GIT_COMMITTER_EMAIL")):
        if keep and git(repo, "config", "--local", "--get", key, check=False).strip():
            continue
        git(repo, "config", "--local", key, IDENTITY[env])


def git(repo: Path, *args: str, stdin: str | None = None, check: bool = True,
        env: dict[str, str] | None = None) -> str:
    """Run git in ``repo``; a failure is a Qwen38BuildError quoting git's own words."""
    proc = run(["git", *args], what="git", hint="install git (Debian: apt-get install git)",
               cwd=repo, input=stdin, env=env or git_env())
    if check and not proc.ok:
        raise Qwen38BuildError(f"git {' '.join(args[:3])} failed in {repo}:\n{proc.tail()}")
    return proc.stdout


def commit_tree(repo: Path, parent: str | None, message: str) -> str:
    """Commit the index as a child of ``parent``, message verbatim (no cleanup)."""
    tree = git(repo, "write-tree").strip()
    args = ["commit-tree", tree]
    if parent:
        args += ["-p", parent]
    return git(repo, *args, stdin=message).strip()
