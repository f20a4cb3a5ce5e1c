"""Benchmark: substituting from a binary cache (a local nginx) against building, and against
a plain ``curl`` of the same bytes from the same server.

    .venv/bin/python bench/cache.py [--runs 5] [--kernel-runs 1] [--json] [--nvcc-bin DIR]

In one run, on the repository's recipe, with nginx (Debian's, PUT through its DAV module)
on 127.0.0.1 serving a temp folder:

  wheel built        ``qwen38build build --rebuild --no-link`` into a fresh store, the pinned
                     vLLM wheel reachable through QWEN38BUILD_SOURCES (a local copy, no index)
  wheel substituted  the same into a fresh store with only the cache: fetch, patch and wheel
                     steps all substituted (two ~330 MB wheels and the patched tree)
  wheel step only    ``Substituters.substitute`` of the patched wheel's step alone into a
                     fresh store, in process: record GET, signature, download, sha256 while
                     writing, fsync, commit
  curl               ``curl -s -o FILE`` of that same patched wheel from the same nginx (the
                     floor the wheel step is judged against: target at most 1.5x)
  kernels built      ``qwen38build kernels`` (every recipe arch, and the pthfa wheel) into a
                     fresh store with nvcc (``--nvcc-bin`` or PATH); skipped without nvcc
  kernels subst.     the same from the cache (target: at most 2 s)

Every timing is a median of its runs; each run starts from an empty store. The tool runs
through this venv's console script, so process start and imports are included where a user
would pay them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from qwen38build.cache import config as cacheconfig  # noqa: E402
from qwen38build.cache.signing import SecretKey  # noqa: E402
from qwen38build.cache.substituter import Substituters  # noqa: E402
from qwen38build.engine.report import Reporter  # noqa: E402
from qwen38build.files import remove_tree  # noqa: E402
from qwen38build.store import record  # noqa: E402
from qwen38build.store.store import Store, default_root  # noqa: E402
from tests.cache_fixtures import nginx  # noqa: E402

TOOL = str(Path(sys.executable).with_name("qwen38build"))


def tool(env: dict[str, str], *argv: str) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run([TOOL, "--recipe", str(REPO / "recipe.toml"), *argv], env=env,
                          capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr}")
    return seconds, proc.stdout


def fetched_wheel_dir() -> Path:
    """The folder of the pinned vLLM wheel in the default store (the e2e tests' copy)."""
    lock = json.loads((REPO / "lock" / "sources.json").read_text())
    filename = next(s["filename"] for s in lock["sources"] if s["name"] == "vllm")
    for meta in sorted((default_root() / "objects").glob("*.json")):
        if filename in json.loads(meta.read_text()).get("outputs", {}):
            return meta.with_suffix("")
    raise SystemExit(f"{filename} is not in the default store; run a build once first")


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--kernel-runs", type=int, default=1, help="runs of the nvcc build")
    ap.add_argument("--nvcc-bin", help="a folder holding nvcc (else PATH)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="q38-bench-cache."))
    try:
        return run(args, tmp)
    finally:
        remove_tree(tmp)


def run(args: argparse.Namespace, tmp: Path) -> int:
    key = SecretKey.generate("q38-bench-1")
    key_file = tmp / "bench.sec"
    key_file.write_text(f"{key}\n")
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("QWEN38BUILD_") and k != "NO_COLOR"}
    base["QWEN38BUILD_CONFIG"] = str(tmp / "no-config.toml")
    if args.nvcc_bin:
        base["PATH"] = f"{Path(args.nvcc_bin).resolve()}{os.pathsep}{base['PATH']}"
    local = {**base, "QWEN38BUILD_SOURCES": str(fetched_wheel_dir())}
    times: dict[str, list[float]] = {}

    def fresh(name: str) -> Path:
        p = tmp / name
        if p.exists():
            remove_tree(p)
        return p

    with nginx(tmp / "cache", tmp / "nginx") as url:
        remote = {**base, "QWEN38BUILD_SOURCES": str(tmp / "nothing"),
                  "QWEN38BUILD_SUBSTITUTERS": url,
                  "QWEN38BUILD_TRUSTED_PUBLIC_KEYS": str(key.public())}
        store_a = tmp / "store-a"
        _, out = tool(local, "--store", str(store_a), "build", "--no-link", "--json", "-q")
        build = json.loads(out)
        tool(local, "--store", str(store_a), "push", url, build["build"], "--key", str(key_file))
        steps = record.steps_from_record(record.read_build(Store(store_a), build["build"]))
        top = steps[-1]
        wheel_name = Path(build["wheel"]).name
        wheel_size = Path(build["wheel"]).stat().st_size
        subs_cfg = cacheconfig.load(env=remote)
        for _ in range(args.runs):
            s = fresh("store-built")
            times.setdefault("wheel built", []).append(
                tool(local, "--store", str(s), "build", "--rebuild", "--no-link", "-q")[0])
            s = fresh("store-subst")
            times.setdefault("wheel substituted", []).append(
                tool(remote, "--store", str(s), "build", "--rebuild", "--no-link", "-q")[0])
            s = fresh("store-step")
            t0 = time.perf_counter()
            entry = Substituters(subs_cfg).substitute(top, Store(s), Reporter(quiet=True))
            times.setdefault("wheel step only", []).append(time.perf_counter() - t0)
            assert entry is not None, "the wheel step was not substituted"
            dest = tmp / "curl.whl"
            dest.unlink(missing_ok=True)
            t0 = time.perf_counter()
            subprocess.run(["curl", "-sfS", "-o", str(dest), f"{url}/{top.digest}/{wheel_name}"],
                           check=True)
            times.setdefault("curl", []).append(time.perf_counter() - t0)
            assert dest.stat().st_size == wheel_size
        kernels = shutil.which("nvcc", path=base["PATH"]) is not None
        if kernels:
            for i in range(args.kernel_runs):
                s = fresh("store-kbuilt")
                seconds, out = tool(base, "--store", str(s), "kernels", "--json", "-q")
                times.setdefault("kernels built", []).append(seconds)
                if i == 0:
                    kb = json.loads(out)["build"]
                    tool(base, "--store", str(s), "push", url, kb, "--key", str(key_file))
            for _ in range(args.runs):
                s = fresh("store-ksubst")
                times.setdefault("kernels substituted", []).append(
                    tool(remote, "--store", str(s), "kernels", "--json", "-q")[0])
    report(times, wheel_size, kernels, as_json=args.json)
    return 0


def report(times: dict[str, list[float]], wheel_size: int, kernels: bool, *,
           as_json: bool) -> None:
    med = {k: median(v) for k, v in times.items()}
    ratios = {"wheel substituted": ("wheel built", med["wheel substituted"] / med["wheel built"]),
              "wheel step only": ("curl", med["wheel step only"] / med["curl"])}
    if kernels:
        ratios["kernels substituted"] = (
            "kernels built", med["kernels substituted"] / med["kernels built"])
    if as_json:
        out: dict[str, Any] = {"median_s": med, "samples": times, "ratios": {
            k: {"against": a, "ratio": r} for k, (a, r) in ratios.items()},
            "wheel_bytes": wheel_size}
        print(json.dumps(out, indent=2))
        return
    print(f"patched wheel: {wheel_size / 2**20:.0f} MiB; medians of "
          f"{len(times['curl'])} runs")
    print("| what | median s | ratio | against |\n|---|---:|---:|---|")
    for k in ("wheel built", "wheel substituted", "curl", "wheel step only",
              "kernels built", "kernels substituted"):
        if k in med:
            r = ratios.get(k)
            print(f"| {k} | {med[k]:.3f} | {f'{r[1]:.3g}x' if r else ''} | "
                  f"{r[0] if r else ''} |")
    if not kernels:
        print("kernels: skipped, no nvcc (give --nvcc-bin DIR)")


if __name__ == "__main__":
    raise SystemExit(main())
