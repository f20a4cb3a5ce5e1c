"""The table of commands: name, help, the function that runs it, and its arguments.

Each row's function is named as ``module:function`` and imported only when that command
runs, and only the named command's sub-parser is built (building all twenty costs more
than most commands' own work). ``qwen38build --help`` builds them all.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from qwen38build.errors import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable
    from typing import Any

DESCRIPTION = """\
Build a patched vLLM stack from recipe.toml and lock/, cached by input digest in a
content-addressed store. Exit codes: 0 ok, 1 a build or check failed, 2 bad input."""

# Global options that take a value, and the flag among them that takes none.
_VALUED = ("--recipe", "--store", "--substituter", "--trusted-public-key")
_FLAGS = ("--offline",)


@dataclass(frozen=True)
class Command:
    """One verb: what ``--help`` says, where its function lives, how its arguments look."""

    name: str
    help: str
    target: str | None  # "module:function" under qwen38build.cli; None for a verb group
    arguments: Callable[[Any], None] | None = None
    json: bool = False
    sub: tuple[Command, ...] = ()

    def function(self) -> Callable[[argparse.Namespace], int]:
        import importlib

        assert self.target is not None
        module, func = self.target.split(":")
        found: Callable[[argparse.Namespace], int] = getattr(
            importlib.import_module(f"qwen38build.cli.{module}"), func)
        return found


def _quiet(p: Any) -> None:
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")


def _system_nvcc(p: Any) -> None:
    p.add_argument("--system-nvcc", action="store_true", help="compile the kernels with the "
                   "nvcc on PATH instead of the locked toolchain (also QWEN38BUILD_NVCC=system); "
                   "the digests record that nvcc's identity")


def _jobs(p: Any, what: str) -> None:
    p.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1,
                   help=f"{what} at once (default: the number of cores)")


def _with(p: Any) -> None:
    p.add_argument("--with", action="append", dest="with_", metavar="GROUP",
                   help="add this optional series group (e.g. kvarn; repeatable or "
                   "comma-separated); the build hash says which groups were built")


def _plan(p: Any) -> None:
    _system_nvcc(p)
    _with(p)


def _build(p: Any) -> None:
    _jobs(p, "steps built")
    _with(p)
    p.add_argument("--only", action="append", metavar="OUTPUT",
                   help="build only these outputs: vllm, pthfa, fa2, pylock, vllm-py "
                   "(repeatable or comma-separated; default: the recipe's [build] outputs)")
    _system_nvcc(p)
    p.add_argument("--no-link", action="store_true", help="do not (re)point ./result")
    p.add_argument("--rebuild", action="store_true", help="skip the no-op fast path")
    _quiet(p)


def _step(p: Any) -> None:
    p.add_argument("step", help="a step's kind, name, or 6+ digest characters")


def _reproduce(p: Any) -> None:
    p.add_argument("build_hash")
    p.add_argument("--keep", action="store_true", help="keep the temporary store")
    _quiet(p)


def _lock(p: Any) -> None:
    p.add_argument("--check", action="store_true", help="fail if the lock is stale")


def _env(p: Any) -> None:
    p.add_argument("dir", help="where to make it")
    p.add_argument("--python", help="interpreter (path or version; default: the recipe's)")
    p.add_argument("--offline", action="store_true", help="no network: the store and uv's "
                   "cache must hold everything (also UV_OFFLINE=1)")


def _tree(p: Any) -> None:
    p.add_argument("path", help="site-packages, or a directory holding vllm/")
    p.add_argument("--build", help="build hash (default: ./result, else the last build)")


def _verify(p: Any) -> None:
    _tree(p)
    p.add_argument("--full", action="store_true", help="hash every file, not only the "
                   "patched ones")


def _workspace_create(p: Any) -> None:
    p.add_argument("dir", nargs="?", help="where (default: ./workspace)")


def _workspace_continue(p: Any) -> None:
    p.add_argument("dir", help="the workspace whose carry stopped (bump --rebase DIR)")
    p.add_argument("--skip", action="store_true", help="leave the stopped topic for later "
                   "(git's cherry-pick --skip; export then names it)")


def _export(p: Any) -> None:
    p.add_argument("dir", nargs="?", help="the workspace (default: ./workspace)")
    p.add_argument("topics", nargs="*", help="only these topics")
    p.add_argument("--check", action="store_true", help="fail when a file and its commit "
                   "disagree; write nothing")


def _suppress() -> str:
    """argparse's SUPPRESS: a sub-command's copy of a global flag must not reset it."""
    import argparse

    return argparse.SUPPRESS


def _bump(p: Any) -> None:
    p.add_argument("package", help="what to bump: vllm, or a [sources.*] tree's name "
                   "(flash-attention)")
    p.add_argument("version", help="the new version (0.33.0), or a source's new commit")
    p.add_argument("--dry-run", action="store_true", help="report only; leave recipe and lock")
    p.add_argument("--rebase", metavar="DIR", help="carry the workspace onto the new pin")
    p.add_argument("--retire", action="store_true", help="retire the (likely) upstreamed "
                   "patches: series.retired, files deleted, prose kept in PATCHES.md")
    p.add_argument("--report", metavar="FILE", help="where to write the whole report "
                   "(Markdown; default: ~/.cache/qwen38build/reports/bump-OLD-NEW.md)")
    p.add_argument("--offline", action="store_true", default=_suppress(),
                   help="never touch the network: the new wheel must be in the store or "
                   "$QWEN38BUILD_SOURCES, and the environment is not re-locked (also "
                   "QWEN38BUILD_OFFLINE=1; same as the global --offline)")


def _retire(p: Any) -> None:
    p.add_argument("topics", nargs="+", metavar="TOPIC", help="the series rows to retire")
    p.add_argument("--why", required=True, help="the evidence that upstream carries it, for "
                   "PATCHES.md (e.g. the upstream diff of the bump report that does the same)")


def _kernels(p: Any) -> None:
    p.add_argument("--arch", action="append", help="only this arch (repeatable; e.g. 9.0)")
    _jobs(p, "arches compiled")
    _quiet(p)
    _system_nvcc(p)
    p.add_argument("--fa2", action="store_true", help="also build FA2's fp8-KV library for "
                   "these arches and its wheel (needs the locked FA2 and CUTLASS trees)")
    p.add_argument("-o", "--out", metavar="DIR", help="also copy the cubins and the wheel "
                   "into DIR (for CI artifacts)")


def _gc(p: Any) -> None:
    p.add_argument("--dry-run", action="store_true", help="say what would go; remove nothing")


def _push(p: Any) -> None:
    p.add_argument("url", help="the cache: http(s)://HOST[:PORT]/PREFIX (GET, HEAD, PUT)")
    p.add_argument("build", nargs="*", help="build hashes (default: ./result and the last "
                   "kernels build of this recipe)")
    p.add_argument("--key", metavar="FILE", help="the ed25519 secret key file that signs")
    _quiet(p)


def _keygen(p: Any) -> None:
    p.add_argument("name", help="the key's name, e.g. q38-ci-1 (signatures carry it)")
    p.add_argument("--dir", help="where to write the two files (default: the user config "
                   "dir, ~/.config/qwen38build or $XDG_CONFIG_HOME/qwen38build)")


def _table(p: Any) -> None:
    p.add_argument("--check", action="store_true", help="fail with a diff when stale")


COMMANDS: tuple[Command, ...] = (
    Command("build", "build the stack: the patched vLLM wheel, the pthfa wheel for every "
            "arch, the checked environment lock (cache hits do no work)",
            "build:cmd_build", _build, json=True),
    Command("plan", "list the steps, their digests and whether each is built",
            "inspect:cmd_plan", _plan, json=True),
    Command("show", "print a step's whole derivation", "inspect:cmd_show", _step),
    Command("why", "say which inputs changed since the last build of a step",
            "inspect:cmd_why", _step),
    Command("reproduce", "rebuild a build's closure in an empty store and compare",
            "environment:cmd_reproduce", _reproduce, json=True),
    Command("lock", "pin every external input by sha256 into lock/", "environment:cmd_lock",
            _lock),
    Command("env", "make a virtual environment of the stack from the locks and the store, "
            "with uv", "environment:cmd_env", _env, json=True),
    Command("verify", "check a tree holds exactly a build's bytes", "installed:cmd_verify",
            _verify, json=True),
    Command("apply", "write a build's files into an installed vLLM", "installed:cmd_apply",
            _tree),
    Command("workspace", "a git workspace of the series: one commit per topic", None, sub=(
        Command("create", "pristine pin (tagged) plus one commit per topic",
                "series:cmd_workspace_create", _workspace_create),
        Command("continue", "go on with a stopped carry onto a new pin (after resolving its "
                "conflicts), saying at the next stop what to do", "series:cmd_workspace_continue",
                _workspace_continue))),
    Command("export", "regenerate patch files from the workspace's commits",
            "series:cmd_export", _export),
    Command("bump", "move the pin and report, per patch, what the new pin means",
            "series:cmd_bump", _bump, json=True),
    Command("retire", "retire topics the pin now carries: series.retired, files deleted, "
            "prose kept in PATCHES.md", "series:cmd_retire", _retire),
    Command("kernels", "compile pthfa per CUDA arch and pack its wheel", "kernels:cmd_kernels",
            _kernels, json=True),
    Command("ci", "continuous-integration helpers", None, sub=(
        Command("matrix", "GitHub Actions matrix, one entry per CUDA arch",
                "inspect:cmd_ci_matrix"),)),
    Command("gc", "remove store entries no root reaches; say what, and the bytes freed",
            "store:cmd_gc", _gc, json=True),
    Command("store", "store maintenance", None, sub=(
        Command("verify", "re-hash every entry; name any that changed",
                "store:cmd_store_verify", json=True),)),
    Command("push", "upload builds' closures to a binary cache, signed", "cache:cmd_push",
            _push, json=True),
    Command("cache", "binary cache helpers", None, sub=(
        Command("keygen", "make an ed25519 key pair NAME.sec and NAME.pub",
                "cache:cmd_cache_keygen", _keygen),)),
    Command("lint", "check the series against the ledger's rules", "series:cmd_lint"),
    Command("table", "write PATCHES.md's table from the patch headers", "series:cmd_table",
            _table),
)
NAMES = tuple(c.name for c in COMMANDS)


def command_of(argv: list[str]) -> str | None:
    """The sub-command ``argv`` names, past the global options; None if unsure."""
    i = 0
    while i < len(argv) and argv[i] in (*_VALUED, *_FLAGS):
        i += 1 if argv[i] in _FLAGS else 2
    return argv[i] if i < len(argv) and not argv[i].startswith("-") else None


def _add(sub: Any, command: Command) -> None:
    sp = sub.add_parser(command.name, help=command.help, description=command.help)
    if command.target is not None:
        sp.set_defaults(func=_Lazy(command))
    if command.json:
        sp.add_argument("--json", action="store_true", help="machine-readable output")
    if command.arguments is not None:
        command.arguments(sp)
    if command.sub:
        inner = sp.add_subparsers(dest=f"{command.name}_command", required=True,
                                  metavar="WHAT")
        for child in command.sub:
            _add(inner, child)


class _Lazy:
    """A command's function, imported when called (argparse keeps it as the default)."""

    def __init__(self, command: Command) -> None:
        self.command = command

    def __call__(self, args: argparse.Namespace) -> int:
        return self.command.function()(args)


def parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``only``, that command's sub-parser alone is built."""
    import argparse

    class Parser(argparse.ArgumentParser):
        """argparse, but a usage mistake is a UsageError: one line, exit 2, via main."""

        def error(self, message: str) -> Any:
            raise UsageError(f"command line: {message}.",
                             hint=f"run `{self.prog} --help` for the usage")

    class Version(argparse.Action):
        """``--version``: computed only when asked (it hashes the package's source)."""

        def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
            super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                             nargs=0, help=kwargs.get("help"))

        def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                     values: Any, option_string: str | None = None) -> None:
            from qwen38build.cli.version import version_line

            print(version_line())
            parser.exit(0)

    p = Parser(prog="qwen38build", description=DESCRIPTION,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action=Version, help="print the version and the "
                   "implementation digest (sha256 of the package's source) and exit")
    p.add_argument("--recipe", default="recipe.toml", help="the recipe (default: ./recipe.toml)")
    p.add_argument("--store", help="store directory (default: $QWEN38BUILD_STORE or the user "
                   "cache dir)")
    p.add_argument("--offline", action="store_true", help="ask no binary cache; never touch "
                   "the network for one")
    p.add_argument("--substituter", action="append", metavar="URL", help="a binary cache to "
                   "substitute from (repeatable; replaces the configured ones)")
    p.add_argument("--trusted-public-key", action="append", metavar="NAME:KEY",
                   help="a key whose signatures are trusted (repeatable; replaces the "
                   "configured ones)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        if only is None or command.name == only:
            _add(sub, command)
    return p


def parse(argv: list[str]) -> argparse.Namespace:
    """``argv`` parsed, building only the sub-parser of the command it names."""
    command = command_of(argv)
    if command is None and "--version" in argv:
        return parser("--version").parse_args(argv)  # no sub-parser needed to answer it
    return parser(command if command in NAMES else None).parse_args(argv)
