"""The lane-by-lane model of fa2/fp8-kv.diff's decode kernel agrees with float64 attention.

fa2/fp8kv_decode_emulation.py replays the kernel's index logic on the CPU (fragment layouts,
swizzled staging, the permuted head-dim order, the warps' padded combine rows, the splits'
cut and the last split's merge); a wrong index there gives an O(1) error, float64 rounding
~1e-15. It runs where no GPU is, so CI checks what the GPU tests cannot reach here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("seed", [0, 1])
def test_emulated_kernel_matches_float64_attention(seed: int) -> None:
    pytest.importorskip("numpy")
    script = ROOT / "fa2" / "fp8kv_decode_emulation.py"
    run = subprocess.run([sys.executable, str(script), str(seed)],
                         capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert sum("splits merged" in line for line in lines) == 8, run.stdout  # 4 cases x 2 head dims
    worst = float(lines[-1].split()[-1])
    assert worst < 1e-12, run.stdout


@pytest.mark.parametrize("argv", [["abc"], ["-1"], ["1", "2"]])
def test_emulation_refuses_a_bad_seed(argv: list[str]) -> None:
    run = subprocess.run([sys.executable, str(ROOT / "fa2" / "fp8kv_decode_emulation.py"), *argv],
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.startswith("usage:") and "Traceback" not in run.stderr
