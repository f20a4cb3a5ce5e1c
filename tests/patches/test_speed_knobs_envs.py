"""speed-knobs-envs: this repo's local knobs are registered in vllm/envs.py, parse from the
environment with their defaults, and are read through vllm.envs."""

from __future__ import annotations

from pathlib import Path

import pytest

from ._helpers import assert_pristine_lacks, load_envs

pytestmark = pytest.mark.e2e

# name -> (default, a value to set, what it parses to)
KNOBS = {
    "VLLM_INT4_MQ_3D": (False, "1", True),
    "VLLM_INT4_MQ_3D_DEBUG": (False, "1", True),
    "VLLM_MARLIN_REPACK_STAGED": (False, "1", True),
    "VLLM_MARLIN_TUNE_DIR": (None, "/opt/marlin-tune", "/opt/marlin-tune"),
    "VLLM_DFLASH2_CHAIN_LOG_SEC": (0.0, "2.5", 2.5),
    "VLLM_MAMBA_ALIGN_KEEP_CHECKPOINTS": (True, "0", False),
    "VLLM_PREFIX_CACHE_RETENTION_INTERVAL": (None, "30", 30.0),
}


def _check(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    envs = load_envs(tree)
    for name, (default, raw, parsed) in KNOBS.items():
        assert name in envs.environment_variables, f"{name} not registered"
        assert name in envs.__dir__()
        monkeypatch.delenv(name, raising=False)
        assert getattr(envs, name) == default, name
        monkeypatch.setenv(name, raw)
        assert getattr(envs, name) == parsed, name
        assert envs.is_set(name)
        monkeypatch.delenv(name)


def test_patched_registers_local_knobs(patched_vllm: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _check(patched_vllm, monkeypatch)


def test_patched_type_hints(patched_vllm: Path) -> None:
    src = (patched_vllm / "envs.py").read_text()
    head = src[: src.index("def get_default_cache_root")]
    for name in KNOBS:
        assert f"    {name}: " in head, f"{name} has no TYPE_CHECKING annotation"


def test_pristine_lacks_local_knobs(pristine_vllm: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    assert_pristine_lacks(lambda: _check(pristine_vllm, monkeypatch))
