"""mamba-align-checkpoint-order: in align mode, a hashed Mamba state block at one of the
request's reachable boundaries (its prompt's replay boundary, its shared-prefix junction)
stays with its request until the request ends, and is then freed with the request's other
blocks, tail first; every other state retires as upstream retires it, so a request keeps
at most MAMBA_ALIGN_MAX_KEPT_CHECKPOINTS states, which MambaSpec.max_memory_usage_bytes
counts: a pool sized by that estimate never runs short for the request.
VLLM_MAMBA_ALIGN_KEEP_CHECKPOINTS=0 gives upstream's retirement back.

Drives vLLM's own MambaManager (single_type_kv_cache_manager.py) over its own BlockPool,
KVCacheBlock and MambaSpec on CPU torch, the way the scheduler does: allocate the
request's blocks, hash the full ones (cache_blocks), retire what the request has passed
(remove_skipped_blocks), free it at the end; the replay boundaries come from vLLM's own
kv_cache_coordinator.replay_boundaries. What the GPU kernels write into the states is not
part of this row."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ._helpers import (
    assert_pristine_lacks,
    exec_function,
    load_envs,
    load_kv_cache_interface,
    load_module,
    load_with_auto_stubs,
    make_module,
    once_logger_module,
)

pytestmark = pytest.mark.e2e
torch = pytest.importorskip("torch")

KNOB = "VLLM_MAMBA_ALIGN_KEEP_CHECKPOINTS"
BLOCK = 4  # mamba_block_size and the hash block size, in tokens
PROMPT = 16  # prefilled in chunks of BLOCK tokens, so every boundary has a state
END = 24  # the request decodes one token a step up to here
SHARED = 8  # a shared-prefix junction, when the run has one


def _modules(tree: Path) -> tuple[Any, Any, Any, Any]:
    """kv_cache_interface, kv_cache_utils, block_pool and single_type_kv_cache_manager
    from ``tree``, wired to each other (their other vLLM imports stand in)."""
    kvi = load_kv_cache_interface(tree)
    logger = once_logger_module()
    math_utils = load_module(tree / "utils/math_utils.py")
    registry = load_module(tree / "v1/kv_cache_spec_registry.py", {"vllm.logger": logger})
    envs = load_envs(tree)
    common = {"vllm.logger": logger, "vllm.utils.math_utils": math_utils,
              "vllm.v1.kv_cache_interface": kvi, "vllm.v1.kv_cache_spec_registry": registry,
              "vllm.envs": envs}
    utils = load_with_auto_stubs(tree / "v1/core/kv_cache_utils.py", common)
    pool = load_with_auto_stubs(tree / "v1/core/block_pool.py", {
        **common, "vllm.v1.core.kv_cache_utils": utils})
    managers = load_with_auto_stubs(tree / "v1/core/single_type_kv_cache_manager.py", {
        **common, "vllm": make_module("vllm", envs=envs),
        "vllm.v1.core.kv_cache_utils": utils, "vllm.v1.core.block_pool": pool})
    kvi.__dict__["envs"] = envs
    return kvi, utils, pool, managers


class _Run:
    """One align-mode request: a 16-token prompt prefilled BLOCK tokens a step, then one
    token a step to ``end``. With ``pool_blocks`` the pool holds that many usable blocks
    and every step first asks, as the scheduler does, whether its blocks fit
    (``short`` records the steps where they would not: a preemption)."""

    def __init__(self, tree: Path, retention_interval: int | None = None,
                 shared: int = 0, end: int = END, pool_blocks: int = 64) -> None:
        kvi, utils, pool, managers = _modules(tree)
        self.spec = kvi.MambaSpec(block_size=BLOCK, shapes=((2, 4),),
                                  dtypes=(torch.float32,), mamba_cache_mode="align")
        self.pool = pool.BlockPool(num_gpu_blocks=pool_blocks + 1, enable_caching=True,
                                   hash_block_size=BLOCK)
        self.manager = managers.MambaManager(self.spec, self.pool, enable_caching=True,
                                             kv_cache_group_id=0, scheduler_block_size=BLOCK)
        replay = exec_function(tree / "v1/core/kv_cache_coordinator.py",
                               "replay_boundaries", {})
        self.boundaries = replay(PROMPT, BLOCK, use_eagle=False)
        hashes = [utils.BlockHash(f"a{i}".encode()) for i in range(end // BLOCK + 1)]
        self.request = SimpleNamespace(request_id="a", block_hashes=hashes,
                                       num_prompt_tokens=PROMPT,
                                       shared_prefix_boundary=shared, num_tokens=0)
        self.retention_interval = retention_interval
        self.short: list[int] = []
        # The state block the request held at each block boundary, by token count.
        self.state_at: dict[int, Any] = {}
        computed = 0
        while computed < end:
            total = min(computed + (BLOCK if computed < PROMPT else 1), end)
            if computed:
                self.manager.remove_skipped_blocks("a", computed)
            self._step(computed, total)
            computed = total

    def _step(self, computed: int, total: int) -> None:
        need = self.manager.get_num_blocks_to_allocate(
            "a", total, [], computed, computed, total)
        if need > self.pool.get_num_free_blocks():
            self.short.append(total)
            return
        self.manager.allocate_new_blocks("a", total, total)
        self.request.num_tokens = total
        self.manager.cache_blocks(self.request, total,
                                  retention_interval=self.retention_interval,
                                  replay_boundaries=self.boundaries)
        if total % BLOCK == 0:
            self.state_at[total] = self.manager.req_to_blocks["a"][total // BLOCK - 1]

    def table(self) -> list[int]:
        return [b.block_id for b in self.manager.req_to_blocks["a"]]

    def held(self) -> list[int]:
        """Token counts whose state block the request's table still holds."""
        return [(i + 1) * BLOCK for i, b in enumerate(self.manager.req_to_blocks["a"])
                if not b.is_null]

    def eviction_order(self) -> list[int]:
        """The request's snapshots, by token count, in the order the pool hands them out."""
        self.manager.free("a")
        ours = {b.block_id: n for n, b in self.state_at.items()}
        order = self.pool.get_new_blocks(self.pool.get_num_free_blocks())
        return [ours[b.block_id] for b in order if b.block_id in ours]


def _check_kept(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KNOB, raising=False)  # default: on
    run = _Run(tree, shared=SHARED)
    assert run.boundaries == (PROMPT - 1,)
    assert all(b.block_hash is not None for b in run.state_at.values())
    # At 24 tokens: the state at the shared-prefix junction (8) and the one a resend of
    # the prompt resumes from (15 -> 12) stay in the table, held by the request; the
    # states at 4, 16 and 20 retired as upstream retires them; 24 is the running state.
    assert run.held() == [8, 12, 24], run.held()
    table = run.table()
    assert table[1] == run.state_at[8].block_id and table[2] == run.state_at[12].block_id
    assert table[0] == table[3] == table[4] == 0, table
    # Freed with the request, tail first: the junction's state is evicted last.
    assert run.eviction_order() == [4, 16, 20, 24, 12, 8]


def _check_unhashed_retired(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Sparse retention hashes few states; no junction here: the replay boundary's state
    # is the one kept, the others retire, hashed or not.
    monkeypatch.delenv(KNOB, raising=False)
    run = _Run(tree, retention_interval=0)
    assert run.state_at[16].block_hash is None and run.state_at[20].block_hash is None
    assert run.held() == [12, 24], run.held()


def _check_knob_off(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KNOB, "0")
    run = _Run(tree, shared=SHARED)
    assert run.held() == [24], run.held()
    assert run.table()[:5] == [0] * 5, run.table()
    # Upstream's order: each snapshot joins the queue when it is retired.
    assert run.eviction_order() == [4, 8, 12, 16, 20, 24]


def _estimate_blocks(run: _Run, enable_prefix_caching: bool = True) -> int:
    """Blocks per request by vLLM's MambaSpec.max_memory_usage_bytes."""
    vllm_config = SimpleNamespace(
        cache_config=SimpleNamespace(mamba_cache_mode="align",
                                     enable_prefix_caching=enable_prefix_caching),
        max_concurrent_batches=1)
    page = run.spec.page_size_bytes
    return int(run.spec.max_memory_usage_bytes(vllm_config) // page)


def _check_bounded(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long request keeps no more than the estimate counts, and a pool sized by the
    estimate (auto-fit for one request) serves it to the end without a preemption."""
    monkeypatch.delenv(KNOB, raising=False)
    end = 96
    probe = _Run(tree, shared=SHARED, end=BLOCK)
    blocks = _estimate_blocks(probe)
    run = _Run(tree, shared=SHARED, end=end, pool_blocks=blocks)
    assert run.short == [], f"{blocks} blocks by the estimate; short at {run.short[:3]}"
    assert max(run.state_at) == end
    assert run.held() == [8, 12, end], run.held()
    # With the knob off the estimate is upstream's, and upstream's retirement fits in it.
    monkeypatch.setenv(KNOB, "0")
    upstream = _estimate_blocks(probe)
    assert upstream < blocks
    assert _estimate_blocks(probe, enable_prefix_caching=False) == upstream
    run = _Run(tree, shared=SHARED, end=end, pool_blocks=upstream)
    assert run.short == [] and run.held() == [end]


def test_patched_keeps_reachable_states_until_request_end(
        patched_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _check_kept(patched_vllm, monkeypatch)


def test_patched_still_retires_unhashed_states(
        patched_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _check_unhashed_retired(patched_vllm, monkeypatch)


def test_patched_knob_off_is_upstream(patched_vllm: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _check_knob_off(patched_vllm, monkeypatch)


def test_patched_pool_sized_by_estimate_never_preempts(
        patched_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _check_bounded(patched_vllm, monkeypatch)


def test_pristine_retires_hashed_states_at_once(
        pristine_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert_pristine_lacks(lambda: _check_kept(pristine_vllm, monkeypatch))
    _check_knob_off(pristine_vllm, monkeypatch)
