"""compile-key-runtime-knobs: changing a runtime-only knob leaves envs.compile_factors()
(the torch.compile cache key) unchanged; a knob that does affect kernels still changes it."""

from __future__ import annotations

from pathlib import Path

import pytest

from ._helpers import assert_pristine_lacks, envs_stubs_active, load_envs, tree_before

pytestmark = pytest.mark.e2e

RUNTIME_KNOBS = {
    "VLLM_ENGINE_STALL_SENTINEL_S": "30",
    "VLLM_MAMBA_ALIGN_KEEP_CHECKPOINTS": "0",
    "VLLM_DFLASH2_CHAIN_LOG_SEC": "5",
    "VLLM_MARLIN_TUNE_DIR": "/opt/marlin-tune",
    "VLLM_PREFIX_CACHE_RETENTION_INTERVAL": "60",
}


def _check(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    envs = load_envs(tree)
    for name in RUNTIME_KNOBS:
        monkeypatch.delenv(name, raising=False)
        assert name in envs.environment_variables, f"{name} not registered"
    monkeypatch.delenv("VLLM_INT4_MQ_3D", raising=False)
    with envs_stubs_active(envs):
        base = envs.compile_factors()
        for name, value in RUNTIME_KNOBS.items():
            assert name not in base, f"{name} is in the compile key"
            monkeypatch.setenv(name, value)
            assert envs.compile_factors() == base, f"changing {name} changes the key"
            monkeypatch.delenv(name)
        # A kernel-selecting knob still changes the key.
        monkeypatch.setenv("VLLM_INT4_MQ_3D", "1")
        assert envs.compile_factors() != base
        monkeypatch.delenv("VLLM_INT4_MQ_3D")


def test_patched_runtime_knobs_out_of_key(patched_vllm: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    _check(patched_vllm, monkeypatch)


def test_tree_before_patch_lacks_it(pristine_vllm: Path, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # The knobs exist before this patch (speed-knobs-envs, engine-stall-sentinel), and they
    # are in the key there; on pristine they are not even registered.
    before = tree_before(pristine_vllm, tmp_path, "compile-key-runtime-knobs")
    assert_pristine_lacks(lambda: _check(before, monkeypatch))
    assert_pristine_lacks(lambda: _check(pristine_vllm, monkeypatch))
