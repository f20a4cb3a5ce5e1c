"""hybrid-sw-block-promote: an unpadded sliding-window layer takes the largest supported
kernel block that divides the primary block, so unify scales its page instead of padding
it and the scheduler block stays the primary block.

vLLM's own Attention.get_kv_cache_spec (attention.py, with its block selection helpers)
builds the specs; the backend is vLLM's AttentionBackend answering FlashInfer's sizes below
Blackwell (16, 32, 64: flashinfer.py's get_supported_kernel_block_sizes, whose module needs
the flashinfer package). The specs then go through vLLM's get_kv_cache_groups,
get_kv_cache_config_from_groups and resolve_kv_cache_block_sizes (kv_cache_utils.py), and
the kernel block through select_common_block_size (v1/worker/utils.py), all on CPU torch.
The layer object is a stand-in with the attributes get_kv_cache_spec reads."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ._helpers import (
    Either,
    assert_pristine_lacks,
    exec_function,
    load_kv_cache_interface,
    load_module,
    load_with_auto_stubs,
    once_logger_module,
    stub_modules,
)

pytestmark = pytest.mark.e2e
torch = pytest.importorskip("torch")

# Qwen3.5's hybrid primary block: the attention page (4 KV heads of 256, bf16) that holds a
# GDN state; 272 = 16 x 17.
BLOCK = 272
WINDOW = 2048
TARGET_LAYERS = 8


class Vllm:
    """The modules of one tree: kv_cache_interface, attention backend, attention layer,
    kv_cache_utils."""

    def __init__(self, tree: Path) -> None:
        self.kvi = load_kv_cache_interface(tree)
        self.backend = load_with_auto_stubs(
            tree / "v1/attention/backend.py", {"vllm.v1.kv_cache_interface": self.kvi},
            loose=True)
        self.attention = load_with_auto_stubs(
            tree / "model_executor/layers/attention/attention.py",
            {"vllm.v1.kv_cache_interface": self.kvi,
             "vllm.v1.attention.backend": self.backend}, loose=True)
        common = {"vllm.logger": once_logger_module(),
                  "vllm.utils.math_utils": load_module(tree / "utils/math_utils.py"),
                  "vllm.v1.kv_cache_interface": self.kvi,
                  "vllm.v1.attention.backend": self.backend}
        hisparse = load_with_auto_stubs(tree / "v1/hisparse/layout.py", common)
        utils = load_with_auto_stubs(tree / "v1/core/kv_cache_utils.py", {
            **common, "vllm.v1.hisparse.layout": hisparse})
        self.utils: Any = utils
        planning = tree / "v1/core/kv_cache_planning.py"
        if planning.exists():  # 0.33.0 moved the grouping and page sizing there
            self.utils = Either(load_with_auto_stubs(planning, {
                **common, "vllm.v1.hisparse.layout": hisparse,
                "vllm.v1.core.kv_cache_utils": utils}), utils)
        ns = {"MultipleOf": self.backend.MultipleOf, "AttentionBackend": Any,
              "KVCacheSpec": Any, "Sequence": Any}
        ns["_block_size_is_supported"] = exec_function(
            tree / "v1/worker/utils.py", "_block_size_is_supported", ns)
        self.select_common_block_size = exec_function(
            tree / "v1/worker/utils.py", "select_common_block_size", ns)
        self.stubs = {"vllm.v1.attention.backend": self.backend}

    def fixed_backend(self, sizes: list[Any]) -> Any:
        """vLLM's AttentionBackend with a fixed list of kernel block sizes."""
        return type("FixedSizesBackend", (self.backend.AttentionBackend,), {
            "get_supported_kernel_block_sizes": staticmethod(lambda kv_cache_spec=None: sizes),
            "get_name": staticmethod(lambda: "FIXED_SIZES"),
        })

    def layer_spec(self, backend: Any, *, sliding_window: int | None, block_size: int = BLOCK,
                   shared_page: int | None = None, num_kv_heads: int = 4,
                   mamba_page: int | None = None) -> Any:
        layer = SimpleNamespace(
            attn_type=self.backend.AttentionType.DECODER, kv_cache_dtype="auto",
            sliding_window=sliding_window, attn_backend=backend, num_kv_heads=num_kv_heads,
            head_size=256, head_size_v=256, kv_cache_torch_dtype=torch.bfloat16)
        config = SimpleNamespace(cache_config=SimpleNamespace(
            block_size=block_size, skip_page_size_padded=shared_page,
            mamba_page_size_padded=mamba_page))
        with stub_modules(self.stubs):
            return self.attention.Attention.get_kv_cache_spec(layer, config)


FLASHINFER_SIZES = [16, 32, 64]


def _vllm_config(kvi: Any) -> Any:
    return SimpleNamespace(
        speculative_config=SimpleNamespace(
            method="dflash", use_eagle=lambda: True, use_eagle_block_drop=lambda: True),
        model_config=SimpleNamespace(hf_config=SimpleNamespace(model_type="qwen3_5")),
        scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=False),
        attention_config=SimpleNamespace(hisparse_config=None),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
        kv_transfer_config=None,
        cache_config=SimpleNamespace(
            block_size=BLOCK, enable_prefix_caching=False, prefix_match_unit=None,
            get_resolved_kv_cache_layout=lambda: kvi.KVCacheLayout.LBHNC,
            num_gpu_blocks_override=None, prefix_cache_retention_interval=None),
    )


def _hybrid_groups(v: Vllm, draft_heads: int = 4) -> tuple[Any, Any, Any]:
    """A hybrid target (GDN and full attention at the 272 block) with a DFlash drafter of
    two full attention layers and one sliding-window layer, specs from get_kv_cache_spec;
    returns (the drafter's window spec as the layer gave it, the groups, the config)."""
    backend = v.fixed_backend(FLASHINFER_SIZES)
    full = v.layer_spec(backend, sliding_window=None)
    # The platform pads the GDN page to the attention page and records it.
    window = v.layer_spec(backend, sliding_window=WINDOW, num_kv_heads=draft_heads,
                          mamba_page=full.page_size_bytes)
    gdn = v.kvi.MambaSpec(block_size=BLOCK, shapes=((3, 8192), (32, 128, 128)),
                          dtypes=(torch.bfloat16, torch.bfloat16),
                          mamba_type=v.kvi.MambaAttentionBackendEnum.GDN_ATTN,
                          page_size_padded=full.page_size_bytes)
    specs: dict[str, Any] = {}
    for i in range(TARGET_LAYERS):
        specs[f"model.layers.{i}.attn"] = full if i % 4 == 3 else gdn
    specs["draft.layers.0.attn"] = full
    specs["draft.layers.1.attn"] = full
    specs["draft.layers.2.attn"] = window
    vc = _vllm_config(v.kvi)
    with stub_modules(v.stubs):
        groups = v.utils.get_kv_cache_groups(vc, dict(specs))
        config = v.utils.get_kv_cache_config_from_groups(
            vc, groups, available_memory=100 * 4 * full.page_size_bytes)
    return window, config, vc


def _window_group(groups: list[Any]) -> Any:
    return next(g.kv_cache_spec for g in groups
                if g.layer_names == ["draft.layers.2.attn"])


def _check_window_block_divides_primary(tree: Path) -> None:
    v = Vllm(tree)
    window, config, vc = _hybrid_groups(v)
    # The layer asks for the largest FlashInfer size dividing 272, not the largest that
    # fits (64).
    assert window.block_size == 16, window.block_size
    # unify scales it by 17: the window group's page is the primary page, unpadded.
    spec = _window_group(config.kv_cache_groups)
    assert type(spec).__name__ == "SlidingWindowSpec"
    assert spec.block_size == BLOCK
    assert spec.page_size_padded is None
    assert spec.page_size_bytes == spec.real_page_size_bytes
    # The scheduler block stays the primary block (pristine: lcm(272, 64) = 1088).
    assert v.utils.resolve_kv_cache_block_sizes(config, vc) == (BLOCK, BLOCK)
    # At run time the window group's 272-token block runs as 16-token kernel blocks.
    backend = v.fixed_backend(FLASHINFER_SIZES)
    assert v.select_common_block_size(spec.block_size, [backend], [spec]) == 16


def test_patched_window_block_divides_primary(patched_vllm: Path) -> None:
    _check_window_block_divides_primary(patched_vllm)


def test_pristine_pads_window_page_and_grows_scheduler_block(pristine_vllm: Path) -> None:
    assert_pristine_lacks(lambda: _check_window_block_divides_primary(pristine_vllm))
    v = Vllm(pristine_vllm)
    window, config, vc = _hybrid_groups(v)
    assert window.block_size == 64
    spec = _window_group(config.kv_cache_groups)
    assert spec.block_size == 64
    assert spec.page_size_padded == v.layer_spec(
        v.fixed_backend(FLASHINFER_SIZES), sliding_window=None).page_size_bytes
    assert v.utils.resolve_kv_cache_block_sizes(config, vc) == (1088, 1088)


def test_patched_half_bytes_drafter_window_scales_to_a_multiple(patched_vllm: Path) -> None:
    """A drafter window with half the target's bytes per token (2 KV heads): 16 is still
    taken, and unify scales it by 34 to 544, unpadded; the scheduler block is 544."""
    v = Vllm(patched_vllm)
    window, config, vc = _hybrid_groups(v, draft_heads=2)
    assert window.block_size == 16
    spec = _window_group(config.kv_cache_groups)
    assert (spec.block_size, spec.page_size_padded) == (2 * BLOCK, None)
    assert v.utils.resolve_kv_cache_block_sizes(config, vc) == (2 * BLOCK, 2 * BLOCK)


def test_patched_double_bytes_drafter_window_keeps_upstream_block(
        patched_vllm: Path, pristine_vllm: Path) -> None:
    """A drafter window with twice the target's bytes per token (8 KV heads): a 16-token
    page does not divide the hybrid page either, so upstream's 64 is kept (padded, as
    upstream pads it) rather than a page padded at 16 tokens."""
    for tree in (patched_vllm, pristine_vllm):
        v = Vllm(tree)
        window, config, _ = _hybrid_groups(v, draft_heads=8)
        assert window.block_size == 64
        spec = _window_group(config.kv_cache_groups)
        assert spec.block_size == 64 and spec.page_size_padded is not None


@pytest.mark.parametrize(("sizes", "block_size", "shared_page", "expected"), [
    # No supported size divides 272 (FlashMLA's only size): upstream's 64 is kept.
    ([64], BLOCK, None, 64),
    # The largest fitting block divides the primary block already.
    (FLASHINFER_SIZES, 256, None, 64),
    # A padded spec (skip-quant's shared page) keeps the largest block under its page.
    (FLASHINFER_SIZES, BLOCK, BLOCK * 4096, 64),
    # MultipleOf(16) fits the primary block itself.
    ("multiple16", BLOCK, None, BLOCK),
])
def test_patched_keeps_upstream_choice_where_the_rule_does_not_apply(
        patched_vllm: Path, pristine_vllm: Path, sizes: Any, block_size: int,
        shared_page: int | None, expected: int) -> None:
    got = []
    for tree in (patched_vllm, pristine_vllm):
        v = Vllm(tree)
        backend = v.fixed_backend(
            [v.backend.MultipleOf(16)] if sizes == "multiple16" else sizes)
        spec = v.layer_spec(backend, sliding_window=WINDOW, block_size=block_size,
                            shared_page=shared_page)
        got.append(spec.block_size)
    assert got == [expected, expected]


def test_patched_full_attention_spec_is_unchanged(patched_vllm: Path) -> None:
    """Only sliding-window layers choose their block: full attention keeps the primary."""
    v = Vllm(patched_vllm)
    spec = v.layer_spec(v.fixed_backend(FLASHINFER_SIZES), sliding_window=None)
    assert type(spec).__name__ == "FullAttentionSpec"
    assert spec.block_size == BLOCK


def test_patched_without_hybrid_page_takes_the_block_divisor(patched_vllm: Path) -> None:
    """No Mamba page recorded (a model without Mamba layers, --block-size 48): the largest
    FlashInfer size dividing 48 is 16 (pristine: 32, the largest that fits), and unify
    scales it to 48 beside a 48-token full attention page."""
    v = Vllm(patched_vllm)
    backend = v.fixed_backend(FLASHINFER_SIZES)
    window = v.layer_spec(backend, sliding_window=WINDOW, block_size=48)
    full = v.layer_spec(backend, sliding_window=None, block_size=48)
    assert window.block_size == 16
    unified = v.utils.unify_kv_cache_spec_page_size({"full": full, "window": window})
    assert unified["window"].block_size == 48
    assert unified["window"].page_size_padded is None
