"""mamba-chunked-prefill-align: in "align" mode every prefill chunk that passes a Mamba block
boundary stops on it, also when another prefix-cacheable KV group (a drafter's) has smaller
blocks, so each Mamba block the prefix cache holds is the state at its boundary and a later
request that hits the prefix resumes from the state the first request had there.

Drives vLLM's own code on CPU torch, the way a step runs: the scheduler's chunk split
(Scheduler._mamba_block_aligned_split), MambaManager over its BlockPool (retire, allocate,
cache), the worker's preprocess_mamba (the copy of the last state into the new block, with
its own copy specs from the Mamba layers' mamba_utils) and the backends' state-index gather
(mamba_get_block_table_tensor). Two things stand in: a small recurrence (a conv window of
kernel_size - 1 tokens and a decaying state) for the model's kernels, reading its initial
state from the block the gather names and writing its final state there, and a host memmove
for the batch_memcpy Triton kernel. Every state block starts as NaN, so a block read before
it was written shows as such."""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from ._helpers import (
    AutoStub,
    assert_pristine_lacks,
    exec_function,
    load_envs,
    load_module,
    load_with_auto_stubs,
    make_module,
    once_logger_module,
)
from .test_mamba_align_checkpoint_order import _modules

pytestmark = pytest.mark.e2e
torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

KERNEL = 4  # conv kernel width: the conv state holds the last KERNEL - 1 tokens
DIM = 3
NUM_BLOCKS = 64


def _triton_stub() -> ModuleType:
    """vllm.triton_utils without Triton: the kernels are defined, never launched."""
    def jit(fn: Any = None, **_: Any) -> Any:
        return fn if fn is not None else (lambda f: f)

    triton = make_module("triton", jit=jit)
    return make_module("vllm.triton_utils", triton=triton, tl=AutoStub("tl"))


def _host_batch_memcpy(src: Any, dst: Any, sizes: Any) -> None:
    """batch_memcpy's contract (copy sizes[i] bytes from src[i] to dst[i]) on host memory."""
    for s, d, n in zip(src.tolist(), dst.tolist(), sizes.tolist(), strict=True):
        ctypes.memmove(int(d), int(s), int(n))


class _Buffer:
    """CpuGpuBuffer on the CPU: the GPU side is the CPU tensor."""

    def __init__(self, n: int, dtype: Any) -> None:
        self.cpu = torch.zeros(n, dtype=dtype)
        self.np = self.cpu.numpy()
        self.gpu = self.cpu

    def copy_to_gpu(self, n: int | None = None) -> Any:
        return self.cpu if n is None else self.cpu[:n]


@dataclass
class _Vllm:
    kvi: Any
    utils: Any
    pool: Any
    managers: Any
    worker: Any  # v1/worker/mamba_utils.py
    layers: Any  # model_executor/layers/mamba/mamba_utils.py
    gather: Any  # mamba_get_block_table_tensor
    split: Any  # Scheduler._mamba_block_aligned_split


def _load(tree: Path, monkeypatch: pytest.MonkeyPatch) -> _Vllm:
    monkeypatch.delenv("VLLM_SSM_CONV_STATE_LAYOUT", raising=False)
    kvi, utils, pool, managers = _modules(tree)
    envs = load_envs(tree)
    common = {"vllm.logger": once_logger_module(), "vllm.envs": envs,
              "vllm": make_module("vllm", envs=envs), "vllm.v1.kv_cache_interface": kvi,
              "vllm.utils.math_utils": load_module(tree / "utils/math_utils.py")}
    layers = load_with_auto_stubs(tree / "model_executor/layers/mamba/mamba_utils.py", common)
    worker = load_with_auto_stubs(tree / "v1/worker/mamba_utils.py", {
        **common, "vllm.triton_utils": _triton_stub(),
        "vllm.model_executor.layers.mamba.mamba_utils": layers})
    worker.__dict__["batch_memcpy"] = _host_batch_memcpy
    gather = exec_function(tree / "v1/attention/backends/utils.py", "mamba_get_block_table_tensor",
                           {"torch": torch, "MambaSpec": kvi.MambaSpec,
                            "KVCacheSpec": kvi.KVCacheSpec})
    split = exec_function(tree / "v1/core/sched/scheduler.py",
                          "Scheduler._mamba_block_aligned_split", {
                              "Request": Any,
                              "get_mamba_prefill_checkpoint_position":
                                  kvi.get_mamba_prefill_checkpoint_position,
                              "is_mamba_prefill_checkpoint_valid":
                                  kvi.is_mamba_prefill_checkpoint_valid})
    return _Vllm(kvi, utils, pool, managers, worker, layers, gather, split)


def _token(i: int) -> Any:
    return torch.tensor([i % 7 + 1.0, i % 5 - 2.0, i % 3 + 0.5], dtype=torch.float64)


def _recur(conv: Any, ssm: Any, positions: range) -> tuple[Any, Any]:
    """The stand-in for the kernels: conv holds the last KERNEL - 1 inputs, ssm decays."""
    for i in positions:
        window = torch.cat([conv, _token(i)[None]])
        y = window.sum(0)
        ssm = 0.75 * ssm + torch.stack([y, 0.01 * y * y])
        conv = window[1:]
    return conv, ssm


def _state_after(n: int) -> tuple[Any, Any]:
    return _recur(torch.zeros(KERNEL - 1, DIM, dtype=torch.float64),
                  torch.zeros(2, DIM, dtype=torch.float64), range(n))


@dataclass(frozen=True)
class _Chunk:
    request: str
    start: int
    end: int
    state_block: int  # the Mamba block the chunk read its initial state from and wrote
    initial: str  # "fresh", "ok", "NaN (never written)" or "wrong"


class _Engine:
    """One Mamba group in align mode; ``block`` is the Mamba block, ``min_block`` what the
    engine leaves in cache_config.block_size (the smallest prefix-cacheable group's block)."""

    def __init__(self, v: _Vllm, block: int, min_block: int, budget: int) -> None:
        self.v = v
        self.block = block
        scheduler_block = math.lcm(block, min_block)
        hash_block = math.gcd(block, min_block)
        self.alignment = scheduler_block  # where prefix-cache hits land
        self.spec = v.kvi.MambaSpec(
            block_size=block, shapes=((KERNEL - 1, DIM), (2, DIM)),
            dtypes=(torch.float64, torch.float64), mamba_cache_mode="align")
        self.pool = v.pool.BlockPool(num_gpu_blocks=NUM_BLOCKS, enable_caching=True,
                                     hash_block_size=hash_block)
        self.manager = v.managers.MambaManager(self.spec, self.pool, enable_caching=True,
                                               kv_cache_group_id=0,
                                               scheduler_block_size=scheduler_block)
        self.hashes = [v.utils.BlockHash(f"t{i}".encode()) for i in range(256 // hash_block)]
        self.scheduler = SimpleNamespace(
            cache_config=SimpleNamespace(block_size=min_block, mamba_block_size=block),
            block_size=scheduler_block, hash_block_size=hash_block,
            max_num_scheduled_tokens=budget,
            scheduler_config=SimpleNamespace(long_prefill_token_threshold=0),
            mamba_partial_cache_hit=False, use_eagle_block_drop=False,
            mamba_has_prefill_checkpoint_blocks=False, mamba_prefill_checkpoint_alignment=None,
            mamba_shared_prefix_checkpoint=False,
            num_hash_lookahead_tokens=0)  # read by 0.33.0; 0 turns it off
        # The worker's side.
        self.kv_cache_config = SimpleNamespace(
            kv_cache_groups=[v.kvi.KVCacheGroupSpec(["mamba.0"], self.spec)])
        self.copy_funcs = {
            self.spec.mamba_type:
                v.layers.MambaStateCopyFuncCalculator.gated_delta_net_state_copy_func()}
        self.copy_bufs = v.worker.MambaCopyBuffers.create(
            4, self.kv_cache_config, self.copy_funcs, _Buffer)
        self.conv = torch.full((NUM_BLOCKS, KERNEL - 1, DIM), math.nan, dtype=torch.float64)
        self.ssm = torch.full((NUM_BLOCKS, 2, DIM), math.nan, dtype=torch.float64)
        self.forward_context = {"mamba.0": SimpleNamespace(kv_cache=[self.conv, self.ssm])}
        self.mamba_state_idx: dict[str, int] = {}
        self.finished: set[str] = set()
        self.chunks: list[_Chunk] = []

    def prefill(self, rid: str, prompt: int) -> None:
        """Schedule and run one request's prompt chunk by chunk, then free it."""
        v, manager = self.v, self.manager
        request = SimpleNamespace(
            request_id=rid, block_hashes=self.hashes[: prompt // self.pool.hash_block_size],
            num_prompt_tokens=prompt, num_tokens=prompt, num_computed_tokens=0,
            shared_prefix_boundary=0)
        computed, hit = v.managers.MambaManager.find_longest_cache_hit(
            request.block_hashes, prompt - 1, [0], self.pool, self.spec, False, self.alignment)
        if hit:
            manager.add_local_computed_blocks(rid, computed[0], hit, 0)
            request.num_computed_tokens = hit
        block_ids: list[int] | None = None
        while request.num_computed_tokens < prompt:
            start = request.num_computed_tokens
            n = v.split(self.scheduler, request, min(prompt - start, self.scheduler
                                                     .max_num_scheduled_tokens))
            assert n > 0
            if block_ids is not None:
                manager.remove_skipped_blocks(rid, start)
            new = manager.allocate_new_blocks(rid, start + n, start + n)
            if block_ids is None:  # a new request gets its whole table
                block_ids = [b.block_id for b in manager.req_to_blocks[rid]]
            else:  # a running one the new blocks (the worker's table is append-only)
                block_ids += [b.block_id for b in new]
            manager.cache_blocks(request, start + n, replay_boundaries=[])
            self._run(rid, start, n, block_ids)
            request.num_computed_tokens = start + n
        manager.free(rid)
        self.finished = {rid}

    def _run(self, rid: str, start: int, n: int, block_ids: list[int]) -> None:
        v = self.v
        scheduler_output = SimpleNamespace(
            finished_req_ids=self.finished, preempted_req_ids=set(),
            scheduled_cached_reqs=SimpleNamespace(resumed_req_ids=set()),
            num_scheduled_tokens={rid: n})
        self.finished = set()
        input_batch = SimpleNamespace(req_ids=[rid],
                                      num_accepted_tokens_cpu=np.ones(4, dtype=np.int32))
        req_state = SimpleNamespace(num_computed_tokens=start, block_ids=[list(block_ids)])
        v.worker.preprocess_mamba(
            scheduler_output, self.kv_cache_config, SimpleNamespace(enable_prefix_caching=True),
            self.mamba_state_idx, input_batch, {rid: req_state}, self.forward_context,
            self.copy_funcs, self.copy_bufs)
        state_indices = v.gather(torch.tensor([block_ids], dtype=torch.int32),
                                 torch.tensor([start + n], dtype=torch.int32), self.spec, "align")
        index = int(state_indices[0, 0])
        if start == 0:  # has_initial_state is false: the kernels start from zeros
            conv, ssm = _state_after(0)
            initial = "fresh"
        else:
            conv, ssm = self.conv[index].clone(), self.ssm[index].clone()
            want_conv, want_ssm = _state_after(start)
            if torch.isnan(conv).any() or torch.isnan(ssm).any():
                initial = "NaN (never written)"
            elif torch.equal(conv, want_conv) and torch.equal(ssm, want_ssm):
                initial = "ok"
            else:
                initial = "wrong"
        self.conv[index], self.ssm[index] = _recur(conv, ssm, range(start, start + n))
        self.chunks.append(_Chunk(rid, start, start + n, index, initial))

    def of(self, rid: str) -> list[_Chunk]:
        return [c for c in self.chunks if c.request == rid]


def _check_with_smaller_group(v: _Vllm) -> None:
    # Mamba blocks of 6 tokens beside a group of 4-token blocks (upstream's padded 64-token
    # drafter sliding-window group beside Qwen3.5's 272-token GDN block, scaled down):
    # cache_config.block_size is 4, hits land on lcm(6, 4) = 12 tokens.
    engine = _Engine(v, block=6, min_block=4, budget=10)
    engine.prefill("a", 30)
    engine.prefill("b", 13)  # hits a's state at 12 tokens
    engine.prefill("c", 25)  # hits a's state at 24 tokens
    a = engine.of("a")
    # Every chunk of the prompt ends on a Mamba block boundary, or is the prompt's last.
    assert all(c.end % 6 == 0 for c in a[:-1]), [(c.start, c.end) for c in a]
    assert (engine.of("b")[0].start, engine.of("c")[0].start) == (12, 24)
    bad = [c for c in engine.chunks if c.initial not in ("fresh", "ok")]
    assert not bad, bad


def _check_aligned(v: _Vllm) -> None:
    # No smaller group: chunks of 6 (the budget allows 10) end on every Mamba boundary.
    engine = _Engine(v, block=6, min_block=6, budget=10)
    engine.prefill("a", 30)
    engine.prefill("b", 13)
    engine.prefill("c", 25)
    assert [(c.start, c.end) for c in engine.of("a")] == [
        (0, 6), (6, 12), (12, 18), (18, 24), (24, 30)]
    assert (engine.of("b")[0].start, engine.of("c")[0].start) == (12, 24)
    assert all(c.initial in ("fresh", "ok") for c in engine.chunks), engine.chunks


def _check_block_wider_than_chunk(v: _Vllm) -> None:
    # A Mamba block wider than the budget: chunks end mid-block and the next chunk resumes
    # in the same block; at a boundary the state is carried into the new block.
    engine = _Engine(v, block=8, min_block=8, budget=5)
    engine.prefill("a", 21)
    engine.prefill("b", 17)
    assert [(c.start, c.end) for c in engine.of("a")] == [
        (0, 5), (5, 8), (8, 13), (13, 16), (16, 21)]
    a = engine.of("a")
    assert a[0].state_block == a[1].state_block != a[2].state_block
    assert engine.of("b")[0].start == 16
    assert all(c.initial in ("fresh", "ok") for c in engine.chunks), engine.chunks


def test_patched_chunks_stop_on_mamba_blocks_beside_a_smaller_group(
        patched_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _check_with_smaller_group(_load(patched_vllm, monkeypatch))


def test_patched_block_aligned_chunks(patched_vllm: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _check_aligned(_load(patched_vllm, monkeypatch))


def test_patched_block_wider_than_chunk(patched_vllm: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _check_block_wider_than_chunk(_load(patched_vllm, monkeypatch))


def test_pristine_caches_a_mid_chunk_state_as_the_boundary_state(
        pristine_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    v = _load(pristine_vllm, monkeypatch)
    assert_pristine_lacks(lambda: _check_with_smaller_group(v))
    # What goes wrong: a's chunks end at multiples of 4, [0, 8) then [8, 16), so the block
    # of tokens 6..12 keeps the state after 8 tokens and is cached as the state after 12;
    # b starts from it.
    engine = _Engine(v, block=6, min_block=4, budget=10)
    engine.prefill("a", 30)
    engine.prefill("b", 13)
    assert [(c.start, c.end) for c in engine.of("a")][:2] == [(0, 8), (8, 16)]
    b = engine.of("b")[0]
    assert (b.start, b.initial) == (12, "wrong")
    # Where the sizes agree, or a block is wider than a chunk, 0.32.0 is right.
    _check_aligned(v)
    _check_block_wider_than_chunk(v)
