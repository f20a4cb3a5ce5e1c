"""hybrid-sw-block-promote: a drafter's sliding-window layer whose page does not divide the
target's gets the largest block that divides the target's block and fits its page,
instead of its own 16-token block padded to the target's page.

vLLM's own get_kv_cache_groups, get_kv_cache_config_from_groups,
get_max_concurrency_for_kv_cache_config and resolve_kv_cache_block_sizes
(kv_cache_utils.py) run over real spec classes (kv_cache_interface.py) on CPU torch, with
the layer-outer layout (the one that unifies page sizes). The attention kernels that read
the padded pages are not run."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
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

GIB = 2**30
# 4 target full-attention layers: 64-token blocks, 4 KV heads of 128 (bf16): 128 KiB pages.
# 2 drafter sliding-window layers: 16-token blocks, 3 KV heads: 24 KiB, which does not
# divide 128 KiB.
TARGET_BLOCK = 64
PAGE = 64 * 2 * 4 * 128 * 2


class _MultipleOf:
    def __init__(self, base: int) -> None:
        self.base = base


@contextmanager
def _backend_module() -> Iterator[None]:
    """KVCacheSpec.get_block_stride_alignment imports MultipleOf from the attention
    backend module when it runs."""
    mods = {name: make_module(name) for name in ("vllm", "vllm.v1", "vllm.v1.attention")}
    mods["vllm.v1.attention.backend"] = make_module("vllm.v1.attention.backend",
                                                    MultipleOf=_MultipleOf)
    with stub_modules(mods):
        yield


def _load(tree: Path) -> tuple[Any, Any, Any]:
    kvi = load_kv_cache_interface(tree)
    layout = load_module(tree / "v1/kv_cache_layout.py")
    utils = load_with_auto_stubs(tree / "v1/core/kv_cache_utils.py", {
        "vllm.logger": once_logger_module(),
        "vllm.utils.math_utils": load_module(tree / "utils/math_utils.py"),
        "vllm.v1.kv_cache_interface": kvi,
        "vllm.v1.kv_cache_layout": layout,
        "vllm.v1.hisparse.layout": make_module(
            "vllm.v1.hisparse.layout", get_hisparse_kv_cache_groups=lambda *a: None,
            get_hisparse_host_pool_bytes=lambda *a: 0,
            get_hisparse_kv_cache_config=lambda *a: None),
    })
    return kvi, layout, utils


def _config(layout: Any) -> Any:
    return SimpleNamespace(
        scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=False),
        cache_config=SimpleNamespace(
            get_resolved_kv_cache_layout=lambda: layout.KVCacheLayout.LBHNC,
            num_gpu_blocks_override=None, enable_prefix_caching=True,
            prefix_match_unit=None, block_size=TARGET_BLOCK,
            prefix_cache_retention_interval=None),
        model_config=SimpleNamespace(max_model_len=32768),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
        speculative_config=None,
        max_in_flight_tokens=8192,
        attention_config=SimpleNamespace(hisparse_config=None),
        kv_transfer_config=None,
        device_config=SimpleNamespace(device_type="cuda"),
    )


def _specs(kvi: Any, draft_heads: int = 3, draft_block: int = 16) -> dict[str, Any]:
    common = {"head_size": 128, "dtype": torch.bfloat16}
    specs = {f"model.layers.{i}.self_attn.attn": kvi.FullAttentionSpec(
        block_size=TARGET_BLOCK, num_kv_heads=4, **common) for i in range(4)}
    specs |= {f"draft.layers.{i}.self_attn.attn": kvi.SlidingWindowSpec(
        block_size=draft_block, num_kv_heads=draft_heads, sliding_window=2048, **common)
        for i in range(2)}
    return specs


def _draft_spec(utils: Any, vc: Any, specs: dict[str, Any]) -> tuple[Any, list[Any]]:
    with _backend_module():
        groups = utils.get_kv_cache_groups(vc, dict(specs))
    (draft,) = [g for g in groups if g.layer_names[0].startswith("draft.")]
    return draft.kv_cache_spec, groups


def _check(tree: Path) -> None:
    kvi, layout, utils = _load(tree)
    vc = _config(layout)
    spec, groups = _draft_spec(utils, vc, _specs(kvi))
    # 64 tokens * 3 heads * 128 * 2 (K and V) * 2 bytes = 96 KiB, padded to 128 KiB.
    assert spec.block_size == TARGET_BLOCK, spec
    assert spec.page_size_bytes == PAGE and spec.page_size_padded == PAGE
    assert spec.sliding_window == 2048 and spec.num_kv_heads == 3
    with _backend_module():
        config = utils.get_kv_cache_config_from_groups(vc, groups, 4 * GIB)
        # Three groups of two layers: a block id holds two 128 KiB pages. A 32k request
        # takes 2 * 512 full-attention blocks and cdiv(2047 + 8192, 64) + 1 = 161 window
        # blocks (upstream's 16-token blocks: 641).
        assert len(groups) == 3
        assert config.num_blocks == 4 * GIB // (2 * PAGE)
        concurrency = utils.get_max_concurrency_for_kv_cache_config(vc, config)
        assert concurrency == pytest.approx(config.num_blocks / (1024 + 161))
        # The scheduler block size stays the target's; the hash block follows the
        # promoted block.
        assert utils.resolve_kv_cache_block_sizes(config, vc) == (TARGET_BLOCK, TARGET_BLOCK)


def _check_fit(tree: Path) -> None:
    kvi, layout, utils = _load(tree)
    vc = _config(layout)
    # 5 heads: 64 tokens take 160 KiB, more than the page; 32 tokens (80 KiB) is the
    # largest multiple of 16 dividing 64 that fits.
    spec, _ = _draft_spec(utils, vc, _specs(kvi, draft_heads=5))
    assert (spec.block_size, spec.page_size_bytes) == (32, PAGE), spec
    # A block that does not divide the target's is padded as upstream pads it.
    spec, _ = _draft_spec(utils, vc, _specs(kvi, draft_block=24))
    assert (spec.block_size, spec.page_size_padded) == (24, PAGE), spec


def test_patched_promotes_draft_sw_block(patched_vllm: Path) -> None:
    _check(patched_vllm)


def test_patched_promotes_to_largest_fitting_divisor(patched_vllm: Path) -> None:
    _check_fit(patched_vllm)


def test_pristine_pads_the_draft_page(pristine_vllm: Path) -> None:
    assert_pristine_lacks(lambda: _check(pristine_vllm))
    kvi, layout, utils = _load(pristine_vllm)
    spec, _ = _draft_spec(utils, _config(layout), _specs(kvi))
    assert (spec.block_size, spec.page_size_padded) == (16, PAGE)
