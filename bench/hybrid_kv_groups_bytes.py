"""What hybrid-kv-groups-v2-cudagraph costs in KV memory: the planner's bytes per request.

    .venv/bin/python bench/hybrid_kv_groups_bytes.py [--lengths 2048 4096 ...]
        [--max-num-batched-tokens 2048]

Runs vLLM's own KV cache planner (kv_cache_utils.get_kv_cache_groups,
get_kv_cache_config_from_groups and get_max_concurrency_for_kv_cache_config, over the
real spec classes of kv_cache_interface.py, on CPU torch) twice: on the vLLM files with the
series cut just before the patch, and through it. The model is the one of the patch's
behaviour test: a 64-layer Qwen3.5-shaped target (48 GDN layers, 16 full attention) and a
five-layer DFlash drafter (four full attention, one sliding-window layer of 2,048 tokens).

For each max_model_len it prints the KV cache groups, the pages in one block of the shared
pool, the blocks one request of that length needs in every group (vLLM's own admission
count: each spec's max_memory_usage_bytes over its page), and the bytes that makes
(blocks x block bytes), i.e. the pool bytes one resident request takes. The GPU step time
the extra groups cost is not measured here.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.series_cuts import _apply, _pristine_tree  # noqa: E402
from tests.patches._helpers import make_module, stub_modules  # noqa: E402
from tests.patches.conftest import SERIES  # noqa: E402
from tests.patches.test_hybrid_kv_groups_v2_cudagraph import (  # noqa: E402
    _config,
    _modules,
    _specs,
)

TOPIC = "hybrid-kv-groups-v2-cudagraph"
MIB = 1 << 20


def _plan(tree: Path, lengths: list[int], batched: int) -> list[dict[str, Any]]:
    kvi, utils = _modules(tree)
    specs, full = _specs(kvi, draft_sliding=1)
    vc = _config(kvi, "dflash")
    groups = utils.get_kv_cache_groups(vc, dict(specs))
    backend = make_module("vllm.v1.attention.backend", MultipleOf=type("MultipleOf", (), {}))
    available = 1000 * len(specs) * full.page_size_bytes
    with stub_modules({"vllm.v1.attention.backend": backend}):
        config = utils.get_kv_cache_config_from_groups(vc, groups, available_memory=available)
    # The pool is cut into num_blocks blocks of equal bytes.
    block_bytes = available // config.num_blocks
    rows = []
    for length in lengths:
        vc.model_config.max_model_len = length
        vc.scheduler_config.max_num_batched_tokens = batched
        vc.max_concurrent_batches = 1
        vc.max_in_flight_tokens = batched
        vc.parallel_config = SimpleNamespace(decode_context_parallel_size=1)
        vc.cache_config.mamba_cache_mode = "none"
        per_group = [
            -(-g.kv_cache_spec.max_memory_usage_bytes(vc) // g.kv_cache_spec.page_size_bytes)
            for g in config.kv_cache_groups
        ]
        rows.append({
            "length": length, "groups": len(config.kv_cache_groups),
            "pages_per_block": block_bytes // full.page_size_bytes,
            "blocks": sum(per_group), "bytes": sum(per_group) * block_bytes,
            "concurrency": utils.get_max_concurrency_for_kv_cache_config(vc, config),
        })
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 32768])
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="qwen38-kvgroups-") as tmp:
        running = _pristine_tree(Path(tmp) / "tree")
        for topic in SERIES[: SERIES.index(TOPIC)]:
            _apply(running, topic)
        before = Path(tmp) / "before"
        shutil.copytree(running, before)
        _apply(running, TOPIC)
        plans = {"before": _plan(before, args.lengths, args.max_num_batched_tokens),
                 "through": _plan(running, args.lengths, args.max_num_batched_tokens)}
    print(f"max_num_batched_tokens {args.max_num_batched_tokens}; one request of "
          "max_model_len tokens")
    print(f"{'length':>7}  {'cut':<8} {'groups':>6} {'pages/block':>11} {'blocks':>6} "
          f"{'MiB/request':>11} {'vs before':>9}")
    for i, length in enumerate(args.lengths):
        base = plans["before"][i]["bytes"]
        for cut in ("before", "through"):
            row = plans[cut][i]
            print(f"{length:>7}  {cut:<8} {row['groups']:>6} {row['pages_per_block']:>11} "
                  f"{row['blocks']:>6} {row['bytes'] / MIB:>11.1f} "
                  f"{row['bytes'] / base - 1:>+9.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
