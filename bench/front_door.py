"""Benchmark: the front door, ``./noxw -s build`` when nothing changed, online and offline.

    .venv/bin/python bench/front_door.py [--runs 5] [--json]

What the user types is ``./noxw -s build``; its second run must be a no-op end to end (the
launcher's venv reused, nox's own start, the session's venv reused, no install, the tool's
no-op). Measured in this checkout with the running interpreter, after one warm-up run that
may install:

  floor       ``python -c pass`` (the interpreter nox runs on)
  tool        ``.nox/build/bin/qwen38build build`` (the fast path alone)
  nox         ``.nox/.noxw/bin/python -m nox -s build`` again (nox alone, from the venv
              the launcher made)
  noxw        ``python noxw -s build`` again (the launcher, which then runs that nox)
  offline     ``noxw`` inside a new network namespace (``unshare -n``: no network at all),
              when this machine lets us make one; reported as skipped otherwise

Prints medians of ``--runs`` runs and each as a ratio to the floor.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return took


def median(cmd: list[str], runs: int) -> float:
    return statistics.median(timed(cmd) for _ in range(runs))


def can_unshare() -> bool:
    exe = shutil.which("unshare")
    return exe is not None and subprocess.run(
        [exe, "-n", "true"], capture_output=True, check=False).returncode == 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    noxw = [sys.executable, str(REPO / "noxw"), "-s", "build"]
    nox = [str(REPO / ".nox" / ".noxw" / "bin" / "python"), "-m", "nox", "-s", "build"]
    timed(noxw)  # warm-up: may create the venvs and install; not measured
    rows = {
        "floor": median([sys.executable, "-c", "pass"], args.runs),
        "tool": median([str(REPO / ".nox" / "build" / "bin" / "qwen38build"), "build"],
                       args.runs),
        "nox": median(nox, args.runs),
        "noxw": median(noxw, args.runs),
    }
    rows["offline"] = median(["unshare", "-n", *noxw], args.runs) if can_unshare() else None
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'what':10} {'median s':>9} {'x floor':>8}")
    for name, secs in rows.items():
        if secs is None:
            print(f"{name:10} {'skipped: unshare -n is not allowed here':>9}")
            continue
        print(f"{name:10} {secs:9.3f} {secs / rows['floor']:8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
