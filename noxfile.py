"""The front door: thin sessions over the qwen38build CLI and the test suite.

``nox -s build`` builds on the embedded default (a local store under the user cache dir);
everything else is listed by ``nox -l``. Arguments after ``--`` go to the command.
"""

from __future__ import annotations

import nox

nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["build"]
PYTHON = "3.11"


def _tool(session: nox.Session, *extras: str) -> None:
    spec = f".[{','.join(extras)}]" if extras else "."
    session.install("-e", spec)


@nox.session(python=PYTHON)
def build(session: nox.Session) -> None:
    """Build the patched vLLM wheel (lock-checked, cached, linked to ./result)."""
    _tool(session)
    session.run("qwen38build", "build", *session.posargs)


@nox.session(python=PYTHON)
def apply(session: nox.Session) -> None:
    """Write the last build's files into an installed vLLM: nox -s apply -- SITE_PACKAGES."""
    _tool(session)
    session.run("qwen38build", "apply", *session.posargs)


@nox.session(python=PYTHON)
def verify(session: nox.Session) -> None:
    """Check a tree holds exactly the build's bytes: nox -s verify -- SITE_PACKAGES."""
    _tool(session)
    session.run("qwen38build", "verify", *session.posargs)


@nox.session(python=PYTHON)
def kernels(session: nox.Session) -> None:
    """Build the pthfa cubins per CUDA arch and its wheel: nox -s kernels -- --arch 9.0."""
    _tool(session)
    session.run("qwen38build", "kernels", *session.posargs)


@nox.session(python=PYTHON)
def env(session: nox.Session) -> None:
    """Make the stack's virtual environment from the locks and the store: nox -s env -- DIR."""
    _tool(session)
    session.run("qwen38build", "env", *session.posargs)


@nox.session(python=PYTHON)
def gpu_tests(session: nox.Session) -> None:
    """The GPU tests; each skips with its reason where no GPU is present."""
    _tool(session, "test")
    # Without a GPU the module skips itself with its reason; pytest then exits 5 (no test
    # ran), which is the expected answer here, not a failure.
    session.run("pytest", "-m", "gpu", "-rs", "tests/gpu", *session.posargs,
                success_codes=[0, 5])


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff, mypy --strict, the ledger rules and the generated table."""
    _tool(session, "test", "lint", "patches-test")
    session.run("ruff", "check", "qwen38build", "tests", "noxfile.py", "bench")
    session.run("mypy", "qwen38build", "tests")
    session.run("qwen38build", "lint")
    session.run("qwen38build", "table", "--check")


@nox.session(python=PYTHON)
def lock(session: nox.Session) -> None:
    """Re-pin lock/ from the recipe (nox -s lock -- --check to only check)."""
    _tool(session)
    session.run("qwen38build", "lock", *session.posargs)


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The test suite (GPU tests skip here), with a coverage figure."""
    _tool(session, "test", "patches-test")
    session.run(
        "pytest", "-m", "not gpu", "--cov=qwen38build", "--cov-report=term:skip-covered",
        *session.posargs,
    )
