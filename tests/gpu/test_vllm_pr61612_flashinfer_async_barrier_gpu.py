"""vllm-pr61612-flashinfer-async-barrier on a GPU (marker ``gpu``).

FlashInfer's ``plan()`` stages its host metadata in one pinned buffer of its own and copies it
to the device with a non-blocking copy. Two steps' plans with no host barrier between them
overwrite that buffer before the first copy has run. FlashInfer is not installed on the test
machine, so its staging is played by torch (one reused pinned buffer, non-blocking H2D copies,
the stream kept busy by ``torch.cuda._sleep`` as a model forward keeps it); the host sequence
lengths each step plans with come from vLLM's own ``FlashInferMetadataBuilder.build`` of the
tree under test, under async scheduling: the upper bound (pristine) or the blocking
``seq_lens.cpu()`` (patched). Not shown here: FlashInfer's own plan() and greedy outputs
under async scheduling (needs FlashInfer and vLLM's compiled ops)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.gpu import vllm_tree
from tests.patches import _flashinfer_build as fb

pytestmark = pytest.mark.gpu
vllm_tree.require_cuda()

import torch  # noqa: E402

SLEEP_CYCLES = 200_000_000  # ~0.1 s of a busy stream on an H200


def _two_steps(host_lens: object) -> list[list[int]]:
    """Two steps: each plans (stages into one pinned buffer, copies to the device without
    blocking) while the stream is busy; what the device received for each."""
    steps = [torch.tensor([11, 12, 13, 14], dtype=torch.int32),
             torch.tensor([21, 22, 23, 24], dtype=torch.int32)]
    staging = torch.empty(4, dtype=torch.int32, pin_memory=True)
    received = [torch.zeros(4, dtype=torch.int32, device="cuda") for _ in steps]
    torch.cuda.synchronize()
    for step, lens in enumerate(steps):
        torch.cuda._sleep(SLEEP_CYCLES)  # type: ignore[no-untyped-call,unused-ignore]  # a forward running
        host = host_lens(lens)  # type: ignore[operator]
        staging.copy_(host)  # plan(): the host metadata into the pinned buffer
        received[step].copy_(staging, non_blocking=True)
    torch.cuda.synchronize()
    return [r.tolist() for r in received]


def test_torch_mechanism_race_and_barrier() -> None:
    # no barrier: the second plan overwrites the staging buffer before the first copy ran
    raced = _two_steps(lambda lens: lens)
    assert raced == [[21, 22, 23, 24]] * 2, raced
    # a blocking device-to-host read before each plan is the barrier
    probe = torch.zeros(1, device="cuda")
    fenced = _two_steps(lambda lens: (probe.cpu(), lens)[1])
    assert fenced == [[11, 12, 13, 14], [21, 22, 23, 24]], fenced
    vllm_tree.record_line("pr61612 torch mechanism: without a barrier the device saw "
                 f"{raced}; with a blocking read {fenced}")


def _check_build(tree: Path) -> None:
    mod = fb.load(tree)
    sources: list[str] = []
    # the device lengths exist before the steps (made in the previous step's prepare)
    on_device = {11: torch.tensor([11, 12, 13, 14], dtype=torch.int32, device="cuda"),
                 21: torch.tensor([21, 22, 23, 24], dtype=torch.int32, device="cuda")}

    def host_lens(lens: torch.Tensor) -> torch.Tensor:
        source, host = fb.host_seq_lens(mod, async_scheduling=True, spec_tokens=0,
                                        seq_lens=on_device[int(lens[0])], upper_bound=lens)
        sources.append(source)
        assert isinstance(host, torch.Tensor)
        return host

    got = _two_steps(host_lens)
    assert got == [[11, 12, 13, 14], [21, 22, 23, 24]], f"step 1 planned {got[0]} ({sources})"


def test_build_under_async_scheduling_is_the_barrier() -> None:
    t0 = time.perf_counter()
    vllm_tree.fails_on_pristine(_check_build)
    vllm_tree.record_line(f"pr61612 real build(): patched plans both steps correctly "
                 f"({time.perf_counter() - t0:.2f} s)")


def test_blocking_read_cost() -> None:
    # what the restored read costs on an idle stream (the step's own sync, not a wait)
    lens = torch.arange(64, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    for _ in range(10):
        lens.cpu()
    n = 200
    t0 = time.perf_counter()
    for _ in range(n):
        lens.cpu()
    us = (time.perf_counter() - t0) / n * 1e6
    vllm_tree.record_line(f"pr61612 seq_lens.cpu() of 64 int32 on an idle stream: {us:.1f} us")
    assert us > 0
