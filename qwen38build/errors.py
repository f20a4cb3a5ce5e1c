"""One exception hierarchy for the whole tool.

Every error's ``str()`` is a full sentence that names what is wrong and where (a file and
line, or a TOML key path). ``hint`` says what to do. Library code raises these; only the CLI
turns them into exit codes, through :class:`ExitCode`.
"""

from __future__ import annotations

import enum

TYPE_CHECKING = False  # typing itself costs the no-op path time
if TYPE_CHECKING:
    from collections.abc import Sequence


class ExitCode(enum.IntEnum):
    """What the process returns; one meaning each."""

    OK = 0
    FAILED = 1  # a build, a check or a comparison failed
    BAD_INPUT = 2  # the user's input or usage is wrong; nothing was touched
    BROKEN_PIPE = 141  # stdout's reader left (128 + SIGPIPE, as a shell reports it)


class Qwen38BuildError(Exception):
    """Root of every error this tool raises on purpose."""

    exit_code: ExitCode = ExitCode.FAILED

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class InputError(Qwen38BuildError):
    """Bad input: a recipe, a lock, a patch file, a flag. Exit 2, store untouched."""

    exit_code = ExitCode.BAD_INPUT


class RecipeError(InputError):
    """recipe.toml is unreadable or invalid; ``problems`` lists every one found.

    Each problem starts with its TOML key path (``series.groups.0.dir: ...``).
    """

    def __init__(self, path: str, problems: list[str], *, hint: str | None = None) -> None:
        self.path = path
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        noun = "problem" if len(problems) == 1 else "problems"
        super().__init__(f"{path}: {len(problems)} {noun}:\n{lines}", hint=hint)

    def one_line(self) -> str:
        first = self.problems[0] if self.problems else "invalid"
        more = len(self.problems) - 1
        tail = f" (and {more} more problem{'s' if more > 1 else ''}; --json lists all)" \
            if more > 0 else ""
        return f"{self.path}:{first}{tail}"


class HostError(Qwen38BuildError):
    """The machine refused (disk full, read-only file system, permission, a link loop).

    Not the user's input: exit 1, with the file and what the system said.
    """


class LockError(InputError):
    """lock/ is missing, unreadable, or disagrees with the recipe."""


class PatchFileError(InputError):
    """A patch file cannot be parsed or breaks a structural rule (path leaves the package)."""


class UsageError(InputError):
    """A command-line argument is wrong (unknown step, unknown build hash, ...)."""


class FetchError(Qwen38BuildError):
    """A source could not be fetched, or its bytes differ from the lock."""


class PatchFailed(Qwen38BuildError):
    """A patch does not apply at fuzz 0."""


class StoreError(Qwen38BuildError):
    """The store is inconsistent or an entry changed after it was written."""


class CacheError(Qwen38BuildError):
    """A binary cache is unreachable, too slow, or answered with an error or cut short."""


class UntrustedEntry(CacheError):
    """A cache entry failed a check (signature, digest, output hash); it is never used."""


class CheckFailed(Qwen38BuildError):
    """A check (verify, lint, lock --check, reproduce) found a difference."""


class KernelBuildError(Qwen38BuildError):
    """nvcc failed; the message names the arch, the file and the line of the first error."""


class LintFailed(CheckFailed):
    """The lint found broken rules; ``findings`` holds each one (its ``str()`` is a line).

    Bad input (exit 2): every finding names a file and a line of the series or the recipe,
    and nothing was applied or stored. The findings are listed where they are found (the
    build's stderr, the lint's stdout); the error itself is one line.
    """

    exit_code = ExitCode.BAD_INPUT

    def __init__(self, findings: Sequence[object], *, hint: str | None = None) -> None:
        self.findings = findings
        first = str(findings[0]) if findings else "no finding"
        more = f" (and {len(findings) - 1} more, listed above)" if len(findings) > 1 else ""
        super().__init__(
            f"{len(findings)} ledger rule(s) broken: {first}{more}",
            hint=hint or "each finding names the file, the line and the rule; fix the patch "
            "file's commit and re-export, then run qwen38build lint again",
        )


class TableStale(CheckFailed):
    """The ledger table differs from what the patch headers give; ``diff`` shows how."""

    def __init__(self, path: str, diff: str) -> None:
        self.path = path
        self.diff = diff
        super().__init__(
            f"{path}: the ledger table is not current with the patch headers:\n{diff}",
            hint="run qwen38build table to rewrite it, and commit the result",
        )


def one_line(exc: Qwen38BuildError) -> str:
    """The error as one line: ``FILE:PLACE: what is wrong; what to do``.

    A message of several lines keeps its first and says how many more there were; the hint
    joins after ``; ``. Bad input must fit one line on stderr, whatever the error class.
    """
    if isinstance(exc, RecipeError):
        text = exc.one_line()
    else:
        lines = [ln.strip() for ln in exc.message.splitlines() if ln.strip()]
        text = lines[0] if lines else type(exc).__name__
        if len(lines) > 1:
            text = text.rstrip(":") + f" (and {len(lines) - 1} more line(s); --json shows all)"
    text = text.rstrip()
    if exc.hint:
        text = text.rstrip(".") + "; " + " ".join(exc.hint.split())
    return text


def as_json(exc: Qwen38BuildError) -> dict[str, object]:
    """The whole error for ``--json``: class, message, hint, exit code, every problem."""
    out: dict[str, object] = {
        "error": type(exc).__name__, "message": exc.message, "hint": exc.hint,
        "exit_code": int(exc.exit_code),
    }
    if isinstance(exc, RecipeError):
        out["file"], out["problems"] = exc.path, exc.problems
    if isinstance(exc, LintFailed):
        out["problems"] = [str(f) for f in exc.findings]
    return out


def from_os_error(exc: OSError, what: str = "") -> Qwen38BuildError:
    """Translate an OSError into our hierarchy, naming its file and what to do.

    ``what`` says what was being done (``reading the lock``); the error number picks the
    hint. A missing or wrong-typed file is the user's input; the rest is the host's.
    """
    import errno

    where = exc.filename if exc.filename is not None else "(unknown file)"
    if exc.filename2 is not None:
        where = f"{where} -> {exc.filename2}"
    doing = f" while {what}" if what else ""
    reason = exc.strerror or str(exc)
    hints = {
        errno.ENOSPC: "free some space, or pass --store on a larger disk",
        errno.EDQUOT: "free some space, or pass --store on a larger disk",
        errno.EROFS: "the file system is read-only; pass --store DIR on a writable one",
        errno.EACCES: "check the file's permissions, or pass --store DIR you can write",
        errno.EPERM: "check the file's permissions, or pass --store DIR you can write",
        errno.ELOOP: "a symbolic link points (through others) back at itself; fix or remove it",
        errno.ENOENT: "check the path exists",
        errno.ENOTDIR: "a file stands where a folder is expected; move it away",
        errno.EISDIR: "a folder stands where a file is expected; move it away",
    }
    hint = hints.get(exc.errno or 0, "check the path and the disk")
    message = f"{where}: {reason}{doing}."
    if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.ELOOP):
        return InputError(message, hint=hint)
    return HostError(message, hint=hint)


class ToolError(Qwen38BuildError):
    """Another program (patch, nvcc, git, uv, pip, diff) is missing or could not be run."""
