"""vLLM's own ``FlashInferMetadataBuilder.build`` (v1/attention/backends/flashinfer.py, its
imports stubbed, FlashInfer included) on a one-prefill batch, run up to the point where it
first uses its host sequence lengths: which source they came from (the scheduler's host upper
bound, or the blocking ``seq_lens.cpu()``) and the host object itself.

The CPU test passes stand-ins; the GPU test passes a CUDA tensor, whose ``.cpu()`` is the real
blocking read."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ._helpers import load_with_auto_stubs

FILE = "v1/attention/backends/flashinfer.py"
BOUND = "host upper bound"
BLOCKING = "blocking seq_lens.cpu()"


class _Reached(Exception):
    def __init__(self, source: str, host: Any) -> None:
        super().__init__(source)
        self.source, self.host = source, host


class _Host:
    """Host lengths: the build's ``.numpy()`` on them ends the run."""

    def __init__(self, source: str, host: Any) -> None:
        self.source, self.host = source, host

    def numpy(self) -> Any:
        raise _Reached(self.source, self.host)


class _Device:
    def __init__(self, seq_lens: Any) -> None:
        self.seq_lens = seq_lens

    def cpu(self) -> _Host:
        cpu = getattr(self.seq_lens, "cpu", None)
        return _Host(BLOCKING, cpu() if cpu is not None else None)


def load(tree: Path) -> Any:
    mod = load_with_auto_stubs(tree / FILE, prefixes=("vllm", "flashinfer"), loose=True)
    mod.__dict__.update(
        split_decodes_and_prefills=lambda *a, **k: (0, 1, 0, 4),
        use_trtllm_attention=lambda *a, **k: False,
        FlashInferMetadata=SimpleNamespace,
        gpu_sync_allowed=nullcontext,
    )
    return mod


def host_seq_lens(mod: Any, *, async_scheduling: bool, spec_tokens: int, seq_lens: Any = None,
                  upper_bound: Any = None, bound: bool = True) -> tuple[str, Any]:
    """(source, host lengths) of one real ``build()`` of the loaded module ``mod``."""
    cls = mod.FlashInferMetadataBuilder
    builder = cls.__new__(cls)
    builder.__dict__.update(
        use_xqa=False, reorder_batch_threshold=1, use_trtllm_gen_varlen_decode=False,
        page_size=16, attention_config=SimpleNamespace(use_trtllm_attention=False),
        num_qo_heads=8, num_kv_heads=2, dcp_world_size=1, cache_dtype="auto",
        q_data_type_prefill=None, q_data_type_decode=None, has_sinks=False,
        use_trtllm_decode_attention=False, use_dcp=False, kv_cache_layout="NHD",
        global_hyperparameters=SimpleNamespace(has_same_window_lefts=True,
                                               has_same_all_params=True),
        _num_speculative_tokens=spec_tokens,
        vllm_config=SimpleNamespace(
            scheduler_config=SimpleNamespace(async_scheduling=async_scheduling)),
    )
    metadata = SimpleNamespace(
        num_reqs=1, num_actual_tokens=4, causal=True, max_seq_len=10,
        seq_lens=_Device(seq_lens), block_table_tensor=None, query_start_loc=None,
        query_start_loc_cpu=None, slot_mapping=None,
        seq_lens_cpu_upper_bound=_Host(BOUND, upper_bound) if bound else None)
    try:
        builder.build(common_prefix_len=0, common_attn_metadata=metadata)
    except _Reached as reached:
        return reached.source, reached.host
    raise AssertionError("build() never used its host sequence lengths")
