"""Benchmark: how long uv takes to lock the stack's Python environment (lock/pylock.toml).

    .venv/bin/python bench/envlock.py [--runs 3] [--cold] [--json]

Times ``envlock.compute`` (read the pinned wheel's METADATA from the store, write the
requirements, ``uv pip compile --format pylock.toml``) on this repository's recipe, writing
nothing into lock/. ``warm`` runs share uv's cache; ``--cold`` adds one run with an empty
uv cache in a temp dir (every index page fetched again). Printed as medians and as a ratio
to the floor measured in the same run: ``uv --version`` (the process start of uv itself).
Needs the package index (network) and the pinned wheel in the store.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from qwen38build.engine.fetch import wheel_in_store  # noqa: E402
from qwen38build.inputs import lock, recipe  # noqa: E402
from qwen38build.inputs.lock import locked_vllm  # noqa: E402
from qwen38build.pinning import pylock as envlock  # noqa: E402
from qwen38build.pinning import uv as uvbin  # noqa: E402
from qwen38build.store.store import Store, default_root  # noqa: E402


def timed(fn: object) -> float:
    t0 = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cold", action="store_true", help="also one run with an empty uv cache")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    loaded = recipe.load(REPO / "recipe.toml")
    entry = locked_vllm(loaded, lock.read(loaded.root))
    wheel = wheel_in_store(loaded, Store(default_root()), entry)
    uv = uvbin.path()
    floor = statistics.median(
        timed(lambda: subprocess.run([uv, "--version"], capture_output=True, check=True))
        for _ in range(5))
    warm = statistics.median(timed(lambda: envlock.compute(loaded, entry, wheel))
                             for _ in range(args.runs))
    out: dict[str, float] = {"floor_uv_start_s": floor, "warm_lock_s": warm}
    if args.cold:
        with tempfile.TemporaryDirectory(prefix="q38-uvcache.") as cache:
            os.environ["UV_CACHE_DIR"] = cache
            out["cold_lock_s"] = timed(lambda: envlock.compute(loaded, entry, wheel))
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True))
    else:
        for k, v in out.items():
            print(f"{k:18} {v:8.3f} s  {v / floor:8.1f}x the floor")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
