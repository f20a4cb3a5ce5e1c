"""kv-cache-seat-budget: one INFO line after "GPU KV cache size" with the requests resident
at ~1k, 32k and max_model_len tokens, from each device group's admission cost at that
length and the pool's usable blocks.

vLLM's own update_kv_cache_capacity (kv_cache_utils.py) runs over real KV cache spec
classes (FullAttentionSpec, SlidingWindowSpec, KVCacheGroupSpec, KVCacheConfig from
kv_cache_interface.py, on CPU torch). The config is a stand-in whose max_model_len
refuses to be written."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ._helpers import (
    OnceLogger,
    assert_pristine_lacks,
    load_kv_cache_interface,
    load_module,
    load_with_auto_stubs,
    make_module,
)

pytestmark = pytest.mark.e2e
torch = pytest.importorskip("torch")

LOGGER = "test.kv_seats"
MAX_IN_FLIGHT = 8192


class _ModelConfig:
    """max_model_len can be read, never written (not even and restored)."""

    def __init__(self, max_model_len: int) -> None:
        self.__dict__["_len"] = max_model_len

    @property
    def max_model_len(self) -> int:
        return int(self.__dict__["_len"])

    def __setattr__(self, name: str, value: Any) -> None:
        raise AssertionError(f"model_config.{name} was written ({value!r})")


def _utils(tree: Path, kvi: Any) -> Any:
    logger = OnceLogger(logging.getLogger(LOGGER), {})
    return load_with_auto_stubs(tree / "v1/core/kv_cache_utils.py", {
        "vllm.logger": make_module("vllm.logger", init_logger=lambda name: logger),
        "vllm.utils.math_utils": load_module(tree / "utils/math_utils.py"),
        "vllm.v1.kv_cache_interface": kvi,
    })


def _setup(tree: Path, max_model_len: int, num_blocks: int) -> tuple[Any, Any, Any]:
    kvi = load_kv_cache_interface(tree)
    utils = _utils(tree, kvi)
    common = {"block_size": 16, "num_kv_heads": 8, "head_size": 128,
              "dtype": torch.bfloat16}
    full = kvi.FullAttentionSpec(**common)
    window = kvi.SlidingWindowSpec(sliding_window=4096, **common)
    kvc = kvi.KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[kvi.KVCacheGroupSpec([f"full.{i}" for i in range(8)], full),
                         kvi.KVCacheGroupSpec([f"sw.{i}" for i in range(8)], window)])
    vc = SimpleNamespace(
        model_config=_ModelConfig(max_model_len),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
        max_in_flight_tokens=MAX_IN_FLIGHT,
        cache_config=SimpleNamespace(),
        device_config=SimpleNamespace(device_type="cuda"),
        attention_config=SimpleNamespace(hisparse_config=None),
    )
    return utils.update_kv_cache_capacity, vc, kvc


def _lines(update: Any, vc: Any, kvc: Any, caplog: pytest.LogCaptureFixture) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        update(vc, kvc)
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def _capacity_counts_null_block(tree: Path) -> bool:
    """Whether vLLM's capacity figure in ``tree`` divides every block, the null block
    included (0.32.0), or the usable ones (async-mamba-kv-sizing, later in the series):
    two blocks for requests of one block each read 2.0 or 1.0."""
    kvi = load_kv_cache_interface(tree)
    full = kvi.FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128,
                                 dtype=torch.bfloat16)
    kvc = kvi.KVCacheConfig(num_blocks=2, kv_cache_tensors=[],
                            kv_cache_groups=[kvi.KVCacheGroupSpec(["full"], full)])
    vc = SimpleNamespace(model_config=_ModelConfig(16),
                         parallel_config=SimpleNamespace(decode_context_parallel_size=1))
    concurrency = _utils(tree, kvi).get_max_concurrency_for_kv_cache_config(vc, kvc)
    assert concurrency in (1.0, 2.0), concurrency
    return bool(concurrency == 2.0)


def _check(tree: Path, caplog: pytest.LogCaptureFixture) -> None:
    update, vc, kvc = _setup(tree, 65536, num_blocks=20_001)
    msgs = _lines(update, vc, kvc, caplog)
    # vLLM's own capacity line over these specs: a 65,536-token request takes 4,096
    # full-attention blocks plus cdiv(4095 + 8192, 16) + 1 = 769 window blocks, out of
    # 20,001 blocks, or of the 20,000 usable ones once the figure excludes the null block.
    tokens = 269_431 if _capacity_counts_null_block(tree) else 269_418
    assert msgs[0] == (f"GPU KV cache size: {tokens:,} tokens, Maximum concurrency for "
                       "65,536 tokens per request: 4.11x"), msgs[0]
    assert vc.cache_config.kv_cache_size_tokens == tokens
    assert len(msgs) == 2, msgs
    # 20,000 usable blocks (the null block is reserved). 1,024 tokens: 64 + 65 blocks;
    # 32,768: 2,048 + 769; 65,536: 4,096 + 769.
    assert msgs[1] == ("GPU KV cache seats (requests resident at once): "
                       "155 at 1,024 tokens, 7 at 32,768 tokens, 4 at 65,536 tokens"), msgs[1]
    assert vc.model_config.max_model_len == 65536
    # A short max_model_len: lengths above it are not reported.
    update, vc, kvc = _setup(tree, 8192, num_blocks=2_001)
    seat = _lines(update, vc, kvc, caplog)[1]
    # 1,024: 64 + 65 = 129 blocks; 8,192: 512 + cdiv(min(12287, 8192), 16) + 1 = 1,025.
    assert seat.endswith("15 at 1,024 tokens, 1 at 8,192 tokens"), seat


def test_patched_logs_seat_budget(patched_vllm: Path, caplog: pytest.LogCaptureFixture) -> None:
    _check(patched_vllm, caplog)


def test_pristine_lacks_seat_budget(pristine_vllm: Path,
                                    caplog: pytest.LogCaptureFixture) -> None:
    assert_pristine_lacks(lambda: _check(pristine_vllm, caplog))
