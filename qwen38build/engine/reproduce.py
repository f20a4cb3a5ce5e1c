"""reproduce: rebuild a recorded build's whole closure in an empty store and compare.

Only sources cross over: the fetched wheel (by its sha256) and the patch files (kept in the
store's sources/ by sha256). Every other step runs again from scratch, and every output
file's sha256 is compared with the record. A difference names the step and the file, with
a diffoscope report where diffoscope is installed.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from qwen38build.engine.executor import realise
from qwen38build.engine.report import Reporter
from qwen38build.errors import Qwen38BuildError
from qwen38build.files import remove_tree
from qwen38build.proc import environment, run
from qwen38build.steps import implementation
from qwen38build.store.entry import output_sha256
from qwen38build.store.record import read_build, steps_from_record
from qwen38build.store.store import Store


@dataclass
class Difference:
    step: str
    digest: str
    file: str
    recorded: str | None
    rebuilt: str | None
    diffoscope: str = ""


@dataclass
class Result:
    build: str
    ok: bool
    differences: list[Difference] = field(default_factory=list)
    error: str = ""
    kept: str = ""

    def as_json(self) -> dict[str, object]:
        return {"build": self.build, "reproduced": self.ok, "error": self.error,
                "differences": [d.__dict__ for d in self.differences]}

    def text(self) -> str:
        if self.ok:
            return f"reproduced {self.build}"
        lines = [f"NOT reproduced {self.build}"]
        if self.error:
            lines.append(f"  {self.error}")
        for d in self.differences:
            lines.append(f"  step {d.step} ({d.digest[:12]}): {d.file} recorded "
                         f"{(d.recorded or 'absent')[:12]}, rebuilt {(d.rebuilt or 'absent')[:12]}")
            if d.diffoscope:
                lines.append("    " + d.diffoscope.replace("\n", "\n    "))
        if self.kept:
            lines.append(f"  rebuilt store kept at {self.kept}")
        else:
            lines.append("  (run again with --keep to keep the rebuilt store)")
        return "\n".join(lines)


def reproduce(store: Store, build_hash: str, reporter: Reporter, *, keep: bool = False) -> Result:
    record = read_build(store, build_hash)
    steps = steps_from_record(record)
    result = Result(record["build"], ok=True)
    for s in steps:
        # The record names the code that made each step (its implementation hash). Other
        # code would rebuild other bytes under the recorded digests: refuse, honestly.
        if implementation(s.kind) != s.implementation:
            result.ok = False
            result.error = (f"step {s.name} was built by {s.kind} implementation "
                            f"{s.implementation[:12]}; this qwen38build's is "
                            f"{implementation(s.kind)[:12]}: reproduce it with the qwen38build "
                            "that built it")
            return result
    tmp = Path(tempfile.mkdtemp(prefix="q38-reproduce."))
    fresh = Store(tmp / "store")
    try:
        try:
            realise([steps[-1]], fresh, reporter, source_stores=[store])
        except Qwen38BuildError as exc:
            result.ok = False
            result.error = f"the rebuild failed: {exc}"
            return result
        recorded = {s["digest"]: s for s in record["steps"]}
        for s in steps:
            # Compare with what the store holds now (a tampered entry must show), falling
            # back on the record for entries gc has removed. A build input of a substituted
            # step was never here and recorded no outputs: nothing to compare it with.
            held = store.objects / s.digest
            if recorded[s.digest]["outputs"] is None and not held.is_dir():
                continue
            rec = dict(recorded[s.digest]["outputs"] or {})
            if held.is_dir():
                rec = {p.relative_to(held).as_posix(): output_sha256(p)
                       for p in sorted(held.rglob("*")) if p.is_file() or p.is_symlink()}
            entry = fresh.lookup(s.digest)
            assert entry is not None
            got = {k: v["sha256"] for k, v in entry.outputs.items()}
            for name in sorted(set(rec) | set(got)):
                if rec.get(name) != got.get(name):
                    diff = Difference(s.name, s.digest, name, rec.get(name), got.get(name))
                    diff.diffoscope = _diffoscope(store.objects / s.digest / name,
                                                  entry.path / name)
                    result.differences.append(diff)
        result.ok = not result.differences
        return result
    finally:
        # Kept only on request: a failed comparison is already described above, and an
        # unasked-for store left in the temp dir is nobody's to clean.
        if keep:
            result.kept = str(fresh.root)
        else:
            remove_tree(tmp)


def diffoscope_program() -> str | None:
    """diffoscope on PATH, or installed beside this interpreter (the same venv)."""
    beside = Path(sys.executable).parent / "diffoscope"
    return shutil.which("diffoscope") or (str(beside) if beside.is_file() else None)


def _diffoscope(a: Path, b: Path) -> str:
    tool = diffoscope_program()
    if tool is None or not a.exists() or not b.exists():
        return ""
    proc = run([tool, "--text", "-", a, b], what="diffoscope", timeout=600,
               env=environment(passed=("HOME", "TMPDIR")))
    return proc.stdout[-4000:]
