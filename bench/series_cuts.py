"""Proof, patch by patch, that each behaviour test tests its own patch.

    .venv/bin/python bench/series_cuts.py [-j 2] [TOPIC ...]

For every patch of the recipe's ``patches/`` group (or the named ones), the patched tests
of ``tests/patches/test_<topic>.py`` (those with ``patched`` in their name) run twice
against the vLLM files: once with the series cut just before the patch (pristine 0.32.0
plus every earlier patch, GNU patch at fuzz 0), where they must fail, and once with the
series through it, where they must pass. The pristine files come from the locked wheel in
the store (the project's build is run first, a store hit when nothing changed). Prints
one line per patch and exits 1 when any patch's test does not fail before it or does not
pass through it.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.patches.conftest import (  # noqa: E402
    PATCHED_TREE_ENV,
    PATCHES_DIR,
    SERIES,
    built_wheels,
)


@dataclass(frozen=True)
class Outcome:
    rc: int
    summary: str


@dataclass(frozen=True)
class Cut:
    topic: str
    before: Outcome
    through: Outcome

    @property
    def proven(self) -> bool:
        return self.before.rc == 1 and self.through.rc == 0


def _pristine_tree(dest: Path) -> Path:
    """The vLLM files the series and the tests read, from the locked pristine wheel."""
    _, pristine_wheel, members = built_wheels()
    with zipfile.ZipFile(pristine_wheel) as zf:
        names = set(zf.namelist())
        for member in sorted(members):
            if f"vllm/{member}" in names:
                zf.extract(f"vllm/{member}", dest)
    return dest / "vllm"


def _apply(tree: Path, topic: str) -> None:
    subprocess.run(
        ["patch", "-p1", "--fuzz", "0", "--forward", "--batch", "--quiet",
         "-i", str(PATCHES_DIR / f"{topic}.patch")],
        cwd=tree, check=True, capture_output=True,
    )


def _test_file(topic: str) -> Path:
    return REPO / "tests" / "patches" / f"test_{re.sub(r'[^0-9a-zA-Z]', '_', topic)}.py"


def _run_tests(topic: str, tree: Path) -> Outcome:
    env = {**os.environ, PATCHED_TREE_ENV: str(tree)}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-m", "", "-k", "patched",
         "-p", "no:cacheprovider", str(_test_file(topic))],
        cwd=REPO, env=env, capture_output=True, text=True, check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if re.search(r"\d+ (passed|failed)", ln)]
    summary = re.sub(r" in [0-9.]+s.*$", "", lines[-1].strip("= ")) if lines else "no result"
    return Outcome(proc.returncode, summary)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("topics", nargs="*", help="only these patches (default: all)")
    parser.add_argument("-j", "--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    unknown = sorted(set(args.topics) - set(SERIES))
    if unknown:
        parser.error(f"not in the recipe's patches/ group: {', '.join(unknown)}")
    wanted = [t for t in SERIES if not args.topics or t in args.topics]
    missing = [t for t in wanted if not _test_file(t).exists()]
    if missing:
        print(f"no behaviour test for: {', '.join(missing)}")
        return 1

    with tempfile.TemporaryDirectory(prefix="qwen38-cuts-") as tmp:
        root = Path(tmp)
        running = _pristine_tree(root / "pristine")
        jobs: list[tuple[str, Path, Path]] = []
        for i, topic in enumerate(SERIES):
            before = root / f"{i:02d}-before-{topic}"
            shutil.copytree(running, before)
            _apply(running, topic)
            if topic in wanted:
                through = root / f"{i:02d}-through-{topic}"
                shutil.copytree(running, through)
                jobs.append((topic, before, through))
            else:
                shutil.rmtree(before)
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            befores = [pool.submit(_run_tests, t, b) for t, b, _ in jobs]
            throughs = [pool.submit(_run_tests, t, th) for t, _, th in jobs]
            cuts = [Cut(t, b.result(), th.result())
                    for (t, _, _), b, th in zip(jobs, befores, throughs, strict=True)]

    width = max(len(c.topic) for c in cuts)
    for cut in cuts:
        verdict = "ok" if cut.proven else "NOT PROVEN"
        print(f"{cut.topic:<{width}}  before: {cut.before.summary:<24}  "
              f"through: {cut.through.summary:<24}  {verdict}")
    proven = sum(c.proven for c in cuts)
    print(f"{proven} of {len(cuts)} patches: the test fails before the patch and passes "
          "through it")
    return 0 if proven == len(cuts) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
