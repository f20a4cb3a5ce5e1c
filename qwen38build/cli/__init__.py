"""The command line: ``main(argv) -> int``, the one error boundary.

``main`` never raises for a user's mistake: a Qwen38BuildError becomes ``error: ...`` (and
``hint: ...``) on stderr and its exit code, and a foreign error that got past its seam is
translated here. The commands are a table (:mod:`qwen38build.cli.commands`) of small
functions, one module per verb family; heavy imports stay inside them so that a no-op
``build`` answers from the fast path in a few milliseconds.
"""

from __future__ import annotations

import os
import sys

from qwen38build.errors import ExitCode, Qwen38BuildError


def main(argv: list[str] | None = None) -> int:
    """The one error boundary: every error becomes one ``error:`` line and an exit code.

    Our errors carry their own exit code; a foreign one that got past its seam is
    translated here (an OSError names its file), and anything else is reported as an
    internal error in one line. No traceback reaches a user.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        return _run(argv)
    except Qwen38BuildError as exc:
        return _fail(exc, argv)
    except BrokenPipeError:
        # `qwen38build plan --json | head -1`: the reader left; say nothing more.
        _quiet_stdout()
        return int(ExitCode.BROKEN_PIPE)
    except KeyboardInterrupt:
        print("error: interrupted; the store is unchanged by the unfinished step",
              file=sys.stderr)
        return 130
    except Exception as exc:  # the last-resort net
        return _fail(_translate(exc), argv)


def _run(argv: list[str]) -> int:
    from qwen38build.engine.fastpath import try_noop

    done = try_noop(argv)
    if done is not None:
        return done
    from qwen38build.cli.commands import parse
    from qwen38build.cli.stages import check_args

    args = parse(argv)
    check_args(args)
    if not args.offline:
        return int(args.func(args))
    # For the whole command, a fetch step must not reach the index either; put back after,
    # so an in-process caller (a test, a script) is not left offline.
    before = os.environ.get("QWEN38BUILD_OFFLINE")
    os.environ["QWEN38BUILD_OFFLINE"] = "1"
    try:
        return int(args.func(args))
    finally:
        if before is None:
            del os.environ["QWEN38BUILD_OFFLINE"]
        else:
            os.environ["QWEN38BUILD_OFFLINE"] = before


def _fail(exc: Qwen38BuildError, argv: list[str]) -> int:
    from qwen38build.errors import as_json, one_line

    if "--json" in argv:
        import json

        line = json.dumps(as_json(exc), sort_keys=True)
    elif exc.exit_code == ExitCode.BAD_INPUT or "\n" not in exc.message:
        line = "error: " + one_line(exc)  # bad input: exactly one line
    else:  # a failed build or check: its details (hunk, file, line) are the point
        line = f"error: {exc}" + (f"\nhint: {exc.hint}" if exc.hint else "")
    import contextlib

    with contextlib.suppress(OSError):
        print(line, file=sys.stderr)
    return int(exc.exit_code)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush cannot complain."""
    import contextlib

    with contextlib.suppress(OSError, ValueError, AttributeError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _translate(exc: Exception) -> Qwen38BuildError:
    """A foreign error that escaped its seam, as one of ours (never a traceback)."""
    import json
    import subprocess
    import zipfile

    from qwen38build.cli.stages import STORES
    from qwen38build.errors import InputError, from_os_error

    if isinstance(exc, OSError):
        if exc.filename is None and STORES:
            exc.filename = STORES[-1]
            return from_os_error(exc, "writing to the store")
        return from_os_error(exc)
    if isinstance(exc, json.JSONDecodeError):
        return InputError(f"(a JSON file):{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}.",
                          hint="run again with the file fixed or removed")
    if isinstance(exc, zipfile.BadZipFile):
        return InputError(f"(a zip file): {exc}.", hint="fetch or re-pin the wheel")
    if isinstance(exc, subprocess.SubprocessError):
        return Qwen38BuildError(f"a subprocess failed: {exc}.")
    if type(exc).__name__ == "ValidationError":  # pydantic's, not imported here for speed
        return InputError(f"invalid data: {' '.join(str(exc).split())}.")
    return Qwen38BuildError(
        f"internal error: {type(exc).__name__}: {' '.join(str(exc).split())}.",
        hint="this is a bug in qwen38build; please report it with the command line",
    )
