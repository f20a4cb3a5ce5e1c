"""async-mamba-kv-sizing: an align-mode Mamba spec's memory estimate counts the state
blocks that steps still in flight hold (max_concurrent_batches - 1 of them), and the
concurrency figure divides the pool's usable blocks (the null block excluded).

The peak a request holds is measured by driving vLLM's own MambaManager over its BlockPool
(single_type_kv_cache_manager.py, block_pool.py) the way allocate_slots does under a batch
queue: retire on the processed-token basis (num_computed_tokens minus the tokens of the
steps in flight), count, allocate, hash. The estimate is vLLM's MambaSpec
(kv_cache_interface.py) and the figure its get_max_concurrency_for_kv_cache_config
(kv_cache_utils.py), on CPU torch; the config is a stand-in with the fields they read.
mamba-align-checkpoint-order's kept snapshots are switched off (its knob at 0): that patch
says they are outside the estimate, and they would grow the peak with the length."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ._helpers import assert_pristine_lacks
from .test_mamba_align_checkpoint_order import KNOB, _modules

pytestmark = pytest.mark.e2e
torch = pytest.importorskip("torch")

BLOCK = 4  # mamba_block_size and the hash block size, in tokens
PROMPT = 40


def _config(max_concurrent_batches: int, max_model_len: int = 1024) -> Any:
    return SimpleNamespace(
        max_concurrent_batches=max_concurrent_batches,
        # Without prefix caching no state is kept to the request's end
        # (mamba-align-checkpoint-order): this row's count alone.
        cache_config=SimpleNamespace(mamba_cache_mode="align", enable_prefix_caching=False),
        model_config=SimpleNamespace(max_model_len=max_model_len),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
    )


def _spec(kvi: Any, speculative: int = 0, checkpoint: int = 0) -> Any:
    return kvi.MambaSpec(block_size=BLOCK, shapes=((2, 4),), dtypes=(torch.float32,),
                         mamba_cache_mode="align", num_speculative_blocks=speculative,
                         num_prefill_checkpoint_blocks=checkpoint,
                         prefill_checkpoint_alignment=1 if checkpoint else None)


def _peak_held(tree: Path, in_flight: int, chunk: int, speculative: int = 0,
               checkpoint: int = 0) -> int:
    """The most state blocks one request holds: a PROMPT-token prefill in ``chunk``-token
    steps, then decode steps of 1 + ``speculative`` tokens, with ``in_flight`` earlier
    steps unprocessed whenever a step is scheduled."""
    kvi, utils, pool_mod, managers = _modules(tree)
    spec = _spec(kvi, speculative, checkpoint)
    pool = pool_mod.BlockPool(num_gpu_blocks=64, enable_caching=True, hash_block_size=BLOCK)
    manager = managers.MambaManager(spec, pool, enable_caching=True, kv_cache_group_id=0,
                                    scheduler_block_size=BLOCK)
    end = PROMPT + 12 * (1 + speculative)
    hashes = [utils.BlockHash(f"a{i}".encode()) for i in range(end // BLOCK + 1)]
    request = SimpleNamespace(request_id="a", block_hashes=hashes, num_prompt_tokens=PROMPT,
                              shared_prefix_boundary=0, num_tokens=PROMPT)
    scheduled: list[int] = []
    computed = peak = 0
    while computed < end:
        step = min(chunk, PROMPT - computed) if computed < PROMPT else 1 + speculative
        pending = sum(scheduled[len(scheduled) - in_flight:]) if in_flight else 0
        manager.remove_skipped_blocks("a", max(0, computed - pending))
        total = computed + step
        manager.get_num_blocks_to_allocate("a", total, [], computed, computed, total,
                                           prefill_end=PROMPT)
        manager.allocate_new_blocks("a", total, total)
        request.num_tokens = max(request.num_tokens, total)
        manager.cache_blocks(request, total, replay_boundaries=[])
        peak = max(peak, sum(1 for b in manager.req_to_blocks["a"] if not b.is_null))
        scheduled.append(step)
        computed = total
    return peak


def _estimate(tree: Path, max_concurrent_batches: int, speculative: int = 0,
              checkpoint: int = 0) -> int:
    kvi, _, _, _ = _modules(tree)
    spec = _spec(kvi, speculative, checkpoint)
    used = spec.max_memory_usage_bytes(_config(max_concurrent_batches))
    assert used % spec.page_size_bytes == 0
    return int(used // spec.page_size_bytes)


# (prefill chunk, speculative blocks, prefill checkpoint blocks). In the first four every
# step crosses a block boundary, so each step in flight holds a state block of its own and
# the peak reaches the estimate; in the others some steps stay inside a block (a decode step
# of a long chunk's request, a chunk that ends off the checkpoint), and it stays below.
TIGHT = [(BLOCK, 0, 0), (2 * BLOCK, 0, 0), (2 * BLOCK, 0, 1), (2 * BLOCK, 2, 0)]
LOOSE = [(3 * BLOCK, 2, 1), (5 * BLOCK, 0, 1)]


def _check_estimate_covers_in_flight_states(tree: Path) -> None:
    for in_flight in (0, 1, 2):
        for chunk, speculative, checkpoint in TIGHT + LOOSE:
            peak = _peak_held(tree, in_flight, chunk, speculative, checkpoint)
            estimate = _estimate(tree, in_flight + 1, speculative, checkpoint)
            case = (in_flight, chunk, speculative, checkpoint, peak, estimate)
            assert peak <= estimate, case
            if (chunk, speculative, checkpoint) in TIGHT:
                assert peak == estimate == 2 + speculative + checkpoint + in_flight, case


def test_patched_estimate_covers_in_flight_states(
        patched_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KNOB, "0")
    _check_estimate_covers_in_flight_states(patched_vllm)


def test_pristine_estimate_is_one_block_short_per_step_in_flight(
        pristine_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KNOB, "0")
    assert_pristine_lacks(lambda: _check_estimate_covers_in_flight_states(pristine_vllm))
    # Async scheduling on one stage (2 concurrent batches): the manager holds 3 state
    # blocks, the estimate says 2.
    assert _peak_held(pristine_vllm, 1, BLOCK) == 3
    assert _estimate(pristine_vllm, 2) == 2


def test_patched_without_batch_queue_is_unchanged(patched_vllm: Path,
                                                  pristine_vllm: Path) -> None:
    """One batch at a time (no async scheduling, one pipeline stage): the same count as
    upstream; "none" mode stays 1 + speculative blocks."""
    for speculative, checkpoint in ((0, 0), (2, 1)):
        assert (_estimate(patched_vllm, 1, speculative, checkpoint)
                == _estimate(pristine_vllm, 1, speculative, checkpoint)
                == 2 + speculative + checkpoint)
    kvi, _, _, _ = _modules(patched_vllm)
    spec = kvi.MambaSpec(block_size=BLOCK, shapes=((2, 4),), dtypes=(torch.float32,),
                         num_speculative_blocks=2)
    config = _config(3)
    config.cache_config.mamba_cache_mode = "none"
    assert spec.max_memory_usage_bytes(config) == 3 * spec.page_size_bytes


def _concurrency(tree: Path, num_blocks: int) -> float:
    """A full attention group and a GDN-like Mamba group at one 16-token block size, a
    512-token max_model_len and async scheduling (2 concurrent batches)."""
    kvi, utils, _, _ = _modules(tree)
    full = kvi.FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64,
                                 dtype=torch.float16)
    mamba = kvi.MambaSpec(block_size=16, shapes=((2, 4),), dtypes=(torch.float32,),
                          mamba_cache_mode="align", page_size_padded=full.page_size_bytes)
    config = kvi.KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[],
        kv_cache_groups=[kvi.KVCacheGroupSpec(["attn"], full),
                         kvi.KVCacheGroupSpec(["gdn"], mamba)])
    result: float = utils.get_max_concurrency_for_kv_cache_config(_config(2, 512), config)
    return result


def _check_concurrency_counts_usable_blocks(tree: Path) -> None:
    # A request at 512 tokens: 32 attention blocks and 3 state blocks (2 + 1 in flight);
    # 351 blocks are 350 usable ones, 10 requests.
    assert _concurrency(tree, 351) == pytest.approx(10.0)
    assert _concurrency(tree, 36) == pytest.approx(1.0)


def test_patched_concurrency_counts_usable_blocks(patched_vllm: Path) -> None:
    _check_concurrency_counts_usable_blocks(patched_vllm)


def test_pristine_concurrency_counts_null_block(pristine_vllm: Path) -> None:
    assert_pristine_lacks(lambda: _check_concurrency_counts_usable_blocks(pristine_vllm))
    # 351 blocks over 32 + 2: the null block counted, the in-flight state not.
    assert _concurrency(pristine_vllm, 351) == pytest.approx(351 / 34)
