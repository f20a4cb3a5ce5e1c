"""8 builds and 8 no-op builds at once, with two gc processes running alongside.

Two projects share one store: ``old`` was built before (its 8 builds are no-ops answered by
the fast path), ``new`` has a changed patch (its 8 builds race to run the same steps). An
unrooted earlier build gives gc something to remove. Expected: every process exits 0, each
step of ``new`` is built by exactly one process, both ``result`` links point at complete
entries, and ``store verify`` is clean.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import ENVS, Project
from tests.engine_fixtures import write_patch

REPO = Path(__file__).resolve().parent.parent
GC_LOOP = """
import os, sys
from qwen38build.cli import main
runs = 0
while runs < 2 or not os.path.exists(sys.argv[2]):  # until every build has finished
    if main(["--store", sys.argv[1], "gc"]) != 0:
        sys.exit(1)
    runs += 1
"""


def _cmd(root: Path, store: Path, *argv: str) -> list[str]:
    return [sys.executable, "-m", "qwen38build", "--recipe", str(root / "recipe.toml"),
            "--store", str(store), *argv]


def test_eight_builds_eight_noops_and_two_gcs_at_once(project: Project) -> None:
    env = {**os.environ, "QWEN38BUILD_SOURCES": str(project.wheels), "NO_COLOR": "1"}
    store = project.tmp / "store"
    old = project.root

    def run(*argv: str, root: Path = old) -> subprocess.CompletedProcess[str]:
        return subprocess.run(_cmd(root, store, *argv), env=env, cwd=REPO,
                              capture_output=True, text=True, check=True)

    # garbage for gc: a build nothing roots any more
    write_patch(old, "patches", "knob",
                [("envs.py", ENVS, ENVS.replace("KNOB_7 = 7\n", "KNOB_7 = 71\n"))],
                project.tmp / "g")
    garbage = json.loads(run("build", "--json", "--no-link").stdout)["build"]
    shutil.rmtree(store / "roots")
    project.patch("knob", "envs.py", ENVS, ENVS.replace("KNOB_7 = 7\n", "KNOB_7 = 70\n"))
    built_old = json.loads(run("build", "--json").stdout)["build"]
    new = project.tmp / "new"
    shutil.copytree(old, new, ignore=shutil.ignore_patterns("result"))
    write_patch(new, "patches", "knob",
                [("envs.py", ENVS, ENVS.replace("KNOB_7 = 7\n", "KNOB_7 = 77\n"))],
                project.tmp / "n")

    stop = project.tmp / "builds-done"
    gcs = [subprocess.Popen([sys.executable, "-c", GC_LOOP, str(store), str(stop)], env=env,
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for _ in range(2)]
    procs = [subprocess.Popen(_cmd(new, store, "build", "--json"), env=env, cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(8)]
    procs += [subprocess.Popen(_cmd(old, store, "build", "--json"), env=env, cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for _ in range(8)]
    results = [(p, *p.communicate()) for p in procs]
    stop.touch()
    results += [(p, *p.communicate()) for p in gcs]
    failures = [(p.args, out, err) for p, out, err in results if p.returncode != 0]
    assert failures == []
    hashes = [json.loads(out)["build"] for _, out, _ in results[:16]]
    built_new = hashes[0]
    assert set(hashes[:8]) == {built_new} and set(hashes[8:]) == {built_old}

    built: dict[str, int] = {}
    for _, _, err in results[:16]:
        for short in re.findall(r"\(([0-9a-f]{12})\) built in", err):
            built[short] = built.get(short, 0) + 1
    twice = {s for s, n in built.items() if n > 1}
    assert built and not twice, "\n".join(  # which process built what, and why, if not once
        [str(built)] + [err for _, _, err in results[:16] if any(s in err for s in twice)]
        + [f"gc: {out} {err}" for _, out, err in results[16:]])
    assert any(built_new.startswith(s) for s in built)

    for root, want in ((new, built_new), (old, built_old)):
        link = root / "result"
        assert os.readlink(link).endswith(want) and (link / "manifest.json").is_file()
    verify = subprocess.run(_cmd(old, store, "store", "verify"), env=env, cwd=REPO,
                            capture_output=True, text=True, check=False)
    assert verify.returncode == 0, verify.stdout
    assert not (store / "objects" / f"{garbage}.json").exists()  # gc did run and collect
    assert sum(out.count("removed ") for _, out, _ in results[16:]) >= 1
