"""The one place the library speaks: progress of a build, to stderr.

Plain lines when stderr is not a terminal or ``NO_COLOR`` is set; a rich status line with
colour otherwise. Results (hashes, paths, tables, JSON) go to stdout from the CLI.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from qwen38build.engine.step import Step


class Reporter:
    """Plain-line progress; the base of the rich one and a silent one."""

    def __init__(self, stream: TextIO | None = None, *, quiet: bool = False) -> None:
        self.stream = stream or sys.stderr
        self.quiet = quiet

    def line(self, text: str) -> None:
        if not self.quiet:
            print(text, file=self.stream, flush=True)

    def start(self, total: int) -> None:
        pass

    def step_start(self, step: Step, index: int, total: int) -> None:
        self.line(f"[{index}/{total}] {step.kind} {step.name} ({step.short}) ...")

    def note(self, step: Step, message: str) -> None:
        self.line(f"      {step.name}: {message}")

    def step_done(self, step: Step, index: int, total: int, *, built: bool, seconds: float) -> None:
        what = f"built in {seconds:.2f}s" if built else "cached"
        self.line(f"[{index}/{total}] {step.kind} {step.name} ({step.short}) {what}")

    def finish(self) -> None:
        pass


class RichReporter(Reporter):
    """Colour and a live status line for the step in progress."""

    def __init__(self) -> None:
        super().__init__()
        from rich.console import Console

        self.console = Console(stderr=True)
        self._status: Any = None

    def line(self, text: str) -> None:
        self.console.print(text, highlight=False)

    def step_start(self, step: Step, index: int, total: int) -> None:
        self._status = self.console.status(f"[{index}/{total}] {step.kind} {step.name} ...")
        self._status.start()

    def note(self, step: Step, message: str) -> None:
        if self._status is not None:
            self._status.update(f"{step.kind} {step.name}: {message}")
        else:
            super().note(step, message)

    def step_done(self, step: Step, index: int, total: int, *, built: bool, seconds: float) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None
        what = f"[green]built[/] in {seconds:.2f}s" if built else "[dim]cached[/]"
        self.console.print(f"[{index}/{total}] {step.kind} [bold]{step.name}[/] "
                           f"({step.short}) {what}", highlight=False)

    def finish(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None


def make_reporter(*, quiet: bool = False) -> Reporter:
    if quiet:
        return Reporter(quiet=True)
    if sys.stderr.isatty() and not os.environ.get("NO_COLOR"):
        return RichReporter()
    return Reporter()
