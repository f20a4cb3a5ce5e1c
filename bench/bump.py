"""Benchmark: the real vLLM 0.32.0 → 0.33.0 bump (dry run) with both wheels in the store.

Usage: ``.venv/bin/python bench/bump.py [--runs 5] [--to 0.33.0] [--recipe recipe.toml]
[--synthetic 60] [--hunks 200]``

A warm-up run puts both wheels in the store (from ``$QWEN38BUILD_SOURCES``, or
/tmp/wh:/tmp/wh33 where they exist, else pip). Then, each the median of ``--runs``:

- floor: ``python -c pass`` through this interpreter;
- command, warm: ``python -m qwen38build --recipe R bump vllm 0.33.0 --dry-run --offline
  --report FILE`` in a fresh interpreter (start-up, imports, the screen and the report file
  included), with what an earlier bump kept in the store: the wheels' files, and the
  series' trial (:mod:`qwen38build.bump.kept`, taken while nothing it is made from changed);
- command, trial made: the same with the kept trials removed before each run, as after an
  edit of a patch (the wheels' files still kept): every patch tried with GNU patch and
  every failing hunk explained;
- in-process: ``bump()`` alone, imports already done, the trial made each time.

Then the same for a large series: our series plus ``--synthetic`` patches (default 60)
generated here from real vLLM files of the old wheel (files our series does not touch,
``--hunks`` hunks in all, each inserting a comment line; some land where upstream changed
the file, so the mix has conflicts as a real series does). Reported: seconds per patch, and
the cost of each further patch ((large - ours) / synthetic), from the runs that make the
trial (a kept trial costs about the same whatever the series).

Offline (``QWEN38BUILD_OFFLINE=1``, as ``--offline``) unless the variable is set otherwise.
Each command's CPU time (user + system, GNU patch and diff included) is printed beside its
wall time: on a loaded machine the wall time measures the load as much as the command.

Targets (issues 11 and 20): our series at most 1.0 s warm; at most 15 ms per further patch.
"""

from __future__ import annotations

import argparse
import difflib
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

def command(recipe: str, to: str, report: Path) -> list[str]:
    """The dry run as a user types it (exit 1 when some patch does not carry over)."""
    return [sys.executable, "-m", "qwen38build", "--recipe", recipe, "bump", "vllm", to,
            "--dry-run", "--offline", "--report", str(report)]


CPU: list[float] = []  # the CPU seconds (user + system, its children included) of each run


def timed(argv: list[str], env: dict[str, str]) -> float:
    import resource

    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(argv, check=False, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE)
    if done.returncode not in (0, 1):  # 1: the report names patches that do not carry over
        raise SystemExit(f"{argv}: exit {done.returncode}: {done.stderr.decode()[-2000:]}")
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
    return wall


def synthetic_project(recipe: Path, wheel: Path, dest: Path, n: int, hunks: int) -> Path:
    """A copy of the project whose series is ours plus ``n`` generated patches."""
    from qwen38build.inputs import recipe as recipe_mod
    from qwen38build.series.patchfile import PatchFile, marker_for

    loaded = recipe_mod.load(recipe)
    ours = loaded.series_entries()
    touched = {rel for e in ours for rel in PatchFile.parse(e.path).touched_paths}
    shutil.copytree(loaded.root / "lock", dest / "lock")
    for group in loaded.recipe.series.groups:
        (dest / group.dir).mkdir(parents=True, exist_ok=True)
    for e in ours:
        shutil.copy2(e.path, dest / e.group / e.file)
    rng = random.Random(11)
    with zipfile.ZipFile(wheel) as z:
        names = sorted(
            n[len("vllm/"):] for n in z.namelist()
            if n.startswith("vllm/") and n.endswith(".py") and n[len("vllm/"):] not in touched
            and z.getinfo(n).file_size > 8000 and z.read(n).endswith(b"\n")
        )
        chosen = rng.sample(names, min(n, len(names)))
        texts = {rel: z.read(f"vllm/{rel}").decode() for rel in chosen}
    per = [hunks // n + (1 if i < hunks % n else 0) for i in range(n)]
    new_names = []
    for i, (rel, k) in enumerate(zip(chosen, per, strict=False)):
        # Lines split at "\n" only, as GNU patch reads them (str.splitlines also splits
        # at form feeds and the like, which vLLM's sources have).
        old = [ln + "\n" for ln in texts[rel].split("\n")[:-1]]
        spots = sorted(rng.sample(range(5, len(old) - 5), k), reverse=True)
        new = list(old)
        for at in spots:
            line = old[at].rstrip("\n")
            indent = line[: len(line) - len(line.lstrip())]
            new.insert(at + 1, f"{indent}# q38 bench patch {i} at {at}\n")
        diff = "".join(difflib.unified_diff(old, new, f"a/{rel}", f"b/{rel}", n=3))
        topic = f"bench-{i:02d}"
        (dest / "patches" / f"{topic}.patch").write_text(
            f"Generated by bench/bump.py.\n\nKind: local\nWhat: bench\nUpstream: none\n"
            f"Cut-against: {loaded.recipe.vllm.version}\nRetires-when: never\n"
            f"{marker_for('0' * 7, topic)}\ndiff --git a/{rel} b/{rel}\n{diff}"
        )
        new_names.append(f"{topic}.patch")
    text = recipe.read_text()
    last = ours[-1] if ours[-1].group == "patches" else next(
        e for e in reversed(ours) if e.group == "patches")
    anchor = f'    "{last.file}",\n'
    text = text.replace(anchor, anchor + "".join(f'    "{nm}",\n' for nm in new_names), 1)
    (dest / "recipe.toml").write_text(text)
    return dest / "recipe.toml"


def measure(label: str, recipe: str, to: str, runs: int, env: dict[str, str]
            ) -> tuple[float, float, float, int, dict[str, int]]:
    """(command warm, command with the trial made, in-process, patches, outcomes)."""
    from qwen38build.bump import bump, kept
    from qwen38build.inputs import recipe as recipe_mod
    from qwen38build.store.store import Store, default_root

    loaded = recipe_mod.load(Path(recipe))
    store = Store(default_root())
    warm = bump.bump(loaded, store, to)  # both wheels into the store, the trial kept
    with tempfile.TemporaryDirectory(prefix="q38-bench-report.") as tmp:
        argv = command(recipe, to, Path(tmp) / "report.md")
        CPU.clear()
        hit = [timed(argv, env) for _ in range(runs)]
        print(f"{label}: command, warm: CPU (user + system) median "
              f"{statistics.median(CPU):.3f} s, wall median {statistics.median(hit):.3f} s")
        CPU.clear()
        made = []
        for _ in range(runs):
            shutil.rmtree(store.root / kept.FOLDER, ignore_errors=True)
            made.append(timed(argv, env))
        print(f"{label}: command, trial made: CPU (user + system) median "
              f"{statistics.median(CPU):.3f} s, wall median {statistics.median(made):.3f} s")
    inproc = []
    for _ in range(runs):
        shutil.rmtree(store.root / kept.FOLDER, ignore_errors=True)
        t0 = time.perf_counter()
        bump.bump(loaded, store, to)
        inproc.append(time.perf_counter() - t0)
    counts: dict[str, int] = {}
    for p in warm.patches:
        counts[p.outcome] = counts.get(p.outcome, 0) + 1
    print(f"{label}: vllm {warm.old_version} -> {warm.new_version}, {len(warm.patches)} "
          "patches: " + ", ".join(f"{n} {k}" for k, n in counts.items()))
    return (statistics.median(hit), statistics.median(made), statistics.median(inproc),
            len(warm.patches), counts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--to", default="0.33.0")
    ap.add_argument("--recipe", default=str(REPO / "recipe.toml"))
    ap.add_argument("--synthetic", type=int, default=60)
    ap.add_argument("--hunks", type=int, default=200)
    args = ap.parse_args()
    env = dict(os.environ)
    env.setdefault("QWEN38BUILD_OFFLINE", "1")  # as `bump --offline`: the index is not asked
    if "QWEN38BUILD_SOURCES" not in env:
        found = [d for d in ("/tmp/wh", "/tmp/wh33") if Path(d).is_dir()]
        if found:
            env["QWEN38BUILD_SOURCES"] = os.pathsep.join(found)
    os.environ.update(env)

    from qwen38build.inputs import recipe as recipe_mod
    from qwen38build.store.store import Store, default_root
    from qwen38build.workspace import workspace

    floor = statistics.median(
        [timed([sys.executable, "-c", "pass"], env) for _ in range(args.runs)]
    )
    ours = measure("ours", args.recipe, args.to, args.runs, env)
    old_wheel = workspace.locked_wheel(recipe_mod.load(Path(args.recipe)),
                                       Store(default_root()))
    with tempfile.TemporaryDirectory(prefix="q38-bench-bump.") as tmp:
        big_recipe = synthetic_project(Path(args.recipe), old_wheel, Path(tmp),
                                       args.synthetic, args.hunks)
        big = measure(f"ours + {args.synthetic} synthetic ({args.hunks} hunks)",
                      str(big_recipe), args.to, args.runs, env)
    extra = big[3] - ours[3]
    print(f"median of {args.runs}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"| {'what':<48} | {'seconds':>8} | {'x floor':>8} | {'s/patch':>8} |")
    print(f"|{'-' * 50}|{'-' * 10}|{'-' * 10}|{'-' * 10}|")
    rows = [("floor: python -c pass", floor, 0)]
    for name, m in (("ours", ours), ("large", big)):
        rows += [
            (f"command warm, {name} ({m[3]} patches)", m[0], m[3]),
            (f"command, trial made, {name} ({m[3]} patches)", m[1], m[3]),
            (f"in-process, trial made, {name} ({m[3]} patches)", m[2], m[3]),
        ]
    for name, secs, n in rows:
        per = f"{secs / n:8.4f}" if n else f"{'':8}"
        print(f"| {name:<48} | {secs:8.3f} | {secs / floor:8.1f} | {per} |")
    if extra:
        print(f"per further patch (trial made): command {(big[1] - ours[1]) / extra * 1000:.1f}"
              f" ms, in-process {(big[2] - ours[2]) / extra * 1000:.1f} ms (target 15 ms); "
              f"ours: command warm {ours[0]:.3f} s, trial made {ours[1]:.3f} s (target 1.0 s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
