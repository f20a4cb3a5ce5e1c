"""SIGKILL at random moments of real builds: the store stays sound and nothing is left over.

Three project copies share one store; each round rewrites a copy's patch (so every build
has real steps to run) and kills its build at a random moment across a build's duration.
Afterwards: ``store verify`` is clean, the next build gives the reference hash, and once it
has run no temp space, lock file or temporary root of the killed builds is left.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import ENVS, Project
from tests.engine_fixtures import write_patch

REPO = Path(__file__).resolve().parent.parent
KILLS = 36
WORKERS = 3


def _cmd(root: Path, store: Path, *argv: str) -> list[str]:
    return [sys.executable, "-m", "qwen38build", "--recipe", str(root / "recipe.toml"),
            "--store", str(store), *argv]


def _variant(root: Path, tmp: Path, n: int) -> None:
    write_patch(root, "patches", "knob",
                [("envs.py", ENVS, ENVS.replace("KNOB_7 = 7\n", f"KNOB_7 = {1000 + n}\n"))],
                tmp / "diffs" / str(n))


def test_thirty_six_sigkills_leave_a_sound_store_and_no_leftovers(project: Project) -> None:
    env = {**os.environ, "QWEN38BUILD_SOURCES": str(project.wheels)}
    store = project.tmp / "shared-store"
    reference = subprocess.run(_cmd(project.root, project.tmp / "ref", "build", "--json",
                                    "--no-link"), env=env, cwd=REPO, capture_output=True,
                               text=True, check=True)
    want = json.loads(reference.stdout)["build"]
    # how long a build takes here with its neighbours running (two cores may be shared)
    t0 = time.perf_counter()
    timing = [subprocess.Popen(_cmd(project.root, project.tmp / f"timing{k}", "build",
                                    "--no-link"), env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL) for k in range(WORKERS)]
    assert [p.wait() for p in timing] == [0] * WORKERS
    duration = time.perf_counter() - t0
    copies = []
    for k in range(WORKERS):
        dest = project.tmp / f"copy{k}"
        shutil.copytree(project.root, dest)
        copies.append(dest)
    rng = random.Random(20261130)
    killed = finished = 0
    n = 0
    while killed < KILLS:
        procs = []
        for root in copies:
            n += 1
            _variant(root, project.tmp, n)
            procs.append(subprocess.Popen(_cmd(root, store, "build", "-q"), env=env, cwd=REPO,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        deadline = time.perf_counter()
        for proc in procs:
            delay = rng.uniform(0.3, 1.05) * duration
            time.sleep(max(0.0, deadline + delay - time.perf_counter()))
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            _, err = proc.communicate()
            if proc.returncode == -signal.SIGKILL:
                killed += 1
            else:
                assert proc.returncode == 0, err.decode()
                finished += 1
    assert killed >= KILLS
    verify = subprocess.run(_cmd(project.root, store, "store", "verify"), env=env, cwd=REPO,
                            capture_output=True, text=True, check=False)
    # clean; output folders of writers killed between their two renames may be listed
    # as leftovers (no damage), which the next build removes
    assert verify.returncode == 0, verify.stdout
    assert all(line.startswith("leftover: ") for line in verify.stdout.splitlines()[:-1])
    after = subprocess.run(_cmd(project.root, store, "build", "--json"), env=env, cwd=REPO,
                           capture_output=True, text=True, check=True)
    assert json.loads(after.stdout)["build"] == want
    verify = subprocess.run(_cmd(project.root, store, "store", "verify"), env=env, cwd=REPO,
                            capture_output=True, text=True, check=False)
    assert verify.returncode == 0, verify.stdout
    for folder in ("tmp", "locks", "temproots"):
        assert not list((store / folder).iterdir()), folder
    leftovers = [p for p in store.rglob(".*.tmp")]
    leftovers += [p for c in copies for p in c.glob(".result.*")]
    assert leftovers == []
