"""The GPU tests' one harness (tests/gpu/vllm_tree.py), its host half: where the trees come
from (QWEN38_VLLM_TREE / QWEN38_VLLM_PRISTINE, QWEN38_VLLM_TREES, a zip), what a missing tree
does, and where record_line writes. The loading itself runs in the GPU tests."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from tests.gpu import vllm_tree


def _tree(root: Path) -> Path:
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "envs.py").write_text("# a vLLM tree\n")
    return root


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (vllm_tree.TREE_ENV, vllm_tree.PRISTINE_ENV, vllm_tree.TREES_ENV,
                 vllm_tree.RESULTS_ENV):
        monkeypatch.delenv(name, raising=False)


def test_single_trees(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    patched, pristine = _tree(tmp_path / "p"), _tree(tmp_path / "o")
    monkeypatch.setenv(vllm_tree.TREE_ENV, str(patched))
    monkeypatch.setenv(vllm_tree.PRISTINE_ENV, str(pristine))
    assert vllm_tree.tree_root() == patched
    assert vllm_tree.trees() == (pristine / "vllm", patched / "vllm")


def test_tree_pair_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _tree(tmp_path / "pristine")
    _tree(tmp_path / "patched")
    monkeypatch.setenv(vllm_tree.TREES_ENV, str(tmp_path))
    assert vllm_tree.trees() == (tmp_path / "pristine" / "vllm", tmp_path / "patched" / "vllm")


def test_zip_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = tmp_path / "full.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("vllm/envs.py", "# a vLLM tree\n")
        zf.writestr("vllm/_C.abi3.so", b"\0")  # not a .py: left out
    monkeypatch.setattr(vllm_tree, "_CACHE", tmp_path / "cache")
    monkeypatch.setenv(vllm_tree.TREE_ENV, str(archive))
    root = vllm_tree.tree_root()
    assert (root / "vllm" / "envs.py").is_file()
    assert not (root / "vllm" / "_C.abi3.so").exists()


def test_no_pristine_is_a_skip_or_a_failure(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(vllm_tree.TREE_ENV, str(_tree(tmp_path / "p")))
    monkeypatch.setattr(vllm_tree, "REQUIRED", False)
    with pytest.raises(pytest.skip.Exception, match=vllm_tree.PRISTINE_ENV):
        vllm_tree.trees()
    monkeypatch.setattr(vllm_tree, "REQUIRED", True)
    with pytest.raises(pytest.fail.Exception, match="QWEN38_GPU_REQUIRED"):
        vllm_tree.trees()


def test_not_a_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "p" / "vllm").mkdir(parents=True)
    monkeypatch.setenv(vllm_tree.TREE_ENV, str(tmp_path / "p"))
    monkeypatch.setenv(vllm_tree.PRISTINE_ENV, str(_tree(tmp_path / "o")))
    monkeypatch.setattr(vllm_tree, "REQUIRED", False)
    with pytest.raises(pytest.skip.Exception, match="is not a vLLM tree"):
        vllm_tree.trees()


def test_record_line_file_or_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(vllm_tree.RESULTS_ENV, str(tmp_path / "results.txt"))
    vllm_tree.record_line("one")
    vllm_tree.record_line("two")
    assert (tmp_path / "results.txt").read_text() == "one\ntwo\n"
    monkeypatch.setenv(vllm_tree.RESULTS_ENV, str(tmp_path / "out"))
    vllm_tree.record_line("three")
    assert (tmp_path / "out" / "results.txt").read_text() == "three\n"
