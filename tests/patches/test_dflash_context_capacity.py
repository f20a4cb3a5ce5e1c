"""dflash-context-capacity: a DFlash setup whose context plus the drafter's fixed lookahead
(1 + num_speculative_tokens) exceeds the drafter's max_position_embeddings is rejected at
config time, naming the largest context that fits; setups that fit pass."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ._helpers import assert_pristine_lacks, exec_function

pytestmark = pytest.mark.e2e


def _verify(tree: Path) -> Any:
    fn = exec_function(tree / "config/speculative.py",
                       "SpeculativeConfig._verify_dflash_context_capacity",
                       {"PreTrainedConfig": object})
    return fn.__func__ if isinstance(fn, staticmethod) else fn


def _check(tree: Path) -> None:
    verify = _verify(tree)
    cfg = SimpleNamespace(max_position_embeddings=32768)
    # Fits exactly: 32760 + 1 + 7 == 32768.
    verify(cfg, 32760, 7)
    verify(SimpleNamespace(), 10**6, 7)  # no declared capacity: nothing to check
    with pytest.raises(ValueError, match="32761") as exc:
        verify(cfg, 32761, 7)
    assert "at most 32760" in str(exc.value)
    with pytest.raises(ValueError):
        verify(cfg, 40960, 15)
    # The check runs for DFlash in SpeculativeConfig's setup, with the context bounded by
    # the speculative max_model_len when one is set.
    src = (tree / "config/speculative.py").read_text()
    calls = [n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute)
             and n.func.attr == "_verify_dflash_context_capacity"]
    assert calls, "the check is never called"
    assert "self.max_model_len or self.target_model_config.max_model_len" in ast.unparse(
        calls[0])


def test_patched_rejects_overlong_context(patched_vllm: Path) -> None:
    _check(patched_vllm)


def test_pristine_has_no_capacity_check(pristine_vllm: Path) -> None:
    assert_pristine_lacks(lambda: _check(pristine_vllm))
