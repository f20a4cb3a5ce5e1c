"""Kernels in the graph with a real nvcc (the system's, asked for explicitly): one cached
step per arch; a hit compiles nothing; a new source misses only the kernel steps.

The locked toolchain's own path (no nvcc on PATH at all) is covered by test_toolchain.py.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import zipfile
from pathlib import Path

import pytest

from tests.conftest import Project
from tests.engine_fixtures import KERNEL, add_pthfa_sources, relist_pthfa

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")



@pytest.fixture
def kproject(project: Project) -> Project:
    add_pthfa_sources(project.root)
    return project


def test_kernels_build_per_arch_then_hit_without_compiling(
    kproject: Project, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert kproject.run("kernels", "--system-nvcc", "--json", "-q") == 0
    first = json.loads(capsys.readouterr().out)
    assert set(first["cubins"]) == {"8.6", "9.0"}
    with zipfile.ZipFile(first["wheel"]) as z:
        names = z.namelist()
    assert "pthfa/cubins/sm_86.cubin" in names and "pthfa/cubins/sm_90.cubin" in names
    assert "pthfa/cubins/compute_90.ptx" in names  # PTX for the newest arch only

    # A hit must not compile: make any compile fail loudly.
    def no_compile(*a: object, **k: object) -> None:
        raise AssertionError("nvcc ran on a cache hit")

    monkeypatch.setattr("qwen38build.steps.cubin.compile_arch", no_compile)
    (kproject.root / "pthfa" / "python" / "pthfa" / "__init__.py").write_text('"""v2"""\n')
    relist_pthfa(kproject.root)
    monkeypatch.setenv("QWEN38BUILD_NVCC", "system")  # the same request, by environment
    assert kproject.run("kernels", "--json", "-q") == 0
    second = json.loads(capsys.readouterr().out)
    assert second["cubins"] == first["cubins"]  # the cubins were hits
    assert second["build"] != first["build"]  # the wheel step saw the package change


def test_a_source_change_misses_only_the_kernel_steps(
    kproject: Project, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("QWEN38BUILD_NVCC", "system")
    assert kproject.run("kernels", "--json", "-q", "--arch", "sm_90") == 0
    before = json.loads(capsys.readouterr().out)
    (kproject.root / "pthfa" / "csrc" / "tiny.cu").write_text(KERNEL.replace("1.0f", "2.0f"))
    relist_pthfa(kproject.root)
    assert kproject.run("kernels", "--json", "-q", "--arch", "9.0") == 0
    after = json.loads(capsys.readouterr().out)
    assert before["cubins"]["9.0"] != after["cubins"]["9.0"]
    assert kproject.run("plan", "--json") == 0
    plan = json.loads(capsys.readouterr().out)
    assert [s["built"] for s in plan["steps"] if s["kind"] == "fetch"] == [False]


def test_the_plugin_entry_point_goes_into_the_wheels_dist_info(
    kproject: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM loads pthfa's backend through a ``vllm.general_plugins`` entry point: the
    tree's ``entry_points.txt`` (listed in its MANIFEST) is the wheel's, and in RECORD."""
    points = b"[vllm.general_plugins]\npthfa = pthfa.vllm_plugin:register\n"
    (kproject.root / "pthfa" / "entry_points.txt").write_bytes(points)
    relist_pthfa(kproject.root)
    manifest = kproject.root / "pthfa" / "MANIFEST"
    manifest.write_text(manifest.read_text() + f"{hashlib.sha256(points).hexdigest()}  "
                        "entry_points.txt\n")
    assert kproject.run("kernels", "--json", "-q") == 0
    wheel = Path(json.loads(capsys.readouterr().out)["wheel"])
    with zipfile.ZipFile(wheel) as z:
        assert z.read("pthfa-0.1.0.dist-info/entry_points.txt") == points
        assert "pthfa-0.1.0.dist-info/entry_points.txt," in z.read(
            "pthfa-0.1.0.dist-info/RECORD").decode()
