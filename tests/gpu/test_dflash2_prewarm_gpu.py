"""dflash2-prewarm on a GPU (marker ``gpu``).

vLLM's own ``prepare_dflash_inputs`` and ``_prepare_dflash_inputs_kernel``
(v1/worker/gpu/spec_decode/dflash/speculator.py, with the real ``cp_local_slot`` of
v1/worker/gpu/cp_utils.py and real Triton; the rest of its vLLM imports stubbed), in a fresh
Triton cache: after a decode-shaped first call (what the boot's dummy run is), a long
chunked-prefill continuation compiles nothing on the patched tree and one kernel on the
pristine one; outputs after prewarm + real launch equal a real-only launch bit for bit; the
compile time of all the rungs (the boot cost) is reported."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tests.gpu import vllm_tree
from tests.patches._helpers import load_with_auto_stubs, make_module

pytestmark = pytest.mark.gpu
vllm_tree.require_cuda()

import torch  # noqa: E402
import triton  # noqa: E402

FILE = "v1/worker/gpu/spec_decode/dflash/speculator.py"
NQ = 4  # query tokens per request (DFlash: the bonus token + 3 mask tokens)
MAX_REQS, MAX_TOKENS, MAX_LEN, BLOCK = 4, 8192, 65536, 16
SENTINEL = -7


def _load(tree: Path) -> Any:
    triton_utils = make_module("vllm.triton_utils", tl=triton.language, triton=triton)
    cp_utils = load_with_auto_stubs(tree / "v1/worker/gpu/cp_utils.py",
                                    {"vllm.triton_utils": triton_utils})
    return load_with_auto_stubs(tree / FILE, {
        "vllm.triton_utils": triton_utils,
        "vllm.v1.worker.gpu.cp_utils": cp_utils,
        "vllm.v1.attention.backends.utils": make_module(
            "vllm.v1.attention.backends.utils", PAD_SLOT_ID=-1),
    }, loose=True)


def _compiled(kernel: Any) -> int:
    """Variants the JIT function holds compiled (its per-device kernel caches)."""
    total = 0
    for entry in kernel.device_caches.values():
        caches = entry if isinstance(entry, tuple) else (entry,)
        total += len(next(c for c in caches if isinstance(c, dict)))
    return total


class _Inputs:
    """One step's buffers; ``outputs()`` are the tensors the kernel writes."""

    def __init__(self, query_lens: list[int], seed: int = 0) -> None:
        gen = torch.Generator(device="cuda").manual_seed(seed)
        dev = "cuda"
        n = len(query_lens)
        total = sum(query_lens)
        qsl = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
        starts = [300 + 1000 * i for i in range(n)]
        positions = np.concatenate(
            [np.arange(s, s + q) for s, q in zip(starts, query_lens, strict=True)])

        def out(size: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.full((size,), SENTINEL, dtype=dtype, device=dev)

        self.buffers = SimpleNamespace(
            input_ids=out(MAX_TOKENS, torch.int32), positions=out(MAX_TOKENS, torch.int64),
            query_start_loc=out(MAX_REQS + 1, torch.int32), seq_lens=out(MAX_REQS, torch.int32))
        self.out = dict(
            query_slot_mapping=out(MAX_TOKENS, torch.int64),
            context_positions=out(MAX_TOKENS, torch.int64),
            context_slot_mapping=out(MAX_TOKENS, torch.int64),
            sample_indices=out(MAX_REQS * (NQ - 1), torch.int32),
            sample_pos=out(MAX_REQS * (NQ - 1), torch.int64),
            sample_idx_mapping=out(MAX_REQS * (NQ - 1), torch.int32),
            temperature=out(MAX_REQS, torch.float32), seeds=out(MAX_REQS, torch.int64))
        self.batch = SimpleNamespace(
            num_reqs=n, num_scheduled_tokens=np.array(query_lens, dtype=np.int32),
            positions=torch.tensor(positions, dtype=torch.int64, device=dev),
            query_start_loc=torch.tensor(qsl, device=dev),
            idx_mapping=torch.tensor(list(range(n))[::-1], dtype=torch.int32, device=dev))
        assert int(qsl[-1]) == total
        self.extra = dict(
            num_sampled=torch.tensor([1, 0, 1, 1][:n], dtype=torch.int32, device=dev),
            num_rejected=torch.tensor([0, 1, 2, 0][:n], dtype=torch.int32, device=dev),
            last_sampled=torch.randint(0, 150000, (MAX_REQS,), generator=gen, device=dev),
            next_prefill_tokens=torch.randint(0, 150000, (MAX_REQS,), generator=gen,
                                              device=dev, dtype=torch.int32),
            input_temperature=torch.rand(MAX_REQS, generator=gen, device=dev),
            input_seeds=torch.randint(0, 2**40, (MAX_REQS,), generator=gen, device=dev),
            block_table=torch.randint(1, 5000, (MAX_REQS, MAX_LEN // BLOCK), generator=gen,
                                      device=dev, dtype=torch.int32))

    def run(self, mod: Any) -> None:
        mod.prepare_dflash_inputs(
            self.buffers, *self.out.values(), self.batch, self.extra["num_sampled"],
            self.extra["num_rejected"], self.extra["last_sampled"],
            self.extra["next_prefill_tokens"], self.extra["input_temperature"],
            self.extra["input_seeds"], self.extra["block_table"], block_size=BLOCK, cp_rank=0,
            cp_size=1, cp_interleave=1, parallel_drafting_token_id=151669,
            num_query_per_req=NQ, num_speculative_steps=NQ - 1, max_num_reqs=MAX_REQS,
            max_num_tokens=MAX_TOKENS, max_model_len=MAX_LEN)
        torch.cuda.synchronize()

    def outputs(self) -> dict[str, torch.Tensor]:
        return {**vars(self.buffers), **self.out}


def _count_files(path: str) -> int:
    return sum(len(files) for _, _, files in os.walk(path))


def _check_no_compile(tree: Path) -> None:
    saved = os.environ.get("TRITON_CACHE_DIR")
    cache = tempfile.mkdtemp(prefix="triton-cache-")
    os.environ["TRITON_CACHE_DIR"] = cache
    try:
        mod = _load(tree)
        t0 = time.perf_counter()
        _Inputs([NQ, NQ]).run(mod)  # decode-shaped: the boot's dummy run
        first = time.perf_counter() - t0
        kernels, files = _compiled(mod._prepare_dflash_inputs_kernel), _count_files(cache)
        t0 = time.perf_counter()
        _Inputs([2048, NQ], seed=1).run(mod)  # a long chunked-prefill continuation
        long_call = time.perf_counter() - t0
        new_kernels = _compiled(mod._prepare_dflash_inputs_kernel) - kernels
        new_files = _count_files(cache) - files
    finally:
        if saved is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = saved
    vllm_tree.record_line(f"  {tree.parent.name}: first (decode) call {first:.2f} s compiling {kernels} "
                 f"variant(s); long call {long_call * 1e3:.1f} ms, {new_kernels} new variant(s), "
                 f"{new_files} new cache file(s)")
    assert new_kernels == 0, f"{new_kernels} compile(s) in the long call"


def test_no_compile_after_prewarm() -> None:
    vllm_tree.record_line("dflash2-prewarm (real kernel, fresh Triton cache):")
    vllm_tree.fails_on_pristine(_check_no_compile)


def test_prewarm_outputs_are_the_real_launchs() -> None:
    _, patched = vllm_tree.trees()
    mod = _load(patched)
    warm = _Inputs([2048, NQ], seed=2)
    warm.run(mod)  # first call of the key: the rungs 8..128, then the real 256 launch
    assert _compiled(mod._prepare_dflash_inputs_kernel) == 6
    real = _Inputs([2048, NQ], seed=2)
    real.run(mod)  # warm key: the real launch alone
    for name, tensor in warm.outputs().items():
        assert torch.equal(tensor, real.outputs()[name]), name
    assert int((warm.buffers.input_ids != SENTINEL).sum()) == 2 * NQ
    vllm_tree.record_line("dflash2-prewarm: prewarm + real launch outputs equal a real-only launch "
                 "bit for bit (12 output tensors, 2 requests, query lengths 2048 and 4)")
