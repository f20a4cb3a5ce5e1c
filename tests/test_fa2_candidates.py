"""Every diff under fa2/candidates/ applies at fuzz 0 to the FA2 tree the recipe pins.

The lint's fa2-upstream rule checks fa2/fp8-kv.diff, the diff the recipe carries; the
candidates wait for a GPU call to prove them (fa2/README.md, Next), and one that stopped
applying would only show on that call, with device time spent. The tree comes from the
recipe's mirror folder (skipped where there is none, as on a machine without the mirror).
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CANDIDATES = sorted((ROOT / "fa2" / "candidates").glob("*.diff"))


def _fa2_archive() -> Path | None:
    recipe = tomllib.loads((ROOT / "recipe.toml").read_text())
    commit = str(recipe["sources"][recipe["fa2"]["source"]]["commit"])
    for mirror in recipe["fetch"]["mirrors"]:
        found = sorted((ROOT / str(mirror)).glob(f"vllm-flash-attention-{commit[:8]}*.tar*"))
        if found:
            return found[0]
    return None


@pytest.fixture(scope="module")
def pinned_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    archive = _fa2_archive()
    if archive is None:
        pytest.skip("no mirror of the pinned flash-attention tree beside this checkout")
    if shutil.which("patch") is None:
        pytest.skip("no GNU patch")
    out = tmp_path_factory.mktemp("fa2-pinned")
    with tarfile.open(archive) as tar:
        tar.extractall(out, filter="data")
    (tree,) = [p for p in out.iterdir() if p.is_dir()]
    return tree


def test_there_are_candidates() -> None:
    assert CANDIDATES, "fa2/candidates/ holds no diff: drop this test or the README's Next"


@pytest.mark.parametrize("diff", CANDIDATES, ids=[d.name for d in CANDIDATES])
def test_candidate_applies_at_fuzz_0(diff: Path, pinned_tree: Path, tmp_path: Path) -> None:
    work = tmp_path / "tree"
    shutil.copytree(pinned_tree, work, symlinks=True)
    with diff.open("rb") as f:
        res = subprocess.run(["patch", "-p1", "--fuzz=0", "--forward", "--batch"], stdin=f,
                             cwd=work, capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    # It changed the tree (a diff of prose alone would "apply" too).
    assert "Kv_fp8" in (work / "csrc/flash_attn/src/flash_fwd_kernel.h").read_text()
