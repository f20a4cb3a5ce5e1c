"""The GPU twin of series_cuts.py: each GPU test fails with the series cut before its patch
and passes through it, on a GPU machine that has neither the store nor vLLM's compiled ops.

    # where the store is (the engine builds the recipe; a store hit when nothing changed):
    qwen38build build --only vllm-py                  # result/vllm-py-trees.zip
    .venv/bin/python bench/gpu_series_cuts.py pack DIR [TOPIC ...]
    # on the GPU machine, DIR and result/vllm-py-trees.zip carried there:
    python bench/gpu_series_cuts.py run DIR [--trees ZIP] [--results RESULTS] [-- PYTEST ARGS]

``pack`` writes, per named topic, an overlay zip of the files the series touched up to that
point, as the series leaves them (GNU patch at fuzz 0, as the build applies them):
``before-TOPIC.zip`` and ``through-TOPIC.zip`` (about 0.6 MB each), and ``pack.json`` naming
the pristine wheel they are cut against. ``run`` takes the pristine tree from the recipe's
``vllm-py`` zip (refused when it names another pristine wheel), lays each cut out as a folder
(pristine + overlay; a file the overlay marks deleted is removed) and runs
``tests/gpu/test_<topic>_gpu.py`` against it: it must fail before and pass through. One line
per topic, like series_cuts.py; ``--results`` also writes them to ``series_cuts_gpu.txt``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DELETED = "__deleted__.json"


def _test_file(topic: str) -> Path:
    return REPO / "tests" / "gpu" / f"test_{re.sub(r'[^0-9a-zA-Z]', '_', topic)}_gpu.py"


def _snapshot(tree: Path, touched: set[str], dest: Path) -> None:
    """Overlay zip: the touched files as they stand in ``tree`` (absent ones listed)."""
    gone = []
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zf:
        for rel in sorted(touched):
            path = tree / rel
            if path.is_file():
                zf.write(path, f"vllm/{rel}")
            else:
                gone.append(rel)
        zf.writestr(DELETED, json.dumps(gone))


def _touched(patch: Path) -> set[str]:
    names: set[str] = set()
    for line in patch.read_text().splitlines():
        m = re.match(r"^diff --git a/(\S+) b/(\S+)$", line)
        if m:
            names.update(m.groups())
    return names


def pack(out: Path, topics: list[str]) -> int:
    sys.path.insert(0, str(REPO))
    from tests.patches.conftest import PATCHES_DIR, SERIES, built_wheels

    unknown = sorted(set(topics) - set(SERIES))
    if unknown:
        print(f"error: not in the recipe's patches/ group: {', '.join(unknown)}", file=sys.stderr)
        return 2
    _, pristine_wheel, _ = built_wheels()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="qwen38-gpucuts-") as tmp:
        tree = Path(tmp) / "vllm"
        with zipfile.ZipFile(pristine_wheel) as src:
            for name in src.namelist():
                if name.startswith("vllm/") and name.endswith(".py"):
                    (Path(tmp) / name).parent.mkdir(parents=True, exist_ok=True)
                    (Path(tmp) / name).write_bytes(src.read(name))
        touched: set[str] = set()
        for topic in SERIES:
            patch = PATCHES_DIR / f"{topic}.patch"
            touched |= _touched(patch)
            if topic in topics:
                _snapshot(tree, touched, out / f"before-{topic}.zip")
            subprocess.run(["patch", "-p1", "--fuzz", "0", "--forward", "--batch", "--quiet",
                            "-i", str(patch)], cwd=tree, check=True, capture_output=True)
            if topic in topics:
                _snapshot(tree, touched, out / f"through-{topic}.zip")
    (out / "pack.json").write_text(json.dumps({"topics": topics,
                                               "pristine": pristine_wheel.name}))
    for f in sorted(out.iterdir()):
        print(f"{f.name}: {f.stat().st_size / 2**20:.1f} MiB")
    return 0


def lay_out(pristine: Path, pack_dir: Path, overlay: str, dest: Path) -> Path:
    """The pristine tree + the overlay as a folder holding ``vllm/``."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(pristine, dest)
    with zipfile.ZipFile(pack_dir / overlay) as zf:
        for name in zf.namelist():
            if name != DELETED:
                zf.extract(name, dest)
        for rel in json.loads(zf.read(DELETED)):
            (dest / "vllm" / rel).unlink(missing_ok=True)
    return dest


def _pytest(tree: Path, test: Path, extra: list[str], results: Path | None,
            logs: Path | None, label: str, pristine: Path) -> tuple[int, str]:
    # QWEN38_VLLM_PRISTINE: the pristine 0.32.0 tree, for tests comparing against it
    env = {**os.environ, "QWEN38_VLLM_TREE": str(tree), "QWEN38_GPU_REQUIRED": "1",
           "QWEN38_VLLM_PRISTINE": str(pristine)}
    if results is None:
        env.pop("QWEN38_GPU_RESULTS", None)
    else:
        env["QWEN38_GPU_RESULTS"] = str(results)
    # -W default: vLLM's own modules warn under this torch; shown, not turned into errors
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-m", "gpu", "-W",
                           "default", "-p", "no:cacheprovider", str(test), *extra],
                          cwd=REPO, env=env, capture_output=True, text=True, check=False)
    if logs is not None:
        logs.mkdir(parents=True, exist_ok=True)
        (logs / f"pytest-{label}.log").write_text(proc.stdout + proc.stderr)
    lines = [ln for ln in proc.stdout.splitlines()
             if re.search(r"\d+ (passed|failed|error)", ln)]
    summary = re.sub(r" in [0-9.]+s.*$", "", lines[-1].strip("= ")) if lines else "no result"
    if proc.returncode not in (0, 1):
        sys.stdout.write(proc.stdout[-3000:] + proc.stderr[-2000:])
    return proc.returncode, summary


def pristine_tree(trees: Path, want: str, dest: Path) -> Path:
    """The ``pristine/vllm`` half of a ``vllm-py`` zip as ``dest/vllm``; SystemExit when the
    zip was made for another pristine wheel than the pack was cut against."""
    with zipfile.ZipFile(trees) as zf:
        have = json.loads(zf.read("trees.json"))["pristine"]
        if have != want:
            raise SystemExit(f"{trees} holds the trees of {have}; the pack is cut against "
                             f"{want}: build both from one recipe")
        for name in zf.namelist():
            if name.startswith("pristine/vllm/") and ".." not in name.split("/"):
                path = dest / name[len("pristine/"):]
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(zf.read(name))
    return dest


def run(pack_dir: Path, trees: Path, results: Path | None, extra: list[str]) -> int:
    meta = json.loads((pack_dir / "pack.json").read_text())
    lines = []
    ok = 0
    with tempfile.TemporaryDirectory(prefix="qwen38-gpucuts-") as tmp:
        pristine = pristine_tree(trees, meta["pristine"], Path(tmp) / "pristine")
        topics = meta["topics"]
        for topic in topics:
            test = _test_file(topic)
            before = lay_out(pristine, pack_dir, f"before-{topic}.zip", Path(tmp) / "before")
            rc_b, sum_b = _pytest(before, test, extra, None, results, f"before-{topic}",
                                 pristine)
            through = lay_out(pristine, pack_dir, f"through-{topic}.zip",
                              Path(tmp) / "through")
            rc_t, sum_t = _pytest(through, test, extra, results, results,
                                 f"through-{topic}", pristine)
            proven = rc_b == 1 and rc_t == 0
            ok += proven
            lines.append(f"{topic:<34}  before: {sum_b:<28}  through: {sum_t:<28}  "
                         f"{'ok' if proven else 'NOT PROVEN'}")
            print(lines[-1], flush=True)
    lines.append(f"{ok} of {len(topics)} patches: the GPU test fails before the patch and "
                 "passes through it")
    print(lines[-1])
    if results is not None:
        import torch

        card = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
        head = f"# GPU series cuts, {card}, {datetime.date.today().isoformat()}\n"
        results.mkdir(parents=True, exist_ok=True)
        (results / "series_cuts_gpu.txt").write_text(head + "\n".join(lines) + "\n")
    return 0 if ok == len(topics) else 1


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("pack")
    p.add_argument("out", type=Path)
    p.add_argument("topics", nargs="+")
    r = sub.add_parser("run")
    r.add_argument("pack", type=Path)
    r.add_argument("--trees", type=Path, default=REPO / "result" / "vllm-py-trees.zip",
                   help="the zip of `qwen38build build --only vllm-py` (default: ./result's)")
    r.add_argument("--results", type=Path)
    r.add_argument("pytest_args", nargs="*")
    args = parser.parse_args(argv)
    if args.verb == "pack":
        return pack(args.out, args.topics)
    if not (args.pack / "pack.json").is_file():
        parser.error(f"{args.pack}: not a pack (no pack.json; `pack OUT TOPIC...` makes one)")
    if not zipfile.is_zipfile(args.trees):
        parser.error(f"{args.trees}: not the zip of `qwen38build build --only vllm-py`")
    return run(args.pack, args.trees, args.results, args.pytest_args)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
