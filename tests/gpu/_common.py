"""Shared rules of the vLLM-tree GPU tests: the skip/require rule, the tree, results."""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import Any

import pytest

# Under `nox -s gpu_tests` (QWEN38_GPU_REQUIRED=1) a missing stack fails: there, a skip
# would be a pass that tested nothing.
REQUIRED = os.environ.get("QWEN38_GPU_REQUIRED") == "1"
RESULTS_ENV = "QWEN38_GPU_RESULTS"


def require_cuda() -> Any:
    """torch with a CUDA device and Triton, else skip (fail under QWEN38_GPU_REQUIRED)."""
    def missing(reason: str) -> None:
        if REQUIRED:
            pytest.fail(f"{reason} (QWEN38_GPU_REQUIRED is set)", pytrace=False)
        pytest.skip(reason, allow_module_level=True)

    try:
        import torch
    except ImportError:
        missing("torch is not installed: no GPU tests")
    if not torch.cuda.is_available():
        missing("no CUDA GPU visible to torch")
    try:
        import triton  # noqa: F401
    except ImportError:
        missing("Triton is not installed: the vLLM kernels need it")
    return torch


def card() -> str:
    import torch
    import triton

    p = torch.cuda.get_device_properties(0)
    return (f"{p.name} (sm{p.major}{p.minor}), torch {torch.__version__}, "
            f"Triton {triton.__version__}, {datetime.date.today().isoformat()}")


def record(name: str, lines: list[str]) -> None:
    """Print a result table and, with $QWEN38_GPU_RESULTS set, write it there as NAME.md."""
    text = "\n".join([f"# {name}", "", f"Card: {card()}", "", *lines, ""])
    print(text)
    out = os.environ.get(RESULTS_ENV)
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"{name}.md").write_text(text)
