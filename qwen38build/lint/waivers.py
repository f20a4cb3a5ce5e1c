"""Waivers: lint findings let through on the record, each with its reason.

A series published by someone else may break a rule that does not stop it from applying
(a stale ``index`` line, say); ``[[lint.waivers]]`` in the recipe lets such a finding
through by rule and patch (and, to single out one of several, a text its message
contains). The build prints every waived finding and keeps it in the build record. A
waiver that no longer matches any finding is itself a finding: waivers never outlive the
defect they excuse.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

from qwen38build.inputs.recipe import Waiver
from qwen38build.lint.finding import Context, Finding


@dataclass(frozen=True)
class Waived:
    """A finding a waiver let through."""

    finding: Finding
    reason: str

    def __str__(self) -> str:
        return f"{self.finding} (waived: {self.reason})"


def _matches(waiver: Waiver, finding: Finding) -> bool:
    return (finding.rule == waiver.rule and PurePosixPath(finding.file).stem == waiver.patch
            and waiver.contains in finding.message)


def apply(ctx: Context, findings: list[Finding], rules: tuple[str, ...] | None = None
          ) -> tuple[list[Finding], list[Waived]]:
    """(the findings no waiver covers, plus a finding per unused waiver; the waived ones).
    With ``rules``, only the waivers of those rules take part."""
    waivers = [w for w in ctx.recipe.lint.waivers if rules is None or w.rule in rules]
    used: set[int] = set()
    remaining: list[Finding] = []
    waived: list[Waived] = []
    for f in findings:
        hit = next((i for i, w in enumerate(waivers) if _matches(w, f)), None)
        if hit is None:
            remaining.append(f)
        else:
            used.add(hit)
            waived.append(Waived(f, waivers[hit].reason))
    for i, w in enumerate(waivers):
        if i not in used:
            what = f"{w.rule} in {w.patch}" + (f" containing {w.contains!r}" if w.contains else "")
            remaining.append(ctx.finding(
                ctx.loaded.path, ctx.recipe_line(f'"{w.patch}"'), "waivers",
                f"the waiver of {what} matches no finding.",
                "remove it from [lint] waivers: the defect it excused is gone",
            ))
    return remaining, waived
