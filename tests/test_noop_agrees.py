"""The no-op is an answer like any other: it never differs from what ``--rebuild`` gives.

A property test: random sequences of edits to a patch, deletions of store entries, byte
flips in outputs (their mtime put back, as a hostile user would), changes of the request
(``--only``; ``--with`` an optional group with an overlay) and builds. After each step a
plain ``build`` (which may answer from the fast path) and a ``build --rebuild`` of the same
request must give the same exit code, the same build hash and outputs with the same bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import stat
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import ENVS, SERVER, Project
from tests.engine_fixtures import add_pthfa_sources, make_project, make_wheel, write_patch
from tests.test_groups import write_overlay

REQUESTS: list[tuple[str, ...]] = [(), ("--only", "vllm"), ("--only", "pthfa"),
                                   ("--only", "pthfa,vllm"), ("--with", "kvarn"),
                                   ("--only", "vllm", "--with", "kvarn"), ("--only", "vllm-py")]
OPS = st.one_of(
    st.tuples(st.just("edit"), st.integers(0, 2)),
    st.tuples(st.just("delete"), st.integers(0, 3)),
    st.tuples(st.just("flip"), st.integers(0, 3)),
    st.tuples(st.just("request"), st.integers(0, len(REQUESTS) - 1)),
    st.tuples(st.just("build"), st.just(0)),
)


def _stack(tmp: Path) -> Project:
    wheels = tmp / "wheels"
    root = make_project(tmp / "proj", make_wheel(wheels), ["route-fix", "knob"])
    p = Project(root, tmp / "store", wheels, tmp)
    _route_fix(p, 0)
    write_patch(root, "patches", "knob", [("envs.py", ENVS, ENVS.replace("KNOB_7 = 7\n",
                                                                          "KNOB_7 = 70\n"))],
                tmp / "diffs")
    add_pthfa_sources(root)
    recipe = root / "recipe.toml"
    recipe.write_text(recipe.read_text().replace('outputs = ["vllm"]',
                                                 'outputs = ["vllm", "pthfa"]'))
    # an optional group (--with kvarn): an overlay and a patch cut on what knob leaves
    knobs = ENVS.replace("KNOB_7 = 7\n", "KNOB_7 = 70\n")
    write_patch(root, "kvarn", "kvq-knob", [("envs.py", knobs, knobs.replace(
        "KNOB_20 = 20\n", "KNOB_20 = 'kvq'\n"))], tmp / "diffs")
    write_overlay(root, {"kvq/codec.py": "def encode(x):\n    return x * 2\n"})
    recipe.write_text(recipe.read_text().replace(
        'dir = "kvarn"\npatches = [\n]',
        'dir = "kvarn"\noptional = true\noverlay = "files"\npatches = ["kvq-knob.patch"]'))
    return p


def _route_fix(p: Project, variant: int) -> None:
    new = SERVER.replace("return 3\n", f"return {33 + variant}\n")
    write_patch(p.root, "patches", "route-fix", [("server.py", SERVER, new)], p.tmp / "diffs")


def _answer(p: Project, *argv: str) -> tuple[int, str | None, dict[str, str | None]]:
    """(exit code, build hash, output label → sha256 of the bytes served, or None)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = p.run("build", "--json", "-q", "--no-link", *argv)
    if code != 0:
        return code, None, {}
    data = json.loads(out.getvalue())
    served: dict[str, str | None] = {}
    for label, path in data["outputs"].items():
        try:
            served[label] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        except OSError:
            served[label] = None
    return code, data["build"], served


def _entries(p: Project) -> list[Path]:
    objects = p.store / "objects"
    return sorted(d for d in objects.iterdir() if d.is_dir()) if objects.is_dir() else []


def _delete(p: Project, n: int) -> None:
    entries = _entries(p)
    if entries:
        victim = entries[n % len(entries)]
        for dirpath, _, _ in os.walk(victim):
            os.chmod(dirpath, 0o755)
        import shutil

        shutil.rmtree(victim)


def _flip(p: Project, n: int) -> None:
    files = [f for e in _entries(p) for f in sorted(e.rglob("*"))
             if f.is_file() and not f.is_symlink()]
    if not files:
        return
    victim = files[n % len(files)]
    st_before = victim.stat()
    os.chmod(victim.parent, 0o755)
    os.chmod(victim, 0o644)
    data = bytearray(victim.read_bytes())
    if data:
        data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    os.utime(victim, ns=(st_before.st_atime_ns, st_before.st_mtime_ns))
    os.chmod(victim, stat.S_IMODE(st_before.st_mode))
    os.chmod(victim.parent, 0o555)


@pytest.mark.slow
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=st.lists(OPS, min_size=1, max_size=7))
def test_the_no_op_always_agrees_with_rebuild(
    ops: list[tuple[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    with tempfile.TemporaryDirectory(prefix="q38-noop.") as tmp:
        p = _stack(Path(tmp))
        monkeypatch.setenv("QWEN38BUILD_SOURCES", str(p.wheels))
        monkeypatch.chdir(p.root)
        request: tuple[str, ...] = ()
        assert _answer(p)[0] == 0
        for op, n in ops:
            if op == "edit":
                _route_fix(p, n)
            elif op == "delete":
                _delete(p, n)
            elif op == "flip":
                _flip(p, n)
            elif op == "request":
                request = REQUESTS[n]
            fast = _answer(p, *request)
            slow = _answer(p, *request, "--rebuild")
            assert fast == slow, f"after {op} {n} with {request or 'no --only'}"
