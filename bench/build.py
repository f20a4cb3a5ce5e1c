"""Benchmark: qwen38build against its floors and against the old apply/verify scripts.

    .venv/bin/python bench/build.py [--runs 5] [--json] [--wheel PATH] [--keep]

Prints medians of ``--runs`` runs (default 5) of each step, each as a ratio to the floor it
should be judged against, measured in the same run:

  floors     bare interpreter start (``python -S -c pass`` and ``python -c pass``, the venv's
             interpreter that the tool's console script runs on); ``cp`` of the locked vLLM
             wheel to a temp file plus fsync
  first      one ``qwen38build build`` into an empty store, the pristine wheel reachable
             through QWEN38BUILD_SOURCES (no index): the fetch step copies it into the store
             checking its sha256 (reported, not a target)
  cold       ``qwen38build build --rebuild --no-link`` with the wheel already in the store
             (every other entry removed before each run); it includes process start, recipe
             validation, lint, planning (hashing the patches), the patch step (extract the
             touched members, GNU patch at fuzz 0), the wheel step (raw-copy every untouched
             member, write RECORD, fsync) and the build record
  no-op      ``qwen38build build`` again on the same store, nothing changed (console script)
  rebuild    the same after rewriting the prose of one patch: the patch and wheel steps run
             again, the fetch step is a store hit
  verify     ``qwen38build verify DIR`` of the built wheel installed once with
             ``pip install --no-deps --no-compile --target DIR``
  old way    fresh venv, ``pip install --no-deps --no-compile`` of the pristine wheel, a
             ``patch -p1 --fuzz 0 --forward --batch`` loop over the series inside
             site-packages/vllm; then a ``patch -p1 -R --dry-run --fuzz 0 --batch`` loop
             (the old verify), timed on its own as the floor of ``verify``

Peak RSS is the child's ``ru_maxrss`` from ``os.wait4`` (it includes the child's own reaped
children, e.g. ``patch``). The project is snapshotted into a temp dir first (recipe.toml,
lock/, the series folders holding only the files the recipe lists, kvarn/, fa2/, pthfa/,
PATCHES.md; from git HEAD, or ``--ref REV``, unless ``--worktree``), so edits to the
working tree while the benchmark runs do not disturb it.
The tool's own output is captured; it is shown only when a command fails.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import stat
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PROJECT_FILES = ("recipe.toml", "lock", "kvarn", "fa2", "pthfa", "PATCHES.md")
MiB = 1024 * 1024


@dataclass
class Run:
    seconds: float
    maxrss_kb: int
    returncode: int
    output: str


@dataclass
class Series:
    """The samples of one step."""

    seconds: list[float] = field(default_factory=list)
    maxrss_kb: list[int] = field(default_factory=list)

    def add(self, run: Run) -> None:
        self.seconds.append(run.seconds)
        self.maxrss_kb.append(run.maxrss_kb)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


class BenchError(Exception):
    pass


# -- running children -------------------------------------------------------------------


def run_child(
    argv: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None,
    check: bool = True,
) -> Run:
    """Run ``argv`` with its output captured; wall time and the child's peak RSS."""
    with tempfile.TemporaryFile() as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=env, cwd=cwd)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode("utf-8", "replace")
    run = Run(seconds, usage.ru_maxrss, proc.returncode, text)
    if check and run.returncode != 0:
        raise BenchError(f"command failed (exit {run.returncode}): {' '.join(argv)}\n{text}")
    return run


def timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def rmtree(path: Path) -> None:
    """Remove a tree, store entries (read-only) included."""

    def onerror(func: Any, p: str, _exc: Any) -> None:
        parent = Path(p).parent
        parent.chmod(parent.stat().st_mode | stat.S_IWUSR)
        if Path(p).is_dir() and not Path(p).is_symlink():
            Path(p).chmod(Path(p).stat().st_mode | stat.S_IWUSR | stat.S_IXUSR)
        func(p)

    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path, onerror=onerror)


# -- inputs -----------------------------------------------------------------------------


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(4 * MiB):
            h.update(chunk)
    return h.hexdigest()


def locked_wheel(project: Path) -> dict[str, Any]:
    data = json.loads((project / "lock" / "sources.json").read_text(encoding="utf-8"))
    for src in data["sources"]:
        if src["name"] == "vllm":
            return dict(src)
    raise BenchError(f"{project}/lock/sources.json has no vllm entry")


def find_wheel(locked: dict[str, Any], explicit: str | None) -> Path:
    """The pristine wheel: --wheel, QWEN38BUILD_SOURCES, a store, or the test-wheel cache."""
    name = locked["filename"]
    candidates: list[Path] = []
    if explicit:
        candidates.append(Path(explicit))
    for d in filter(None, os.environ.get("QWEN38BUILD_SOURCES", "").split(os.pathsep)):
        candidates.append(Path(d) / name)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "qwen38build"
    stores = [Path(os.environ["QWEN38BUILD_STORE"])] if os.environ.get("QWEN38BUILD_STORE") else []
    stores.append(cache / "store")
    for store in stores:
        candidates.extend(sorted((store / "objects").glob(f"*/{name}")))
    candidates.append(cache / "test-wheels" / name)
    for c in candidates:
        if c.is_file() and c.stat().st_size == locked["size"]:
            got = sha256_file(c)  # also warms the page cache for every run after
            if got == locked["sha256"]:
                return c.resolve()
    raise BenchError(
        f"no copy of {name} (sha256 {locked['sha256'][:12]}) found; pass --wheel PATH, or set "
        "QWEN38BUILD_SOURCES / QWEN38BUILD_STORE to where it is (a `nox -s build` puts it in "
        "the default store)"
    )


def git_export(src: Path, dest: Path, names: list[str], ref: str) -> None:
    archive = subprocess.run(["git", "-C", str(src), "archive", ref, "--", *names],
                             capture_output=True, check=False)
    if archive.returncode != 0:
        raise BenchError(f"git archive failed: {archive.stderr.decode(errors='replace')}")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)


def snapshot_project(src: Path, dest: Path, *, worktree: bool, ref: str) -> list[Path]:
    """Copy the project's build inputs; return the series in apply order (paths in dest).

    From git ``ref`` (default HEAD: what is committed, so other people's half-done edits
    stay out) unless ``worktree`` is set or ``src`` is no git checkout.
    """
    dest.mkdir(parents=True)
    if not worktree and (src / ".git").exists():
        git_export(src, dest, [n for n in PROJECT_FILES if (src / n).exists()], ref)
        recipe = tomllib.loads((dest / "recipe.toml").read_text(encoding="utf-8"))
        git_export(src, dest, [g["dir"] for g in recipe["series"]["groups"]
                               if (src / g["dir"]).exists()], ref)
        src = dest
    else:
        for name in PROJECT_FILES:
            p = src / name
            if p.is_dir():
                shutil.copytree(p, dest / name)
            elif p.is_file():
                shutil.copy2(p, dest / name)
    recipe_text = (dest / "recipe.toml").read_text(encoding="utf-8")
    recipe = tomllib.loads(recipe_text)
    if "build" not in recipe:
        # What this bench measures is the patched wheel's path (fetch, patch, wheel); the
        # kernels and the environment lock are other parts of the stack, cached by digest.
        (dest / "recipe.toml").write_text(recipe_text + '\n[build]\noutputs = ["vllm"]\n',
                                          encoding="utf-8")
    series: list[Path] = []
    for group in recipe["series"]["groups"]:
        folder = dest / group["dir"]
        listed = list(group["patches"])
        folder.mkdir(exist_ok=True)
        for name in listed:
            if src != dest:
                shutil.copy2(src / group["dir"] / name, folder / name)
        for extra in folder.glob("*.patch"):  # in the folder, not (yet) in the series
            if extra.name not in listed:
                extra.unlink()
        series.extend(folder / n for n in listed)
    return series


def series_from_recipe(project: Path) -> list[Path]:
    """The series in apply order, through the tool's own loader (as the build reads it)."""
    try:
        from qwen38build.inputs import recipe
    except ImportError:
        return []
    return [e.path for e in recipe.load(project / "recipe.toml").series_entries()]


# -- the steps --------------------------------------------------------------------------


@dataclass
class Bench:
    runs: int
    venv: Path
    work: Path
    project: Path
    wheel: Path
    series: list[Path]
    results: dict[str, Series] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    @property
    def tool(self) -> str:
        return str(self.venv / "bin" / "qwen38build")

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("QWEN38BUILD_STORE", None)
        env["QWEN38BUILD_SOURCES"] = str(self.wheel.parent)
        env["NO_COLOR"] = "1"
        return env

    def series_for(self, name: str) -> Series:
        return self.results.setdefault(name, Series())

    def build(self, store: Path, *extra: str) -> tuple[Run, str]:
        run = run_child([self.tool, "--recipe", str(self.project / "recipe.toml"),
                         "--store", str(store), "build", *extra], env=self.env())
        lines = dict(line.split(" ", 1) for line in run.output.splitlines()
                     if line.startswith(("build ", "wheel ")))
        if "build" not in lines or "wheel" not in lines:
            raise BenchError(f"no build/wheel line in the build's output:\n{run.output}")
        return run, lines["build"].strip()

    # floors

    def floors(self) -> None:
        for flags, name in ((["-S"], "python -S -c pass"), ([], "python -c pass")):
            run_child([self.python, *flags, "-c", "pass"])  # warm-up
            for _ in range(self.runs):
                self.series_for(name).add(run_child([self.python, *flags, "-c", "pass"]))
        dest = self.work / "cp.whl"
        for _ in range(self.runs):
            def copy() -> None:
                shutil.copyfile(self.wheel, dest)
                fd = os.open(dest, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            self.series_for("cp wheel + fsync").seconds.append(timed(copy))
            dest.unlink()

    # the tool

    def cold(self) -> Path:
        """One first build into an empty store, then cold builds with only the fetched wheel
        left in the store; the last store is kept for the later steps."""
        store = self.work / "store"
        run, build_hash = self.build(store, "--rebuild", "--no-link", "-q")
        self.series_for("first build (fetch included)").add(run)
        record = json.loads((store / "builds" / f"{build_hash}.json").read_text())
        fetch = next(s["digest"] for s in record["steps"]
                     if s["derivation"]["kind"] == "fetch")
        for _ in range(self.runs):
            for meta in (store / "objects").glob("*.json"):
                if meta.stem != fetch:
                    meta.unlink()
                    rmtree(store / "objects" / meta.stem)
            run, build_hash = self.build(store, "--rebuild", "--no-link", "-q")
            self.series_for("cold build").add(run)
        self.facts["build"] = build_hash
        self.facts["built_wheel"] = str(next((store / "objects" / build_hash).glob("*.whl")))
        return store

    def noop(self, store: Path) -> None:
        self.build(store)  # warm-up; also links the snapshot's result
        fast = 0
        for _ in range(self.runs):
            run, build_hash = self.build(store)
            if build_hash != self.facts["build"]:
                raise BenchError(f"no-op build gave {build_hash}, not {self.facts['build']}")
            self.series_for("no-op build").add(run)
            # The fast path prints only the build and wheel lines; the full path (all store
            # hits) also prints a progress line per step, e.g. after the engine's code changed.
            fast += len(run.output.strip().splitlines()) == 2
        self.facts["noop_fast_path_runs"] = fast

    def verify(self, store: Path) -> None:
        target = self.work / "installed"
        run_child([self.python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                   "--no-deps", "--no-compile", "--target", str(target), self.facts["built_wheel"]])
        argv = [self.tool, "--recipe", str(self.project / "recipe.toml"), "--store", str(store),
                "verify", str(target), "--build", self.facts["build"]]
        run_child(argv, env=self.env())  # warm-up, and it must pass
        for _ in range(self.runs):
            self.series_for("verify installed tree").add(run_child(argv, env=self.env()))
        rmtree(target)

    def rebuild(self, store: Path) -> None:
        """Rewrite one patch's prose per run (a new digest each time): patch + wheel rerun."""
        victim = self.series[0]
        original = victim.read_bytes()
        first, _, rest = original.partition(b"\n")
        self.facts["edited_patch"] = victim.name
        try:
            for i in range(self.runs):
                victim.write_bytes(first + f"\nBench edit {i} ({os.getpid()}).\n".encode() + rest)
                run, build_hash = self.build(store, "--no-link", "-q")
                if build_hash == self.facts["build"]:
                    raise BenchError("editing a patch did not change the build hash")
                self.series_for("rebuild after editing one patch").add(run)
                rmtree(store / "objects" / build_hash)  # keep the disk use flat
        finally:
            victim.write_bytes(original)

    # the old scripts

    def old_way(self) -> None:
        for i in range(self.runs):
            venv = self.work / f"oldvenv{i}"
            t_venv = run_child([self.python, "-m", "venv", "--without-pip", str(venv)])
            t_pip = run_child([self.python, "-m", "pip", "--python", str(venv / "bin" / "python"),
                               "install", "-q", "--disable-pip-version-check", "--no-deps",
                               "--no-compile", str(self.wheel)])
            pkg = next(venv.glob("lib/python*/site-packages/vllm"))
            t0 = time.perf_counter()
            for p in self.series:
                run_child(["patch", "-p1", "--fuzz", "0", "--forward", "--batch", "-i", str(p)],
                          cwd=pkg)
            t_patch = time.perf_counter() - t0
            t0 = time.perf_counter()
            failed = []
            for p in self.series:
                r = run_child(["patch", "-p1", "-R", "--dry-run", "--fuzz", "0", "--batch",
                               "-i", str(p)], cwd=pkg, check=False)
                if r.returncode != 0:
                    failed.append(p.name)
            t_verify = time.perf_counter() - t0
            self.facts["old_verify_failures"] = failed
            self.series_for("old: fresh venv").seconds.append(t_venv.seconds)
            self.series_for("old: pip install wheel").seconds.append(t_pip.seconds)
            self.series_for("old: patch loop").seconds.append(t_patch)
            self.series_for("old way total (venv+pip+patch)").seconds.append(
                t_venv.seconds + t_pip.seconds + t_patch)
            self.series_for("old verify: patch -R --dry-run loop").seconds.append(t_verify)
            rmtree(venv)


# -- report -----------------------------------------------------------------------------

# step -> (floor step, label of the ratio)
RATIOS = {
    "cold build": "cp wheel + fsync",
    "no-op build": "python -c pass",
    "rebuild after editing one patch": "cold build",
    "verify installed tree": "old verify: patch -R --dry-run loop",
    "old way total (venv+pip+patch)": "cold build",
}
ORDER = [
    "python -S -c pass", "python -c pass", "cp wheel + fsync", "first build (fetch included)",
    "cold build", "no-op build",
    "rebuild after editing one patch", "verify installed tree", "old: fresh venv",
    "old: pip install wheel", "old: patch loop", "old way total (venv+pip+patch)",
    "old verify: patch -R --dry-run loop",
]


def summary(b: Bench) -> dict[str, Any]:
    steps: dict[str, Any] = {}
    for name in ORDER:
        s = b.results.get(name)
        if s is None:
            continue
        row: dict[str, Any] = {"median_s": s.median, "samples_s": s.seconds}
        floor = RATIOS.get(name)
        if floor and floor in b.results:
            row["floor"] = floor
            row["ratio"] = s.median / b.results[floor].median
        if s.maxrss_kb:
            row["peak_rss_mb"] = max(s.maxrss_kb) / 1024
        steps[name] = row
    return {
        "runs": b.runs,
        "python": b.python,
        "wheel": {"path": str(b.wheel), "bytes": b.wheel.stat().st_size},
        "series": [p.name for p in b.series],
        "steps": steps,
        **b.facts,
    }


def table(data: dict[str, Any]) -> str:
    out = [
        f"qwen38build bench: medians of {data['runs']} runs; series of {len(data['series'])} "
        f"patches; wheel {data['wheel']['bytes'] / MiB:.0f} MiB; interpreter {data['python']}",
        "",
        "| step | median s | ratio | against | peak RSS MB |",
        "|---|---:|---:|---|---:|",
    ]
    for name, row in data["steps"].items():
        ratio = f"{row['ratio']:.2f}x" if "ratio" in row else ""
        rss = f"{row['peak_rss_mb']:.0f}" if "peak_rss_mb" in row else ""
        out.append(f"| {name} | {row['median_s']:.3f} | {ratio} | {row.get('floor', '')} "
                   f"| {rss} |")
    fails = data.get("old_verify_failures", [])
    out += [
        "",
        "cold build = the wheel already in the store: process start, recipe validation, "
        "lint, plan, patch, wheel (written, fsynced, hashed), build record.",
        f"rebuild edits the prose of {data.get('edited_patch')}: patch + wheel steps rerun, "
        "fetch is a hit.",
        f"no-op runs answered by the fast path: {data.get('noop_fast_path_runs')} of "
        f"{data['runs']}.",
        "peak RSS: the child's ru_maxrss (os.wait4), its own subprocesses included.",
        "old verify (reverse dry-run loop in series order) rejected "
        + (", ".join(fails) if fails else "nothing")
        + " on a correctly patched tree.",
    ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="runs per step (default 5)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    ap.add_argument("--wheel", help="the pristine locked vLLM wheel (default: searched)")
    ap.add_argument("--project", default=str(REPO), help="project root (default: this repo)")
    ap.add_argument("--venv", default=None,
                    help="venv holding qwen38build (default: ./.venv, else this interpreter's)")
    ap.add_argument("--worktree", action="store_true",
                    help="snapshot the working tree, not git HEAD")
    ap.add_argument("--ref", default="HEAD", help="git revision to snapshot (default HEAD)")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir and say where")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    project = Path(args.project).resolve()
    venv = Path(args.venv) if args.venv else (
        project / ".venv" if (project / ".venv" / "bin" / "qwen38build").exists()
        else Path(sys.prefix))
    if not (venv / "bin" / "qwen38build").exists():
        print(f"error: no qwen38build console script in {venv}/bin", file=sys.stderr)
        return 2
    if shutil.which("patch") is None:
        print("error: GNU patch is needed for the old-way comparison", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="q38bench-"))
    try:
        wheel = find_wheel(locked_wheel(project), args.wheel)
        snap = work / "project"
        listed = snapshot_project(project, snap, worktree=args.worktree, ref=args.ref)
        series = series_from_recipe(snap) or listed
        if [p.name for p in series] != [p.name for p in listed]:
            raise BenchError("the recipe's series and the snapshot disagree")
        srcdir = work / "sources"
        srcdir.mkdir()
        (srcdir / wheel.name).symlink_to(wheel)
        b = Bench(args.runs, venv, work, snap, srcdir / wheel.name, series)

        def say(message: str) -> None:
            if not args.json:
                print(message, file=sys.stderr, flush=True)

        say(f"bench: {args.runs} runs per step in {work}")
        # Time the tool as installed, with its byte code written (PYTHONDONTWRITEBYTECODE
        # may be set in this environment, which would recompile it on every start).
        pkg = subprocess.run([b.python, "-c", "import qwen38build, os; "
                              "print(os.path.dirname(qwen38build.__file__))"],
                             capture_output=True, text=True, check=True).stdout.strip()
        subprocess.run([b.python, "-m", "compileall", "-q", pkg], check=True,
                       capture_output=True)
        say("bench: floors")
        b.floors()
        say("bench: cold builds")
        store = b.cold()
        say("bench: no-op builds")
        b.noop(store)
        say("bench: verify")
        b.verify(store)
        say("bench: old way")
        b.old_way()
        say("bench: rebuilds")
        b.rebuild(store)
        data = summary(b)
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.keep:
            print(f"bench: kept {work}", file=sys.stderr)
        else:
            rmtree(work)
    print(json.dumps(data, indent=2) if args.json else table(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
