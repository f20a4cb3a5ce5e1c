"""`build --only vllm-py`: the pristine and patched package's `.py` files as one zip, the
trees a GPU machine without the index runs tests/gpu from (tests/gpu/vllm_tree.py reads it
through QWEN38_VLLM_TREES; `nox -s gpu_tests` checks a carried one against the plan)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ENVS, SERVER, Project
from tests.engine_fixtures import load_noxfile
from tests.gpu import vllm_tree


def _zip(p: Project, store: str = "store") -> Path:
    assert p.run("--store", str(p.tmp / store), "build", "--only", "vllm-py") == 0
    out = p.root / "result" / "vllm-py-trees.zip"
    assert out.is_file()
    return out


def test_trees_zip_holds_both_trees(project: Project) -> None:
    with zipfile.ZipFile(_zip(project)) as zf:
        names = set(zf.namelist())
        assert {"pristine/vllm/server.py", "patched/vllm/server.py", "pristine/vllm/__init__.py",
                "pristine/vllm/envs.py", "patched/vllm/envs.py", "trees.json"} <= names
        # the patched tree is the files that differ: __init__.py is the pristine one
        assert "patched/vllm/__init__.py" not in names
        assert zf.read("pristine/vllm/server.py").decode() == SERVER
        assert zf.read("patched/vllm/server.py").decode() == SERVER.replace("return 3\n",
                                                                           "return 33\n")
        assert zf.read("patched/vllm/envs.py").decode() == ENVS.replace("KNOB_7 = 7\n",
                                                                       "KNOB_7 = 70\n")
        assert all(n.endswith(".py") for n in names - {"trees.json"})
        index = json.loads(zf.read("trees.json"))
    assert "+q38." in index["patched"] and "+q38." not in index["pristine"]


def test_trees_zip_same_bytes_from_two_stores(project: Project) -> None:
    first = _zip(project, "store-a").read_bytes()
    assert _zip(project, "store-b").read_bytes() == first


def test_carried_zip_agrees_with_the_plan_until_the_series_moves(
        project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    trees = _zip(project)
    carried = project.tmp / "carried.zip"
    carried.write_bytes(trees.read_bytes())

    def plan() -> dict[str, object]:
        capsys.readouterr()
        assert project.run("plan", "--json") == 0
        return dict(json.loads(capsys.readouterr().out))

    nox_file = load_noxfile()
    assert nox_file.trees_mismatch(carried, plan()) is None
    project.patch("route-fix", "server.py", SERVER, SERVER.replace("return 3\n", "return 34\n"))
    why = nox_file.trees_mismatch(carried, plan())
    assert why is not None and "another series" in why


def test_harness_reads_the_zip_by_content(project: Project, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Two zips under one name give their own trees: the extraction is keyed by content."""
    monkeypatch.setattr(vllm_tree, "_CACHE", tmp_path / "cache")
    carried = tmp_path / "vllm-py-trees.zip"
    carried.write_bytes(_zip(project).read_bytes())
    monkeypatch.setenv(vllm_tree.TREES_ENV, str(carried))
    pristine, patched = vllm_tree.trees()
    assert "return 33\n" in (patched / "server.py").read_text()
    assert (patched / "__init__.py").read_text() == (pristine / "__init__.py").read_text()
    assert (pristine / "server.py").read_text() == SERVER
    project.patch("route-fix", "server.py", SERVER, SERVER.replace("return 3\n", "return 34\n"))
    carried.write_bytes(_zip(project).read_bytes())
    assert "return 34\n" in (vllm_tree.tree_root() / "vllm" / "server.py").read_text()


def test_harness_removes_what_the_series_deleted(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    carried = tmp_path / "vllm-py-trees.zip"
    with zipfile.ZipFile(carried, "w") as zf:
        zf.writestr("pristine/vllm/envs.py", "# pristine\n")
        zf.writestr("pristine/vllm/gone.py", "x = 1\n")
        zf.writestr("patched/vllm/envs.py", "# patched\n")
        zf.writestr("trees.json", json.dumps({"patched_deleted": ["vllm/gone.py"]}))
    monkeypatch.setattr(vllm_tree, "_CACHE", tmp_path / "cache")
    monkeypatch.setenv(vllm_tree.TREES_ENV, str(carried))
    pristine, patched = vllm_tree.trees()
    assert (pristine / "gone.py").is_file() and not (patched / "gone.py").exists()
    assert (patched / "envs.py").read_text() == "# patched\n"
