"""bump and an optional series group with an overlay (issue 26): the group's patches are
tried and reported as patches/'s are, and each overlay file the new pin carries is named."""

from __future__ import annotations

from pathlib import Path

import pytest

from qwen38build.bump import bump
from tests.bump_fixtures import NEW, PIN, make_project, make_wheel, numbered
from tests.test_groups import set_group, write_overlay

A = numbered("a")
K = numbered("k")
OVERLAY = {"kvq/codec.py": "def encode(x):\n    return x * 2\n", "kvq/tables.py": "T = 1\n"}


def test_group_patches_and_overlay_files_against_the_new_pin(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheels = tmp_path / "wheels"
    old = make_wheel(wheels, PIN, {"__init__.py": "", "a.py": A, "k.py": K})
    # upstream now ships kvq/codec.py (other bytes) and kvq/tables.py (ours, byte for byte),
    # and changed the line the group's second patch changes
    make_wheel(wheels, NEW, {"__init__.py": "", "a.py": A,
                             "k.py": K.replace("k line 20\n", "k line 20 upstream\n"),
                             "kvq/codec.py": "def encode(x):\n    return x + x\n",
                             "kvq/tables.py": OVERLAY["kvq/tables.py"]})
    p = make_project(tmp_path, old, ["a-fix"], ["k-one", "k-two"])
    monkeypatch.setenv("QWEN38BUILD_SOURCES", str(wheels))
    p.patch("patches", "a-fix", [("a.py", A, A.replace("a line 3\n", "a line 3 ours\n"))])
    p.patch("kvarn", "k-one", [("k.py", K, K.replace("k line 5\n", "k line 5 ours\n"))])
    K1 = K.replace("k line 5\n", "k line 5 ours\n")
    p.patch("kvarn", "k-two", [("k.py", K1, K1.replace("k line 20\n", "k line 20 ours\n"))])
    write_overlay(p.root, OVERLAY)
    set_group(p.root, 'optional = true\noverlay = "files"\n')
    report = bump.bump(p.loaded(), p.store, NEW)
    outcomes = {r.patch: r.outcome for r in report.patches}
    assert outcomes == {"a-fix": "clean", "kvarn/k-one": "clean", "kvarn/k-two": "conflict"}
    assert [(o.overlay, o.path, o.identical) for o in report.overlays] == [
        ("kvarn:overlay", "kvq/codec.py", False), ("kvarn:overlay", "kvq/tables.py", True)]
    assert not report.ok
    text = report.to_markdown()
    assert ("kvarn:overlay: vllm/kvq/codec.py is in vllm 0.2.0 now (with other bytes than "
            "ours)") in text
    assert "kvarn:overlay: vllm/kvq/tables.py is in vllm 0.2.0 now (identical to ours)" in text
    assert report.to_json()["overlays"] == [
        {"overlay": "kvarn:overlay", "path": "kvq/codec.py", "identical": False},
        {"overlay": "kvarn:overlay", "path": "kvq/tables.py", "identical": True}]
    assert "vllm/kvq/codec.py is in vllm 0.2.0 now" in report.to_screen()


def test_an_overlay_upstream_lacks_is_not_reported(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheels = tmp_path / "wheels"
    old = make_wheel(wheels, PIN, {"__init__.py": "", "a.py": A})
    make_wheel(wheels, NEW, {"__init__.py": "", "a.py": A, "other.py": "x = 1\n"})
    p = make_project(tmp_path, old, [], [])
    monkeypatch.setenv("QWEN38BUILD_SOURCES", str(wheels))
    write_overlay(p.root, OVERLAY)
    set_group(p.root, 'optional = true\noverlay = "files"\n')
    report = bump.bump(p.loaded(), p.store, NEW)
    assert report.overlays == [] and report.ok


def test_a_source_group_overlay_is_checked_from_its_tree_in_the_store(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from qwen38build.engine.executor import realise
    from qwen38build.engine.plan import source_step
    from qwen38build.engine.report import Reporter
    from qwen38build.inputs import lock
    from qwen38build.trees.treehash import tree_hash
    from tests.test_groups import COMMIT, SOURCE

    wheels = tmp_path / "wheels"
    old = make_wheel(wheels, PIN, {"__init__.py": "", "a.py": A})
    make_wheel(wheels, NEW, {"__init__.py": "", "a.py": A,
                             "kvq/codec.py": OVERLAY["kvq/codec.py"]})
    p = make_project(tmp_path, old, [], [])
    monkeypatch.setenv("QWEN38BUILD_SOURCES", str(wheels))
    set_group(p.root, 'optional = true\nsource = "kvq-src"\noverlay = "overlay"\n')
    (p.root / "recipe.toml").write_text((p.root / "recipe.toml").read_text() + SOURCE)
    tree = p.root.parent / "mirror" / f"kvq-{COMMIT[:8]}"
    write_overlay(tree, OVERLAY, "overlay")
    (tree / "overlay" / "MANIFEST").unlink()  # a source tree is pinned by its hash instead
    (tree / "LICENSE").write_text("Apache-2.0\n")
    # not locked yet: nothing to compare
    assert bump.bump(p.loaded(), p.store, NEW).overlays == []
    lock.write(p.root, list(lock.read(p.root).values()), [lock.LockedTree(
        "kvq-src", "https://example.invalid/kvq", COMMIT, ("overlay", "LICENSE"),
        tree_hash(tree, ("overlay", "LICENSE")))])
    # locked but not in the store: not fetched for the report
    assert bump.bump(p.loaded(), p.store, NEW).overlays == []
    step = source_step(p.loaded(), "kvq-src")
    assert step is not None
    realise([step], p.store, Reporter(quiet=True))
    report = bump.bump(p.loaded(), p.store, NEW)
    assert [(o.overlay, o.path, o.identical) for o in report.overlays] == [
        ("kvarn:overlay", "kvq/codec.py", True)]
