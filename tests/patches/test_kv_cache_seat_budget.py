"""kv-cache-seat-budget: one INFO line after "GPU KV cache size" with the requests resident
at ~1k, 32k and max_model_len tokens, from each device group's admission cost at that
length and the pool's usable blocks."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ._helpers import assert_pristine_lacks, exec_function

pytestmark = pytest.mark.e2e

BLOCK = 16


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class FullSpec:
    page_size_bytes = 2

    def max_memory_usage_bytes(self, vc: Any) -> int:
        return cdiv(vc.model_config.max_model_len, BLOCK) * self.page_size_bytes


class SlidingSpec(FullSpec):
    window = 4096

    def max_memory_usage_bytes(self, vc: Any) -> int:
        tokens = min(vc.model_config.max_model_len, self.window)
        return cdiv(tokens, BLOCK) * self.page_size_bytes


class HostSpec(FullSpec):
    def max_memory_usage_bytes(self, vc: Any) -> int:  # never counted: host pool
        return 10**12


class _Logger(logging.LoggerAdapter):  # type: ignore[type-arg]
    def info_once(self, msg: str, *args: Any) -> None:
        self.info(msg, *args)


def _setup(tree: Path, max_model_len: int) -> tuple[Any, Any, Any]:
    path = tree / "v1/core/kv_cache_utils.py"
    ns: dict[str, Any] = {
        "cdiv": cdiv, "VllmConfig": object, "KVCacheConfig": object,
        "logger": _Logger(logging.getLogger("test.kv_seats"), {}),
    }
    for name in ("get_max_concurrency_for_kv_cache_config", "get_kv_cache_capacity",
                 "_kv_cache_device_name"):
        ns[name] = exec_function(path, name, ns)
    src = path.read_text()
    if "KV_CACHE_SEAT_LENGTHS = " in src:  # the patch's module constant
        exec(src[src.index("KV_CACHE_SEAT_LENGTHS = "):].split("\n", 1)[0], ns)
        ns["get_kv_cache_seat_budget"] = exec_function(path, "get_kv_cache_seat_budget", ns)
    update = exec_function(path, "update_kv_cache_capacity", ns)
    vc = SimpleNamespace(
        model_config=SimpleNamespace(max_model_len=max_model_len),
        cache_config=SimpleNamespace(),
        device_config=SimpleNamespace(device_type="cuda"),
        attention_config=SimpleNamespace(hisparse_config=None),
    )
    groups = [
        SimpleNamespace(kv_cache_spec=FullSpec(), host_resident=False),
        SimpleNamespace(kv_cache_spec=SlidingSpec(), host_resident=False),
        SimpleNamespace(kv_cache_spec=HostSpec(), host_resident=True),
    ]
    kvc = SimpleNamespace(num_blocks=10_001, kv_cache_groups=groups,
                          hisparse_host_num_blocks=10**9)
    return update, vc, kvc


def _check(tree: Path, caplog: pytest.LogCaptureFixture) -> None:
    update, vc, kvc = _setup(tree, 65536)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        update(vc, kvc)
    msgs = [r.getMessage() for r in caplog.records if r.name == "test.kv_seats"]
    assert len(msgs) == 2, msgs
    assert msgs[0].startswith("GPU KV cache size")
    seat = msgs[1]
    # 10,000 usable blocks. 1,024 tokens: 64 full + 64 window blocks -> 78 requests.
    # 32,768: 2,048 + 256 -> 4. 65,536 (max_model_len): 4,096 + 256 -> 2.
    assert "78 at 1,024 tokens" in seat, seat
    assert "4 at 32,768 tokens" in seat, seat
    assert "2 at 65,536 tokens" in seat, seat
    assert vc.model_config.max_model_len == 65536, "max_model_len not restored"
    # A short max_model_len: lengths above it are not reported.
    update, vc, kvc = _setup(tree, 8192)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        update(vc, kvc)
    seat = [r.getMessage() for r in caplog.records if r.name == "test.kv_seats"][1]
    assert "32,768" not in seat and "at 8,192 tokens" in seat, seat


def test_patched_logs_seat_budget(patched_vllm: Path, caplog: pytest.LogCaptureFixture) -> None:
    _check(patched_vllm, caplog)


def test_pristine_lacks_seat_budget(pristine_vllm: Path,
                                    caplog: pytest.LogCaptureFixture) -> None:
    assert_pristine_lacks(lambda: _check(pristine_vllm, caplog))
