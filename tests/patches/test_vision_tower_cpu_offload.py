"""vision-tower-cpu-offload: with ``VLLM_VISION_CPU_OFFLOAD_GB`` > 0 the Qwen3 vision tower
builds its own ``UVAOffloader`` (budget GB * 2**30, bulk copy: ``uva_offloading`` False) and
wraps the merger, then each block as it is built; at 0 (the default) no offloader is made.

Runs vLLM's own ``Qwen3_VisionTransformer.__init__`` (model_executor/models/qwen3_vl.py) with
recording stand-ins for the vision layers and the offloader, and the knob read through the
tree's own envs.py. The real offloader moving a real-shaped tower, its memory and its output:
tests/gpu/test_vision_tower_cpu_offload_gpu.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ._helpers import assert_pristine_lacks, load_envs
from ._vision_tower import tower_class, vision_config

pytestmark = pytest.mark.e2e
torch = pytest.importorskip("torch")

DEPTH = 4


class _Events:
    def __init__(self) -> None:
        self.log: list[str] = []
        self.offloaders: list[Any] = []

    def layer(self, name: str) -> Any:
        def build(**kwargs: Any) -> Any:
            tag = name if name == "merger" else kwargs["prefix"].rsplit(".", 1)[-1]
            self.log.append(f"build {tag}")
            module = torch.nn.Linear(2, 2)
            module.tag = tag
            return module
        return build

    def offloader(self) -> Any:
        events = self

        class Recorder:
            def __init__(self, max_bytes: int, params: Any = None) -> None:
                self.max_bytes, self.params, self.uva_offloading = max_bytes, params, True
                events.offloaders.append(self)

            def wrap_modules(self, modules: Any, prefix: str = "") -> list[Any]:
                out = []
                for module in modules:
                    events.log.append(f"wrap {module.tag} uva={self.uva_offloading}")
                    out.append(module)
                return out
        return Recorder


def _build(tree: Path, monkeypatch: Any, knob: str | None) -> tuple[_Events, Any]:
    if knob is None:
        monkeypatch.delenv("VLLM_VISION_CPU_OFFLOAD_GB", raising=False)
    else:
        monkeypatch.setenv("VLLM_VISION_CPU_OFFLOAD_GB", knob)
    events = _Events()
    cls = tower_class(tree, block=events.layer("block"), merger=events.layer("merger"),
                      offloader=events.offloader())
    tower = cls(vision_config(DEPTH, 8, 16, 2, 8), prefix="visual")
    return events, tower


def _check(tree: Path, monkeypatch: Any) -> None:
    events, tower = _build(tree, monkeypatch, "1.5")
    assert len(events.offloaders) == 1, "no offloader of the tower's own"
    (offloader,) = events.offloaders
    assert offloader.max_bytes == int(1.5 * 2**30) and not offloader.params
    # the merger, then each block wrapped as soon as it is built
    assert events.log == ["build merger", "wrap merger uva=False"] + [
        line for i in range(DEPTH) for line in (f"build {i}", f"wrap {i} uva=False")
    ], events.log
    assert [b.tag for b in tower.blocks] == [str(i) for i in range(DEPTH)]
    assert tower.merger.tag == "merger"


def test_patched_wraps_the_merger_and_each_block(patched_vllm: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    _check(patched_vllm, monkeypatch)


def test_patched_knob_off_builds_no_offloader(patched_vllm: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    for knob in (None, "0"):
        events, tower = _build(patched_vllm, monkeypatch, knob)
        assert not events.offloaders
        assert events.log == ["build merger"] + [f"build {i}" for i in range(DEPTH)]
        assert isinstance(tower.blocks, torch.nn.ModuleList) and len(tower.blocks) == DEPTH


def test_patched_knob_registered(patched_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_VISION_CPU_OFFLOAD_GB", raising=False)
    envs = load_envs(patched_vllm)
    assert envs.VLLM_VISION_CPU_OFFLOAD_GB == 0.0
    monkeypatch.setenv("VLLM_VISION_CPU_OFFLOAD_GB", "2.5")
    assert envs.VLLM_VISION_CPU_OFFLOAD_GB == 2.5


def test_pristine_keeps_the_tower_on_the_device(pristine_vllm: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    assert_pristine_lacks(lambda: _check(pristine_vllm, monkeypatch))
