"""Benchmark: the real vLLM 0.32.0 → 0.33.0 bump (dry run) with both wheels in the store.

Usage: ``.venv/bin/python bench/bump.py [--runs 5] [--to 0.33.0] [--recipe recipe.toml]``

A warm-up run puts both wheels in the store (from ``$QWEN38BUILD_SOURCES``, or
/tmp/wh:/tmp/wh33 where they exist, else pip). Then, each the median of ``--runs``:

- floor: ``python -c pass`` through this interpreter;
- command: a fresh interpreter that loads the recipe and runs ``bump`` (what
  ``qwen38build bump vllm 0.33.0 --dry-run`` costs, start-up and imports included);
- in-process: ``bump()`` alone, imports already done.

Target: the command under 2 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

COMMAND = """
import sys
from pathlib import Path
from qwen38build import bump, recipe
from qwen38build.store import Store, default_root
r = bump.bump(recipe.load(Path(sys.argv[1])), Store(default_root()), sys.argv[2])
print(len(r.patches))
"""


def timed(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--to", default="0.33.0")
    ap.add_argument("--recipe", default=str(REPO / "recipe.toml"))
    args = ap.parse_args()
    env = dict(os.environ)
    if "QWEN38BUILD_SOURCES" not in env:
        found = [d for d in ("/tmp/wh", "/tmp/wh33") if Path(d).is_dir()]
        if found:
            env["QWEN38BUILD_SOURCES"] = os.pathsep.join(found)
    os.environ.update(env)

    from qwen38build import bump, recipe
    from qwen38build.store import Store, default_root

    loaded = recipe.load(Path(args.recipe))
    store = Store(default_root())
    warm = bump.bump(loaded, store, args.to)  # both wheels into the store
    floor = [timed([sys.executable, "-c", "pass"], env) for _ in range(args.runs)]
    command = [timed([sys.executable, "-c", COMMAND, args.recipe, args.to], env)
               for _ in range(args.runs)]
    inproc = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        bump.bump(loaded, store, args.to)
        inproc.append(time.perf_counter() - t0)
    f = statistics.median(floor)
    rows = [
        ("floor: python -c pass", f),
        ("command: load recipe + bump", statistics.median(command)),
        ("in-process: bump()", statistics.median(inproc)),
    ]
    counts: dict[str, int] = {}
    for p in warm.patches:
        counts[p.outcome] = counts.get(p.outcome, 0) + 1
    print(f"vllm {warm.old_version} -> {warm.new_version}, {len(warm.patches)} patches: "
          + ", ".join(f"{n} {k}" for k, n in counts.items()))
    print(f"median of {args.runs}, store {store.root}")
    print(f"| {'what':<30} | {'seconds':>8} | {'x floor':>8} |")
    print(f"|{'-' * 32}|{'-' * 10}|{'-' * 10}|")
    for name, secs in rows:
        print(f"| {name:<30} | {secs:8.3f} | {secs / f:8.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
