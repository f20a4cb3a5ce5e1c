"""``build -j``: independent steps side by side, with the same answer as one at a time.

The stack's cubin steps (one per arch) depend only on the toolchain, so with ``-j 2`` they
overlap in time; the build hash and every output's bytes are the same as with ``-j 1``.
The number of jobs changes no answer, so the no-op takes ``-j`` too.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import Project
from tests.engine_fixtures import add_pthfa_sources


@pytest.fixture
def stack(project: Project) -> Project:
    add_pthfa_sources(project.root)
    recipe = project.root / "recipe.toml"
    recipe.write_text(recipe.read_text().replace('outputs = ["vllm"]',
                                                 'outputs = ["vllm", "pthfa"]'))
    return project


def _timed_compiles(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, float]]:
    """Every cubin compile's (start, end), each made to take at least 0.4 s."""
    from qwen38build.kernels.kernels import compile_arch as real

    spans: list[tuple[float, float]] = []
    lock = threading.Lock()

    def slow(*args: object, **kwargs: object) -> list[Path]:
        start = time.monotonic()
        time.sleep(0.4)
        out = real(*args, **kwargs)  # type: ignore[arg-type]
        with lock:
            spans.append((start, time.monotonic()))
        return out

    monkeypatch.setattr("qwen38build.steps.cubin.compile_arch", slow)
    return spans


def _outputs(p: Project, capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, str]:
    assert p.run("build", "--json", "-q", "--no-link", "--rebuild", *argv) == 0
    data = json.loads(capsys.readouterr().out)
    hashes = {k: hashlib.sha256(Path(v).read_bytes()).hexdigest()
              for k, v in data["outputs"].items()}
    return {"build": data["build"], **hashes}


def test_independent_steps_overlap_with_jobs_and_the_answer_is_the_same(
    stack: Project, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    spans = _timed_compiles(monkeypatch)
    parallel = _outputs(stack, capsys, "-j", "2")
    assert len(spans) == 2
    (_, a1), (b0, _) = sorted(spans)
    assert b0 < a1, "the two arches' compiles did not overlap with -j 2"
    spans.clear()
    stack.store = tmp_path / "second-store"  # built again from nothing, one at a time
    serial = _outputs(stack, capsys, "-j", "1")
    (_, a1), (b0, _) = sorted(spans)
    assert b0 >= a1, "with -j 1 the compiles overlapped"
    assert parallel == serial


@pytest.mark.parametrize("jobs", [["-j", "3"], ["-j3"], ["--jobs", "3"], ["--jobs=3"]])
def test_the_no_op_answers_whatever_the_number_of_jobs(
    project: Project, monkeypatch: pytest.MonkeyPatch, jobs: list[str]
) -> None:
    assert project.run("build", "--no-link", "-q") == 0

    def no_plan(*args: object, **kwargs: object) -> None:
        raise AssertionError("the full path ran")

    monkeypatch.setattr("qwen38build.engine.plan.make_plan", no_plan)
    assert project.run("build", "--no-link", "-q", *jobs) == 0


@pytest.mark.parametrize("jobs", [["-j", "0"], ["-j0"], ["--jobs=0"], ["-j", "many"]])
def test_a_bad_number_of_jobs_is_bad_input(
    project: Project, capsys: pytest.CaptureFixture[str], jobs: list[str]
) -> None:
    assert project.run("build", "--no-link", "-q") == 0
    assert project.run("build", "--no-link", "-q", *jobs) == 2
    assert capsys.readouterr().err.startswith("error: command line:")


def test_a_relative_store_path_builds_the_kernels(
        stack: Project, capsys: pytest.CaptureFixture[str]) -> None:
    """``--store rel``: the toolchain's nvcc runs from a scratch folder, where a path
    relative to the caller's folder would name nothing; the store is made absolute once."""
    from qwen38build.cli import main

    rc = main(["--recipe", str(stack.root / "recipe.toml"), "--store", "rel-store",
               "build", "--only", "pthfa", "--json", "-q", "--no-link"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    result = Path(json.loads(out.out)["result"])
    assert result.is_absolute() and result.is_relative_to(stack.root / "rel-store")
