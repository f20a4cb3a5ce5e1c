"""dflash2-prewarm: the first ``prepare_dflash_inputs`` call per (device, query tokens per
request, sample-from-anchor, CP) launches ``_prepare_dflash_inputs_kernel`` once for every
other BLOCK_SIZE rung it can choose, before the real launch; later calls launch only the real
one; a call under CUDA graph capture does not prewarm.

Runs vLLM's own ``prepare_dflash_inputs`` (v1/worker/gpu/spec_decode/dflash/speculator.py,
its vLLM imports stubbed) with the kernel replaced by a recorder of its launches. Compiles
and outputs on a GPU: tests/gpu/test_dflash2_prewarm_gpu.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from ._helpers import assert_pristine_lacks, load_with_auto_stubs

pytestmark = pytest.mark.e2e

FILE = "v1/worker/gpu/spec_decode/dflash/speculator.py"


def _next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


class _Kernel:
    def __init__(self) -> None:
        self.launches: list[tuple[tuple[int, int], int]] = []

    def __getitem__(self, grid: tuple[int, int]) -> Any:
        def launch(*args: Any, **kwargs: Any) -> None:
            self.launches.append((grid, kwargs["BLOCK_SIZE"]))
        return launch


class _Speculator:
    """The module with a recording kernel; ``call`` runs one prepare_dflash_inputs."""

    def __init__(self, tree: Path) -> None:
        self.mod = load_with_auto_stubs(tree / FILE, loose=True)
        self.kernel = _Kernel()
        self.capturing = False
        self.mod.__dict__.update(
            _prepare_dflash_inputs_kernel=self.kernel,
            triton=SimpleNamespace(next_power_of_2=_next_pow2,
                                   cdiv=lambda a, b: -(-a // b)),
            torch=SimpleNamespace(cuda=SimpleNamespace(
                is_current_stream_capturing=lambda: self.capturing)),
        )

    def call(self, query_lens: list[int], *, num_query_per_req: int = 4,
             device: str = "cuda:0", sample_from_anchor: bool = False) -> list[Any]:
        start = len(self.kernel.launches)
        tensor = SimpleNamespace(device=device)
        buffers = SimpleNamespace(input_ids=tensor, positions=tensor, query_start_loc=tensor,
                                  seq_lens=tensor, is_padding=tensor)  # is_padding: 0.33.0
        batch = SimpleNamespace(num_reqs=len(query_lens),
                                num_scheduled_tokens=np.array(query_lens, dtype=np.int32),
                                positions=tensor, query_start_loc=tensor, idx_mapping=tensor)
        block_table = SimpleNamespace(stride=lambda dim: 64)
        self.mod.prepare_dflash_inputs(
            buffers, *([tensor] * 8), batch, *([tensor] * 6), block_table,
            block_size=16, cp_rank=0, cp_size=1, cp_interleave=1,
            parallel_drafting_token_id=7, num_query_per_req=num_query_per_req,
            num_speculative_steps=num_query_per_req - 1, max_num_reqs=8,
            max_num_tokens=8192, max_model_len=32768, sample_from_anchor=sample_from_anchor)
        return self.kernel.launches[start:]


def _check(tree: Path) -> None:
    spec = _Speculator(tree)
    # decode-shaped first call: 4 query tokens per request, target query length 4 -> 8
    first = spec.call([4, 4])
    assert first == [((2, 1), 16), ((2, 1), 32), ((2, 1), 64), ((2, 1), 128),
                     ((2, 1), 256), ((2, 1), 8)], first
    # warm: a long continuation launches only itself (and needs the 256 rung warmed above)
    assert spec.call([2048, 4]) == [((2, 9), 256)]
    assert spec.call([4]) == [((1, 1), 8)]
    # another key warms again: 2 query tokens per request start at rung 4
    assert [b for _, b in spec.call([1], num_query_per_req=2)] == [8, 16, 32, 64, 128, 256, 4]
    assert len(spec.call([4], sample_from_anchor=True)) == 6
    assert len(spec.call([4], device="cuda:1")) == 6
    # under capture: no prewarm, and the key stays cold for the next eager call
    spec.capturing = True
    assert spec.call([4], num_query_per_req=8) == [((1, 1), 16)]
    spec.capturing = False
    assert [b for _, b in spec.call([4], num_query_per_req=8)] == [32, 64, 128, 256, 16]


def test_patched_first_call_prewarms_every_rung(patched_vllm: Path) -> None:
    _check(patched_vllm)


def test_pristine_launches_only_the_rung_it_needs(pristine_vllm: Path) -> None:
    assert _Speculator(pristine_vllm).call([4, 4]) == [((2, 1), 8)]
    assert_pristine_lacks(lambda: _check(pristine_vllm))
