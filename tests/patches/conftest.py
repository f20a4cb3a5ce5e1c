"""Fixtures for the patch behaviour tests.

``pristine_vllm`` and ``patched_vllm`` are two directories, each holding the files of the
``vllm/`` package (pass ``patched_vllm / "entrypoints/..."``): the pristine 0.32.0 wheel's
files (the locked wheel in the store), and the same files read from the wheel the engine
built from the recipe's series. Only the members the series touches and the extra modules
the tests load are extracted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from qwen38build.inputs import recipe

REPO = Path(__file__).resolve().parents[2]
PATCHES_DIR = REPO / "patches"
# The series in apply order, as the recipe lists it (one place: recipe.toml).
_LOADED = recipe.load(REPO / "recipe.toml")
SERIES = [e.topic for e in _LOADED.series_entries() if e.group == "patches"]
# The pin the series is cut on (after a bump, the new one: patch headers and messages say it).
PIN = _LOADED.recipe.vllm.version

# Package files the tests load beyond those the series touches (relative to vllm/).
EXTRA_MEMBERS: list[str] = [
    "entrypoints/openai/models/protocol.py",
    "scalar_type.py",
    "entrypoints/serve/utils/api_utils.py",
    "entrypoints/openai/chat_completion/stream_processor.py",  # 0.33.0's chat stream
    "utils/math_utils.py",
    "transformers_utils/config.py",
    "model_executor/models/qwen3_5.py",
    "v1/sample/ops/topk_topp_sampler.py",
    "model_executor/models/qwen3_5_mtp.py",
    "transformers_utils/configs/eagle.py",
    "v1/kv_cache_interface.py",
    "v1/kv_cache_layout.py",
    "v1/kv_cache_spec_registry.py",
    "v1/core/block_pool.py",
    "v1/core/kv_cache_utils.py",
    "v1/hisparse/layout.py",
    "v1/metrics/stats.py",
    "v1/request.py",
    "v1/core/sched/utils.py",
    "v1/engine/detokenizer.py",
    "v1/engine/logprobs.py",
    "v1/engine/parallel_sampling.py",
    "v1/attention/backend.py",
    "v1/worker/utils.py",
    "v1/worker/mamba_utils.py",
    "model_executor/layers/mamba/mamba_utils.py",
    "v1/attention/backends/utils.py",
    "model_executor/layers/fused_moe/config.py",
    "model_executor/layers/fused_moe/layer.py",
    "model_executor/layers/fused_moe/experts/marlin_moe.py",
    "model_executor/layers/quantization/utils/marlin_utils_fp8.py",
    "model_executor/layers/quantization/compressed_tensors/compressed_tensors_moe/"
    "compressed_tensors_moe.py",
    "v1/core/kv_cache_coordinator.py",
    "utils/b12x.py",
    "model_executor/layers/quantization/modelopt.py",
    "model_executor/layers/quantization/modelopt_block_quant.py",
    "model_executor/layers/logits_processor.py",
    "model_executor/models/interfaces.py",
    "v1/worker/gpu/spec_decode/eagle/utils.py",
    "v1/attention/backends/registry.py",
    "v1/attention/selector.py",
    "plugins/__init__.py",
    "v1/worker/gpu/warmup.py",
]


def _build() -> dict[str, str]:
    """Build the project's recipe with the engine (a store hit after the first run)."""
    proc = subprocess.run(
        [sys.executable, "-m", "qwen38build", "--recipe", str(REPO / "recipe.toml"), "build",
         "--only", "vllm", "--json", "--no-link", "-q"],
        capture_output=True, text=True, cwd=REPO, check=False,
    )
    if proc.returncode != 0:
        pytest.fail(f"the build of the project's series failed:\n{proc.stderr}")
    out: dict[str, str] = json.loads(proc.stdout)
    return out


def _extract(wheel: Path, members: set[str], dest: Path) -> Path:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        for member in sorted(members):
            if f"vllm/{member}" in names:
                zf.extract(f"vllm/{member}", dest)
    (dest / "vllm").mkdir(parents=True, exist_ok=True)
    return dest / "vllm"


def built_wheels() -> tuple[Path, Path, set[str]]:
    """(patched wheel, pristine wheel, members the series and the tests read), from the
    engine's build of the recipe (a store hit after the first run)."""
    built = _build()
    wheel = Path(built["wheel"])
    manifest = json.loads((wheel.parent / "manifest.json").read_text())
    store = Path(built["store"])
    record = json.loads((store / "builds" / f"{built['build']}.json").read_text())
    fetch = next(s for s in record["steps"] if s["derivation"]["kind"] == "fetch")
    pristine_wheel = next((store / "objects" / fetch["digest"]).glob("*.whl"))
    return wheel, pristine_wheel, set(EXTRA_MEMBERS) | set(manifest["owned"])


@pytest.fixture(scope="session")
def _vllm_trees(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The pristine files from the locked wheel, the patched ones from the built wheel."""
    wheel, pristine_wheel, members = built_wheels()
    root = tmp_path_factory.mktemp("vllm-trees")
    return (_extract(pristine_wheel, members, root / "pristine"),
            _extract(wheel, members, root / "patched"))


@pytest.fixture(scope="session")
def pristine_vllm(_vllm_trees: tuple[Path, Path]) -> Path:
    return _vllm_trees[0]


# bench/series_cuts.py points the patched tests at a tree cut before or through a patch.
PATCHED_TREE_ENV = "QWEN38_PATCHED_VLLM"


@pytest.fixture(scope="session")
def patched_vllm(_vllm_trees: tuple[Path, Path]) -> Path:
    override = os.environ.get(PATCHED_TREE_ENV)
    return Path(override) if override else _vllm_trees[1]
