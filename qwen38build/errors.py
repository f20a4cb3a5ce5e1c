"""One exception hierarchy for the whole tool.

Every error's ``str()`` is a full sentence that names what is wrong and where (a file and
line, or a TOML key path). ``hint`` says what to do. Library code raises these; only the CLI
turns them into exit codes, through :class:`ExitCode`.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """What the process returns; one meaning each."""

    OK = 0
    FAILED = 1  # a build, a check or a comparison failed
    BAD_INPUT = 2  # the user's input or usage is wrong; nothing was touched


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
    """recipe.toml is unreadable or invalid; ``problems`` lists every one found."""

    def __init__(self, path: str, problems: list[str], *, hint: str | None = None) -> None:
        self.path = path
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        noun = "problem" if len(problems) == 1 else "problems"
        super().__init__(f"{path}: {len(problems)} {noun}:\n{lines}", hint=hint)


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
    """The lint found broken rules; ``findings`` holds each one (its ``str()`` is a line)."""

    def __init__(self, findings: list[object], *, hint: str | None = None) -> None:
        self.findings = findings
        noun = "rule is" if len(findings) == 1 else "rules are"
        lines = "\n".join(f"  {f}" for f in findings)
        super().__init__(
            f"{len(findings)} ledger {noun} broken:\n{lines}",
            hint=hint or "each line names the file, the line and the rule; fix the patch "
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
