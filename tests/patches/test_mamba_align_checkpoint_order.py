"""mamba-align-checkpoint-order: in align mode, a Mamba state block that carries a block
hash (a prefix-cache entry) stays with its request until the request ends, and is then
freed with the request's other blocks, tail first; VLLM_MAMBA_ALIGN_KEEP_CHECKPOINTS=0
gives upstream's retirement back.

Drives vLLM's own MambaManager (single_type_kv_cache_manager.py) over its own BlockPool,
KVCacheBlock and MambaSpec on CPU torch, the way the scheduler does: allocate the
request's blocks, hash the full ones (cache_blocks), retire what the request has passed
(remove_skipped_blocks), free it at the end. What the GPU kernels write into the states
is not part of this row."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ._helpers import (
    assert_pristine_lacks,
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
PROMPT = 16
END = 24  # the request decodes one token a step up to here


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
    return kvi, utils, pool, managers


class _Run:
    """One align-mode request: a 16-token prefill, then one token a step to 24."""

    def __init__(self, tree: Path, retention_interval: int | None = None) -> None:
        kvi, utils, pool, managers = _modules(tree)
        spec = kvi.MambaSpec(block_size=BLOCK, shapes=((2, 4),), dtypes=(torch.float32,),
                             mamba_cache_mode="align")
        self.pool = pool.BlockPool(num_gpu_blocks=16, enable_caching=True,
                                   hash_block_size=BLOCK)
        self.manager = managers.MambaManager(spec, self.pool, enable_caching=True,
                                             kv_cache_group_id=0, scheduler_block_size=BLOCK)
        hashes = [utils.BlockHash(f"a{i}".encode()) for i in range(END // BLOCK + 1)]
        self.request = SimpleNamespace(request_id="a", block_hashes=hashes,
                                       num_prompt_tokens=PROMPT, shared_prefix_boundary=0,
                                       num_tokens=PROMPT)
        self.retention_interval = retention_interval
        # The state block the request held at each block boundary, by token count.
        self.state_at: dict[int, Any] = {}
        self._step(0, PROMPT)
        for computed in range(PROMPT, END):
            self.manager.remove_skipped_blocks("a", computed)
            self._step(computed, computed + 1)

    def _step(self, computed: int, total: int) -> None:
        self.manager.allocate_new_blocks("a", total, total)
        self.request.num_tokens = total
        self.manager.cache_blocks(self.request, total,
                                  retention_interval=self.retention_interval,
                                  replay_boundaries=[])
        if total % BLOCK == 0:
            self.state_at[total] = self.manager.req_to_blocks["a"][total // BLOCK - 1]

    def table(self) -> list[int]:
        return [b.block_id for b in self.manager.req_to_blocks["a"]]

    def eviction_order(self) -> list[int]:
        """The ids of the request's snapshots in the order the pool hands them out."""
        self.manager.free("a")
        ours = {b.block_id for b in self.state_at.values()}
        order = self.pool.get_new_blocks(self.pool.get_num_free_blocks())
        return [b.block_id for b in order if b.block_id in ours]


def _check_kept(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KNOB, raising=False)  # default: on
    run = _Run(tree)
    s16, s20, s24 = (run.state_at[n] for n in (16, 20, 24))
    assert all(s.block_hash is not None for s in (s16, s20, s24))
    # At 24 tokens the states at 16 and 20 are behind the running one; hashed, they stay
    # in the table, held by the request.
    table = run.table()
    assert table[3] == s16.block_id and table[4] == s20.block_id, table
    assert s16.ref_cnt == 1 and s20.ref_cnt == 1
    # 16 blocks, the null block, three held: 12 free.
    assert run.pool.get_num_free_blocks() == 12
    # Freed together at the end, tail first: the shortest prefix is evicted last.
    assert run.eviction_order() == [s24.block_id, s20.block_id, s16.block_id]


def _check_unhashed_retired(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Sparse retention with no reachable boundary: no state gets a hash, so none is kept.
    monkeypatch.delenv(KNOB, raising=False)
    run = _Run(tree, retention_interval=0)
    assert all(run.state_at[n].block_hash is None for n in (16, 20))
    assert run.table()[:5] == [0] * 5, run.table()
    assert run.pool.get_num_free_blocks() == 14


def _check_knob_off(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KNOB, "0")
    run = _Run(tree)
    s16, s20, s24 = (run.state_at[n] for n in (16, 20, 24))
    assert run.table()[:5] == [0] * 5, run.table()
    assert s16.ref_cnt == 0 and s20.ref_cnt == 0
    # Upstream's order: each snapshot joins the queue when it is retired.
    assert run.eviction_order() == [s16.block_id, s20.block_id, s24.block_id]


def test_patched_keeps_hashed_states_until_request_end(
        patched_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _check_kept(patched_vllm, monkeypatch)


def test_patched_still_retires_unhashed_states(
        patched_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _check_unhashed_retired(patched_vllm, monkeypatch)


def test_patched_knob_off_is_upstream(patched_vllm: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _check_knob_off(patched_vllm, monkeypatch)


def test_pristine_retires_hashed_states_at_once(
        pristine_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert_pristine_lacks(lambda: _check_kept(pristine_vllm, monkeypatch))
    _check_knob_off(pristine_vllm, monkeypatch)
