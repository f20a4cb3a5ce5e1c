"""The GPU call's scripts refuse bad arguments here, before a device call is spent on them:
one line, exit 2, nothing written (a wrong folder once packed an empty archive with exit 0)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, check=False,
                          timeout=120)


@pytest.mark.parametrize("carried", ["missing", "a-file", "empty-dir"])
def test_gpu_call_refuses_what_is_not_a_carried_folder(tmp_path: Path, carried: str) -> None:
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "empty-dir").mkdir()
    out = tmp_path / "out"
    res = _run(["bash", str(REPO / "bench" / "gpu_call.sh"), str(tmp_path / carried), str(out)],
               tmp_path)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "CARRIED holds wheels/ and sources/" in res.stderr
    assert not out.exists()


def test_gpu_call_wants_both_arguments(tmp_path: Path) -> None:
    res = _run(["bash", str(REPO / "bench" / "gpu_call.sh")], tmp_path)
    assert res.returncode == 2 and "usage" in res.stderr


@pytest.mark.parametrize("argv,message", [
    (["run", "{tmp}/nope"], "not a pack (no pack.json"),
    (["run", "{tmp}/pack", "--trees", "{tmp}/pack/pack.json"], "not the zip of"),
    (["pack", "{tmp}/out", "no-such-topic"], "not in the recipe's patches/ group"),
    (["pack", "{tmp}/out"], "the following arguments are required"),
])
def test_series_cuts_refuses_bad_input(tmp_path: Path, argv: list[str], message: str) -> None:
    (tmp_path / "pack").mkdir()
    (tmp_path / "pack" / "pack.json").write_text("{}")
    args = [a.format(tmp=tmp_path) for a in argv]
    res = _run([sys.executable, str(REPO / "bench" / "gpu_series_cuts.py"), *args], REPO)
    assert res.returncode == 2, res.stdout + res.stderr
    assert message in res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("grid", ["abc", "1x2x3", "1x0", "4x-8"])
def test_fa2_benches_refuse_a_bad_grid(grid: str) -> None:
    pytest.importorskip("torch")
    for bench in ("fa2_fp8.py", "fa2_splits.py", "fa2_kernels.py"):
        res = _run([sys.executable, str(REPO / "bench" / bench), "--grid", grid], REPO)
        assert res.returncode == 2, res.stdout + res.stderr
        assert "--grid" in res.stderr and "Traceback" not in res.stderr


def test_fa2_benches_need_a_gpu_and_say_so() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible: the benches would run")
    for bench in ("fa2_fp8.py", "fa2_splits.py", "fa2_kernels.py"):
        res = _run([sys.executable, str(REPO / "bench" / bench), "--grid", "1x1024"], REPO)
        assert res.returncode == 2, res.stdout + res.stderr
        assert "no CUDA GPU" in res.stderr and "Traceback" not in res.stderr
