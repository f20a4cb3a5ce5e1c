"""hybrid-kv-groups-v2-cudagraph: with a speculative drafter, a sliding-window bucket
smaller than every other bucket (a DFlash drafter's sliding-window layers) no longer sizes
the KV cache groups; it is padded to the size the target's buckets give.

vLLM's own get_kv_cache_groups and get_kv_cache_config_from_groups (kv_cache_utils.py) run
over real spec classes (FullAttentionSpec, SlidingWindowSpec, MambaSpec from
kv_cache_interface.py, on CPU torch) and vLLM's own HiSparse layout module (off here). The
config is a stand-in with the fields these functions read. How many groups the V2 runner
then keeps block tables and slot mappings for is len(groups); the runner itself needs a GPU
and is not run."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ._helpers import (
    assert_pristine_lacks,
    load_kv_cache_interface,
    load_module,
    load_with_auto_stubs,
    make_module,
    once_logger_module,
    stub_modules,
)

pytestmark = pytest.mark.e2e
torch = pytest.importorskip("torch")

# A Qwen3.5-shaped target: 64 layers, every fourth full attention (4 KV heads of 256), the
# rest GDN. The attention block size is one whose page holds a GDN state (conv (3, 8192)
# and ssm (32, 128, 128), bf16), and the GDN page is padded to it, as the platform does.
BLOCK = 272
TARGET_LAYERS = 64
WINDOW = 2048


def _modules(tree: Path) -> tuple[Any, Any]:
    kvi = load_kv_cache_interface(tree)
    logger = once_logger_module()
    math_utils = load_module(tree / "utils/math_utils.py")
    common = {"vllm.logger": logger, "vllm.utils.math_utils": math_utils,
              "vllm.v1.kv_cache_interface": kvi}
    hisparse = load_with_auto_stubs(tree / "v1/hisparse/layout.py", common)
    utils = load_with_auto_stubs(tree / "v1/core/kv_cache_utils.py", {
        **common, "vllm.v1.hisparse.layout": hisparse})
    planning = tree / "v1/core/kv_cache_planning.py"
    if planning.exists():  # 0.33.0 moved the grouping there from kv_cache_utils.py
        return kvi, load_with_auto_stubs(planning, {
            **common, "vllm.v1.hisparse.layout": hisparse,
            "vllm.v1.core.kv_cache_utils": utils})
    return kvi, utils


def _config(kvi: Any, method: str | None) -> Any:
    # use_eagle() as SpeculativeConfig answers it (dflash and eagle3 are in its list), so
    # the eagle-group annotation after the grouping runs as it does for these drafters.
    spec_config = None if method is None else SimpleNamespace(
        method=method, use_eagle=lambda: True, use_eagle_block_drop=lambda: True)
    return SimpleNamespace(
        speculative_config=spec_config,
        model_config=SimpleNamespace(hf_config=SimpleNamespace(model_type="qwen3_5")),
        scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=False),
        attention_config=SimpleNamespace(hisparse_config=None),
        cache_config=SimpleNamespace(
            get_resolved_kv_cache_layout=lambda: kvi.KVCacheLayout.LBHNC,
            num_gpu_blocks_override=None, prefix_cache_retention_interval=None),
    )


def _specs(kvi: Any, draft_sliding: int) -> tuple[dict[str, Any], Any]:
    """The target's layers, then a five-layer DFlash drafter's: ``draft_sliding`` of them
    sliding-window, the others full attention like the target's."""
    attn = {"block_size": BLOCK, "num_kv_heads": 4, "head_size": 256,
            "dtype": torch.bfloat16}
    full = kvi.FullAttentionSpec(**attn)
    window = kvi.SlidingWindowSpec(sliding_window=WINDOW, **attn)
    gdn = kvi.MambaSpec(block_size=BLOCK, shapes=((3, 8192), (32, 128, 128)),
                        dtypes=(torch.bfloat16, torch.bfloat16),
                        mamba_type=kvi.MambaAttentionBackendEnum.GDN_ATTN,
                        page_size_padded=full.page_size_bytes)
    assert gdn.real_page_size_bytes <= full.page_size_bytes
    specs: dict[str, Any] = {}
    for i in range(TARGET_LAYERS):
        kind = "self_attn.attn" if i % 4 == 3 else "linear_attn"
        specs[f"model.layers.{i}.{kind}"] = full if i % 4 == 3 else gdn
    for j in range(5):
        specs[f"draft.layers.{j}.self_attn.attn"] = window if j >= 5 - draft_sliding else full
    return specs, full


def _summary(groups: list[Any]) -> list[tuple[str, int]]:
    return [(type(g.kv_cache_spec).__name__, len(g.layer_names)) for g in groups]


def _check_drafter_window_does_not_size_groups(tree: Path) -> None:
    kvi, utils = _modules(tree)
    specs, full = _specs(kvi, draft_sliding=1)
    vc = _config(kvi, "dflash")
    groups = utils.get_kv_cache_groups(vc, dict(specs))
    # 20 full attention layers (16 target, 4 drafter) in one group, 48 GDN layers in
    # three, the drafter's window layer alone (pristine: 69 groups of one layer each).
    assert _summary(groups) == [("MambaSpec", 16)] * 3 + [
        ("FullAttentionSpec", 20), ("SlidingWindowSpec", 1)], _summary(groups)
    assert groups[-1].layer_names == ["draft.layers.4.self_attn.attn"]
    names = [n for g in groups for n in g.layer_names]
    assert sorted(names) == sorted(specs)
    # The padded groups still make a KV cache config: a block spans the widest group's
    # 20 pages, and every layer has its view in exactly one tensor.
    page = full.page_size_bytes
    # get_block_stride_alignment imports MultipleOf from the attention backend module (a
    # GPU-side import); no spec here sets an alignment, so a bare class stands in.
    backend = make_module("vllm.v1.attention.backend", MultipleOf=type("MultipleOf", (), {}))
    with stub_modules({"vllm.v1.attention.backend": backend}):
        config = utils.get_kv_cache_config_from_groups(vc, groups,
                                                       available_memory=1000 * 20 * page)
    assert config.num_blocks == 1000
    tensor_layers = [n for t in config.kv_cache_tensors for n in t.layers]
    assert sorted(tensor_layers) == sorted(specs)


def test_patched_drafter_window_does_not_size_groups(patched_vllm: Path) -> None:
    _check_drafter_window_does_not_size_groups(patched_vllm)


def test_pristine_sizes_groups_by_drafter_window(pristine_vllm: Path) -> None:
    assert_pristine_lacks(lambda: _check_drafter_window_does_not_size_groups(pristine_vllm))
    kvi, utils = _modules(pristine_vllm)
    specs, _ = _specs(kvi, draft_sliding=1)
    groups = utils.get_kv_cache_groups(_config(kvi, "dflash"), dict(specs))
    assert len(groups) == TARGET_LAYERS + 5
    assert {len(g.layer_names) for g in groups} == {1}


def test_patched_without_drafter_sizes_as_before(patched_vllm: Path,
                                                 pristine_vllm: Path) -> None:
    """No speculative config: the same specs group as on pristine vLLM, window layer
    included (the rule is the drafter's only)."""
    results = []
    for tree in (patched_vllm, pristine_vllm):
        kvi, utils = _modules(tree)
        specs, _ = _specs(kvi, draft_sliding=1)
        results.append(_summary(utils.get_kv_cache_groups(_config(kvi, None), dict(specs))))
    assert results[0] == results[1]
    assert len(results[0]) == TARGET_LAYERS + 5


def test_patched_window_bucket_not_smallest_is_unchanged(patched_vllm: Path) -> None:
    """A sliding-window bucket that is not the smallest keeps upstream's sizing: a
    Gemma-like target (five sliding-window layers to one full attention) with a drafter
    configured is grouped by its smallest bucket, the full attention one."""
    kvi, utils = _modules(patched_vllm)
    attn = {"block_size": 16, "num_kv_heads": 8, "head_size": 128, "dtype": torch.bfloat16}
    full = kvi.FullAttentionSpec(**attn)
    window = kvi.SlidingWindowSpec(sliding_window=1024, **attn)
    specs = {f"model.layers.{i}.self_attn.attn": full if i % 6 == 5 else window
             for i in range(60)}
    groups = utils.get_kv_cache_groups(_config(kvi, "eagle3"), dict(specs))
    assert _summary(groups) == [("SlidingWindowSpec", 10)] * 5 + [("FullAttentionSpec", 10)]
