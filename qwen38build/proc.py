"""The one way the tool runs another program: a declared environment, one error translation.

GNU patch, nvcc, git, uv, pip, diff and diffoscope all run through :func:`run`. The child's
environment is built from nothing: ``LC_ALL=C`` and ``TZ=UTC``, a ``PATH`` (the caller's,
or one the step declares) and the variables the caller names, so no setting of the user's
shell can change what a step makes. A program that cannot be started becomes one
:class:`~qwen38build.errors.ToolError` naming it; a failure's message quotes the tail of
what the program said.

Kept free of third-party imports: the no-op build path may import it.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from qwen38build.errors import Qwen38BuildError, ToolError

BASE = {"LC_ALL": "C", "TZ": "UTC"}
#: Where a step finds the machine's own programs (the host compiler nvcc calls).
BASE_PATH = "/usr/bin:/bin"
TAIL_LINES = 20


def environment(
    *, path: str | None = None, passed: Iterable[str] = (), declared: Mapping[str, str] = {},
) -> dict[str, str]:
    """A child's whole environment: the base, ``PATH``, the ``passed`` variables the parent
    has (by name), then ``declared`` values. Nothing else of the parent's reaches it."""
    env = {"PATH": path if path is not None else os.environ.get("PATH", "/usr/bin:/bin"),
           **BASE}
    for name in passed:
        if name in os.environ:
            env[name] = os.environ[name]
    env.update(declared)
    return env


def inherited(**declared: str) -> dict[str, str]:
    """The parent's whole environment (plus ``declared``), for the programs that fetch:
    pip and uv read the user's index configuration from it on purpose. What they fetch is
    checked by its sha256, so nothing of this environment can change a step's bytes."""
    return {**os.environ, **declared}


@dataclass(frozen=True)
class Result:
    """What a program did: its exit status and what it wrote (stdout as text or bytes)."""

    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    raw: bytes = b""  # stdout's bytes, when asked for with ``binary=True``

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def tail(self, lines: int = TAIL_LINES) -> str:
        """The last ``lines`` lines the program said (stderr, else stdout), for a message."""
        said = (self.stderr.strip() or self.stdout.strip()).splitlines()
        return "\n".join(said[-lines:])


def run(
    args: Sequence[str | Path],
    *,
    what: str,
    hint: str | None = None,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    input: str | bytes | None = None,
    binary: bool = False,
    timeout: float | None = None,
    fail: type[Qwen38BuildError] | None = None,
) -> Result:
    """Run ``args`` and return what it did.

    ``what`` names the program for a reader ("GNU patch", "git", "nvcc"); ``hint`` says how
    to get it where it is missing. ``env`` is the child's whole environment (default:
    :func:`environment`). Text is decoded with ``surrogateescape``, so no output can fail
    to decode. ``binary`` keeps stdout's bytes in ``raw``. A non-zero exit is returned,
    or, with ``fail``, raised as that error quoting the program's last words.
    """
    argv = [str(a) for a in args]
    data = input.encode("utf-8", "surrogateescape") if isinstance(input, str) else input
    try:
        proc = subprocess.run(argv, cwd=cwd, env=dict(env) if env is not None else environment(),
                              input=data, capture_output=True, timeout=timeout, check=False)
    except FileNotFoundError as exc:
        if cwd is not None and not Path(cwd).is_dir():
            raise  # the folder, not the program: the caller's boundary names it
        raise ToolError(f"{what} ({argv[0]}) is not installed or not on PATH.",
                        hint=hint or f"install {what}") from exc
    except PermissionError as exc:
        raise ToolError(f"{what} ({argv[0]}) cannot be run: {exc.strerror}.",
                        hint=hint or "check that it is executable") from exc
    except subprocess.TimeoutExpired as exc:
        raise ToolError(f"{what} did not finish within {timeout:g} s: {' '.join(argv[:4])}.",
                        hint="run it again; if it keeps hanging, run it by hand") from exc
    result = Result(tuple(argv), proc.returncode, proc.stdout.decode("utf-8", "surrogateescape"),
                    proc.stderr.decode("utf-8", "surrogateescape"), proc.stdout if binary else b"")
    if fail is not None and not result.ok:
        raise fail(f"{what} failed (exit {result.returncode}): {' '.join(argv[:4])}:\n"
                   f"{result.tail()}")
    return result

