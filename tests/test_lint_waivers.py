"""Lint waivers: a finding let through on the record, never silently.

A waiver names the rule, the patch and the reason; the build then passes, prints the waived
finding on every build (the no-op's included) and keeps it in the build record. A waiver
that no longer matches a finding is itself a finding, and a waiver without a reason, or of
a rule that does not exist, is bad input.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import Project

WAIVER = """
[[lint.waivers]]
rule = "headers"
patch = "route-fix"
reason = "published upstream without an Upstream line; applies cleanly"
"""


def _drop_upstream_header(p: Project) -> None:
    path = p.root / "patches" / "route-fix.patch"
    path.write_text(path.read_text().replace("Upstream: none\n", "", 1))


def _waive(p: Project, text: str = WAIVER) -> None:
    recipe = p.root / "recipe.toml"
    recipe.write_text(recipe.read_text() + text)


def test_a_finding_stops_the_build_until_it_is_waived(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    _drop_upstream_header(project)
    assert project.run("build", "--no-link") == 2
    assert "[headers]" in capsys.readouterr().err
    _waive(project)
    assert project.run("build", "--no-link", "--json") == 0
    out = capsys.readouterr()
    said = [ln for ln in out.err.splitlines() if ln.startswith("lint: ")]
    assert len(said) == 1 and "route-fix.patch" in said[0]
    assert "(waived: published upstream without an Upstream line" in said[0]
    build = json.loads(out.out)["build"]
    record = json.loads((project.store / "builds" / f"{build}.json").read_text())
    assert record["waived"] == [s.removeprefix("lint: ") for s in said]
    # the no-op says it again
    assert project.run("build", "--no-link") == 0
    assert said[0] in capsys.readouterr().err


def test_the_lint_verb_shows_the_waived_finding_and_passes(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    _drop_upstream_header(project)
    _waive(project)
    assert project.run("lint") == 0
    out = capsys.readouterr().out
    assert out.startswith("waived: patches/route-fix.patch:") and "lint: clean" in out


def test_a_waiver_that_matches_nothing_is_a_finding(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    _waive(project)  # the header is there: nothing to waive
    assert project.run("build", "--no-link") == 2
    err = capsys.readouterr().err
    assert "[waivers] the waiver of headers in route-fix matches no finding" in err


def test_a_waiver_can_single_out_one_finding_by_its_text(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    _drop_upstream_header(project)
    _waive(project, WAIVER + 'contains = "no such words"\n')
    assert project.run("build", "--no-link") == 2
    err = capsys.readouterr().err
    assert "[headers]" in err and "matches no finding" in err


@pytest.mark.parametrize("bad", [
    WAIVER.replace('reason = "published upstream without an Upstream line; applies cleanly"',
                   'reason = "ok"'),
    WAIVER.replace('rule = "headers"', 'rule = "vibes"'),
    WAIVER.replace('patch = "route-fix"\n', ''),
])
def test_a_malformed_waiver_is_bad_input_and_touches_nothing(
    project: Project, capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    _waive(project, bad)
    assert project.run("build", "--no-link") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") <= 2 and "lint.waivers.0" in err
    assert not Path(project.store, "objects").exists()
