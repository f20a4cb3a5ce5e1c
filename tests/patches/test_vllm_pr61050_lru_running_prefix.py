"""vllm-pr61050-lru-running-prefix: with the LRU policy, the CPU KV tier keeps a running
request's head chunks; an eviction before the request finishes takes its tail first.
Drives the real CPUOffloadingManager and LRUCachePolicy."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from ._helpers import AutoStub, assert_pristine_lacks, load_with_auto_stubs, make_module

pytestmark = pytest.mark.e2e


@dataclass
class ReqContext:
    """The interface of vllm.v1.kv_offload.base.ReqContext the manager uses."""

    req_id: str
    _state: dict[type, Any] = field(default_factory=dict)
    _positions: dict[Any, int] = field(default_factory=dict)
    # Position look-ups allowed before the test calls the work superlinear.
    lookup_budget: int | None = None
    lookups: int = 0

    def set_state(self, val: Any) -> None:
        self._state[type(val)] = val

    def get_state(self, cls: type) -> Any:
        return self._state.get(cls)

    def set_offload_key_position(self, key: Any, end_token: int) -> None:
        self._positions[key] = end_token

    def get_offload_key_position(self, key: Any) -> int | None:
        self.lookups += 1
        if self.lookup_budget is not None and self.lookups > self.lookup_budget:
            raise AssertionError(f"more than {self.lookup_budget} position look-ups")
        return self._positions.get(key)


class PrepareStoreOutput(NamedTuple):
    keys_to_store: list[Any]
    store_spec: Any
    evicted_keys: list[Any]


class Medium(enum.Enum):
    CPU = "CPU"


class LookupResult(enum.Enum):
    MISS = 0
    HIT = 1
    HIT_PENDING = 2


def _manager(tree: Path, num_chunks: int) -> Any:
    base_stub = AutoStub("vllm.v1.kv_offload.base")
    base_stub.__dict__.update(
        OffloadKey=str, ReqContext=ReqContext, PrepareStoreOutput=PrepareStoreOutput,
        Medium=Medium, LookupResult=LookupResult, OffloadingManager=object,
        get_offload_group_idx=lambda key: 0,
    )
    policies = tree / "v1/kv_offload/cpu/policies"
    pbase = load_with_auto_stubs(policies / "base.py", {"vllm.v1.kv_offload.base": base_stub})
    lru = load_with_auto_stubs(policies / "lru.py", {
        "vllm.v1.kv_offload.base": base_stub, "vllm.v1.kv_offload.cpu.policies.base": pbase})

    class Factory:
        @staticmethod
        def get_cache_policy_cls(name: str, module_path: str | None) -> Any:
            assert name == "lru"
            return lru.LRUCachePolicy

    manager = load_with_auto_stubs(tree / "v1/kv_offload/cpu/manager.py", {
        "vllm.v1.kv_offload.base": base_stub,
        "vllm.v1.kv_offload.cpu.policies.base": pbase,
        "vllm.v1.kv_offload.cpu.policies.factory": make_module(
            "f", CachePolicyFactory=Factory),
    })
    return manager.CPUOffloadingManager(num_chunks=num_chunks, cache_policy="lru")


def _store(m: Any, req: ReqContext, keys: list[str]) -> list[str]:
    for k in keys:
        req.set_offload_key_position(k, 16 * (int(k[1:]) + 1))
    out = m.prepare_store(keys, req)
    assert out is not None
    m.complete_store(out.keys_to_store, req)
    return list(out.evicted_keys)


def _check(tree: Path) -> None:
    m = _manager(tree, num_chunks=4)
    a = ReqContext("a")
    # A running request stores its prefix over two steps and fills the tier.
    assert _store(m, a, ["a0", "a1"]) == []
    assert _store(m, a, ["a2", "a3"]) == []
    # Another request needs room while `a` is still running: `a`'s tail goes first.
    b = ReqContext("b")
    assert _store(m, b, ["b0"]) == ["a3"], "evicted the running request's head"
    assert _store(m, b, ["b1"]) == ["a2"]
    for head in ("a0", "a1"):
        assert m.lookup(head, a).name == "HIT", head


def _check_finished_unchanged(tree: Path) -> None:
    # After the request finishes, its head is kept ahead of its tail too (as before).
    m = _manager(tree, num_chunks=3)
    a = ReqContext("a")
    _store(m, a, ["a0", "a1", "a2"])
    m.on_request_finished(a)
    assert _store(m, ReqContext("b"), ["b0"]) == ["a2"]


LONG = 10_000


def _check_long_request_linear(tree: Path) -> None:
    """A 10,000-block request stored one block per store (a long prefill): the work
    per store is the new keys only, and the tier gives up its tail block by block."""
    m = _manager(tree, num_chunks=LONG)
    # Each store may look up its own keys' positions a small constant number of times;
    # re-ranking the whole request on each store needs ~LONG**2 / 2 look-ups.
    a = ReqContext("a", lookup_budget=4 * LONG)
    for i in range(LONG):
        assert _store(m, a, [f"a{i}"]) == []
    b = ReqContext("b")
    evicted = [key for j in range(300) for key in _store(m, b, [f"b{j}"])]
    assert evicted == [f"a{i}" for i in range(LONG - 1, LONG - 301, -1)]
    assert m.lookup("a0", a).name == "HIT"
    # Stores that arrive out of order (SWA backfill) are ranked by position.
    m = _manager(tree, num_chunks=6)
    c = ReqContext("c")
    _store(m, c, ["a3", "a4", "a5"])
    _store(m, c, ["a0", "a1", "a2"])
    d = ReqContext("d")
    assert [k for j in range(3) for k in _store(m, d, [f"b{j}"])] == ["a5", "a4", "a3"]


def test_patched_long_request_tail_first_in_linear_work(patched_vllm: Path) -> None:
    _check_long_request_linear(patched_vllm)


def test_patched_running_request_loses_tail_first(patched_vllm: Path) -> None:
    _check(patched_vllm)
    _check_finished_unchanged(patched_vllm)


def test_pristine_evicts_running_head(pristine_vllm: Path) -> None:
    assert_pristine_lacks(lambda: _check(pristine_vllm))
