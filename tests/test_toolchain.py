"""The CUDA toolchain as a locked, fetched step: NVIDIA's compiler wheels pinned in lock/,
extracted into the store with their run bits, and the only nvcc a kernel build runs unless
the user asks for the system's.

Offline tests use five tiny stand-in wheels whose ``nvcc`` is a shell script: it logs every
call and writes an ELF header carrying the requested SM, so the step logic runs for real
without a compiler. One test (network, slow) fetches and runs the real toolchain.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from qwen38build.engine.executor import realise
from qwen38build.engine.plan import kernel_steps, make_plan, toolchain_step
from qwen38build.engine.report import Reporter
from qwen38build.errors import InputError, RecipeError, UsageError
from qwen38build.inputs import lock as lockmod
from qwen38build.inputs.recipe import load
from qwen38build.kernels.kernels import BASE_PATH, cubin_sm, system_nvcc_requested
from qwen38build.kernels.toolchain import PACKAGES
from qwen38build.steps.fetch import platform_args
from qwen38build.store.store import Store
from tests.conftest import Project
from tests.engine_fixtures import (
    FAKE_NVCC,
    PLATFORM,
    VERSION_TEXT,
    add_pthfa_sources,
    add_to_lock,
    modal_wheel,
    sha256,
)

REPO = Path(__file__).resolve().parents[1]
@pytest.fixture
def tproject(project: Project, monkeypatch: pytest.MonkeyPatch) -> Project:
    """The engine's project plus pthfa sources and a stand-in toolchain pinned in its lock;
    no nvcc anywhere on PATH."""
    add_pthfa_sources(project.root)
    monkeypatch.setenv("PATH", BASE_PATH)
    monkeypatch.delenv("QWEN38BUILD_NVCC", raising=False)
    return project


def calls(p: Project) -> list[str]:
    log = p.tmp / "nvcc.log"
    return log.read_text().splitlines() if log.exists() else []


def loaded(p: Project):  # type: ignore[no-untyped-def]
    return load(p.root / "recipe.toml")


# -- the step ---------------------------------------------------------------------------


def test_toolchain_step_extracts_the_wheels_and_restores_run_bits(tproject: Project) -> None:
    step = toolchain_step(loaded(tproject), lockmod.read(tproject.root))
    assert [name for name, _ in step.deps] == list(PACKAGES)
    store = Store(tproject.store)
    out = realise([step], store, Reporter(quiet=True))[step.digest].entry
    top = out.path / "nvidia" / "cu13"
    for rel in ("bin/nvcc", "bin/ptxas", "nvvm/bin/cicc"):
        assert (top / rel).stat().st_mode & stat.S_IXUSR, rel  # zip lost them; restored
    assert not (top / "bin" / "nvcc.profile").stat().st_mode & stat.S_IXUSR
    manifest = json.loads(out.file("toolchain.json").read_text())
    assert manifest["nvcc"] == "nvidia/cu13/bin/nvcc"
    assert VERSION_TEXT in manifest["nvcc_version"]  # the locked nvcc ran once, to check it
    assert "include/cccl/cuda/std/cstdint" in "".join(out.outputs)
    assert calls(tproject) == ["--version"]


def test_toolchain_refuses_a_wheel_member_outside_its_tree(tproject: Project) -> None:
    bad = modal_wheel(tproject.wheels, "nvidia-cuda-crt", "13.0.88",
                 {"nvidia/cu13/../../escape.h": (b"x", 0o644)})
    add_to_lock(tproject.root, [bad])
    step = toolchain_step(loaded(tproject), lockmod.read(tproject.root))
    store = Store(tproject.store)
    with pytest.raises(InputError, match="outside its directory"):
        realise([step], store, Reporter(quiet=True))
    assert store.get(step.digest) is None
    assert not (tproject.store.parent / "escape.h").exists()


# -- kernels with it --------------------------------------------------------------------


def test_kernels_compile_with_the_locked_nvcc_and_a_hit_runs_no_compiler(
    tproject: Project, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    out_dir = tproject.tmp / "artifacts"
    monkeypatch.setenv("CUDA_HOME", "/usr/local/cuda")  # the machine's CUDA: never passed on
    monkeypatch.setenv("LD_LIBRARY_PATH", "/usr/local/cuda/lib64")
    assert tproject.run("kernels", "--json", "-q", "--out", str(out_dir)) == 0
    first = json.loads(capsys.readouterr().out)
    assert set(first["cubins"]) == {"8.6", "9.0"}
    compiles = [c for c in calls(tproject) if "-cubin" in c]
    assert len(compiles) == 2  # one per arch, by the toolchain's nvcc (none is on PATH)
    envs = (tproject.tmp / "nvcc.log.env").read_text().splitlines()
    assert len(envs) == 1 + 2 + 1  # --version once, then per arch a cubin, and one PTX
    for seen in envs:  # a scrubbed environment: the toolchain's bin, then the host's
        bin_dir = seen.split("PATH=")[-1].split(os.pathsep)[0]
        assert seen == f"CUDA_HOME= LD_LIBRARY_PATH= PATH={bin_dir}{os.pathsep}{BASE_PATH}"
        assert bin_dir.startswith(str(tproject.store)) and bin_dir.endswith("nvidia/cu13/bin")
    with zipfile.ZipFile(first["wheel"]) as z:
        names = set(z.namelist())
        assert {"pthfa/cubins/sm_86.cubin", "pthfa/cubins/sm_90.cubin"} <= names
        (tproject.tmp / "sm_86.cubin").write_bytes(z.read("pthfa/cubins/sm_86.cubin"))
    assert cubin_sm(tproject.tmp / "sm_86.cubin") == 86
    assert sorted(p.name for p in out_dir.iterdir()) == [
        "compute_90.ptx", Path(first["wheel"]).name, "sm_86.cubin", "sm_90.cubin"]

    def no_compile(*a: object, **k: object) -> None:
        raise AssertionError("a compiler ran on a cache hit")

    monkeypatch.setattr("qwen38build.steps.cubin.compile_arch", no_compile)
    monkeypatch.setattr("qwen38build.steps.toolchain.nvcc_version", no_compile)
    before = calls(tproject)
    assert tproject.run("kernels", "--json", "-q") == 0
    second = json.loads(capsys.readouterr().out)
    assert second["build"] == first["build"]
    assert calls(tproject) == before  # the stand-in nvcc was not even asked its version


def test_plan_lists_the_kernels_with_no_nvcc_on_path(
    tproject: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    assert tproject.run("plan", "--json") == 0
    plan = json.loads(capsys.readouterr().out)
    kinds = [s["kind"] for s in plan["steps"]]
    assert kinds.count("cubin") == 2 and kinds.count("toolchain") == 1
    assert kinds.count("fetch") == 1 + len(PACKAGES)
    assert not [d for d in plan["declared"] if d["name"] == "pthfa kernels"]
    assert calls(tproject) == []  # planning runs no compiler


def test_kernel_digests_change_with_a_toolchain_sha256_and_only_then(
    tproject: Project,
) -> None:
    rec = loaded(tproject)
    locked = lockmod.read(tproject.root)
    base = [s.digest for s in kernel_steps(rec, locked=locked)]
    vllm_base = make_plan(rec, locked).build_hash
    assert [s.digest for s in kernel_steps(rec, locked=dict(locked))] == base  # stable

    nvvm = locked["nvidia-nvvm"]
    other = {**locked, "nvidia-nvvm": replace(nvvm, sha256="0" * 64)}
    moved = [s.digest for s in kernel_steps(rec, locked=other)]
    assert all(a != b for a, b in zip(base, moved, strict=True))  # every kernel step moved
    assert make_plan(rec, other).build_hash == vllm_base  # the vLLM wheel did not

    vllm = locked["vllm"]
    repinned = {**locked, "vllm": replace(vllm, sha256="1" * 64)}
    assert [s.digest for s in kernel_steps(rec, locked=repinned)] == base
    assert make_plan(rec, repinned).build_hash != vllm_base


def test_the_system_nvcc_only_on_request_and_its_version_in_the_digest(
    tproject: Project, monkeypatch: pytest.MonkeyPatch,
) -> None:
    rec = loaded(tproject)
    locked = lockmod.read(tproject.root)
    system = tproject.tmp / "system-cuda"
    sys_log = tproject.tmp / "system-nvcc.log"
    system.mkdir()
    (system / "nvcc").write_text(FAKE_NVCC.replace("@LOG@", str(sys_log)).replace(
        "@VERSION@", "Cuda compilation tools, release 13.0, V13.0.48"))
    (system / "nvcc").chmod(0o755)
    monkeypatch.setenv("PATH", f"{system}{os.pathsep}{BASE_PATH}")
    locked_steps = kernel_steps(rec, locked=locked)
    assert not sys_log.exists()  # on PATH, but not asked for: never run
    chosen = kernel_steps(rec, locked=locked, system_nvcc=True)
    assert chosen[0].params["nvcc"] == "system"
    assert "V13.0.48" in chosen[0].params["nvcc_version"]
    assert not chosen[0].deps  # no toolchain fetched for it
    assert chosen[0].digest != locked_steps[0].digest
    (system / "nvcc").write_text((system / "nvcc").read_text().replace("V13.0.48", "V13.0.50"))
    assert kernel_steps(rec, locked=locked, system_nvcc=True)[0].digest != chosen[0].digest

    monkeypatch.setenv("QWEN38BUILD_NVCC", "system")
    assert system_nvcc_requested(False)
    monkeypatch.setenv("QWEN38BUILD_NVCC", "sytem")
    with pytest.raises(UsageError, match="QWEN38BUILD_NVCC"):
        system_nvcc_requested(False)


def test_the_system_nvcc_asked_for_but_absent_is_a_clear_error(
    tproject: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    assert tproject.run("kernels", "--system-nvcc") == 2  # bad input, before any work
    err = capsys.readouterr().err
    assert "no nvcc is on PATH" in err and "Traceback" not in err
    assert not (tproject.store / "objects").exists() or not any(
        json.loads(p.read_text())["derivation"]["kind"] == "cubin"
        for p in (tproject.store / "objects").glob("*.json"))


# -- the lock ---------------------------------------------------------------------------


def test_a_new_cuda_series_in_the_recipe_makes_lock_check_stale(
    tproject: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    from qwen38build.pinning.sources import check_lock

    check_lock(loaded(tproject))  # sources.json (vLLM and toolchain) serves the recipe
    recipe = tproject.root / "recipe.toml"
    recipe.write_text(recipe.read_text().replace('cuda = "13.0"', 'cuda = "12.8"'))
    before = sorted(p.name for p in tproject.store.rglob("*")) if tproject.store.exists() else []
    assert tproject.run("lock", "--check") == 2
    err = capsys.readouterr().err
    assert "nvidia-cuda-nvcc is 13.0.88 in the lock but [toolchain] cuda = '12.8'" in err
    assert "lock/sources.json" in err and "run `qwen38build lock`" in err
    after = sorted(p.name for p in tproject.store.rglob("*")) if tproject.store.exists() else []
    assert before == after


def test_lock_check_names_a_missing_toolchain_entry(
    tproject: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    locked = lockmod.read(tproject.root)
    del locked["nvidia-nvvm"]
    lockmod.write(tproject.root, list(locked.values()))
    assert tproject.run("lock", "--check") == 2
    assert "no entry for 'nvidia-nvvm'" in capsys.readouterr().err
    assert tproject.run("plan") == 0  # the vLLM graph still plans; kernels are declared
    assert "pthfa kernels: declared, not planned" in capsys.readouterr().out


def test_lock_pins_the_newest_of_the_series_of_each_package_by_sha256(
    tproject: Project, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    built = {w.name.split("-")[0].replace("_", "-"): w for w in tproject.wheels.glob("*.whl")}
    asked: list[str] = []

    def fake_pip(name: str, version: str, *, python: str, platform: str, dest: Path) -> Path:
        asked.append(f"{name}=={version} {platform}")
        return Path(shutil.copy(built[name], dest))

    monkeypatch.setattr("qwen38build.steps.fetch.pip_download", fake_pip)
    monkeypatch.setattr("qwen38build.pinning.sources.pip_download", fake_pip)
    lock_file = tproject.root / "lock" / "sources.json"
    lockmod.write(tproject.root, [lockmod.read(tproject.root)["vllm"]])  # toolchain unpinned
    assert tproject.run("lock") == 0
    assert sorted(asked[1:]) == sorted(f"{n}==13.0.* {PLATFORM}" for n in PACKAGES)
    locked = json.loads(lock_file.read_text())["sources"]
    by_name = {e["name"]: e for e in locked}
    assert set(by_name) == {"vllm", *PACKAGES}
    assert by_name["nvidia-cuda-runtime"]["version"] == "13.0.96"
    assert by_name["nvidia-nvvm"]["sha256"] == sha256(built["nvidia-nvvm"])
    assert tproject.run("lock", "--check") == 0
    capsys.readouterr()

    recipe = tproject.root / "recipe.toml"
    recipe.write_text(recipe.read_text().replace('cuda = "13.0"', 'cuda = "12.8"'))
    asked.clear()
    assert tproject.run("lock") == 2
    assert "start at 13.0" in capsys.readouterr().err
    assert asked == []  # refused before anything was fetched
    assert json.loads(lock_file.read_text())["sources"] == locked  # untouched


def test_the_recipe_names_a_cuda_series(tproject: Project) -> None:
    recipe = tproject.root / "recipe.toml"
    recipe.write_text(recipe.read_text().replace('cuda = "13.0"', 'cuda = "13"'))
    with pytest.raises(RecipeError, match=r"toolchain\.cuda: '13' is not a CUDA release series"):
        load(recipe)


def test_the_repository_lock_pins_the_recipe_series() -> None:
    rec = load(REPO / "recipe.toml")
    step = toolchain_step(rec, lockmod.read(REPO))
    assert step.params == {"cuda": rec.recipe.toolchain.cuda, "top": "nvidia/cu13"}
    assert [d.hints["name"] for _, d in step.deps] == list(PACKAGES)


def test_pip_is_asked_for_every_manylinux_tag_the_platform_installs() -> None:
    args = platform_args("manylinux_2_28_x86_64")
    tags = args[1::2]
    assert set(args[::2]) == {"--platform"}
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags
    assert {"manylinux2014_x86_64", "manylinux2010_x86_64"} <= set(tags)  # nvvm is 2_12
    assert "manylinux_2_29_x86_64" not in tags
    assert platform_args("win_amd64") == ["--platform", "win_amd64"]


# -- for real ---------------------------------------------------------------------------


@pytest.mark.network
@pytest.mark.slow
@pytest.mark.e2e
def test_the_real_toolchain_compiles_pthfa_for_sm90_with_no_system_cuda(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    from qwen38build.cli import main

    monkeypatch.setenv("PATH", BASE_PATH)
    for var in ("CUDA_HOME", "CUDA_PATH", "QWEN38BUILD_NVCC", "QWEN38BUILD_SOURCES"):
        monkeypatch.delenv(var, raising=False)
    argv = ["--recipe", str(REPO / "recipe.toml"), "--store", str(tmp_path / "store"),
            "kernels", "--arch", "9.0", "--json", "-q", "--out", str(tmp_path / "out")]
    assert main(argv) == 0, capsys.readouterr().err
    first = json.loads(capsys.readouterr().out)
    assert cubin_sm(tmp_path / "out" / "sm_90.cubin") == 90

    def no_compile(*a: object, **k: object) -> None:
        raise AssertionError("a compiler ran on a cache hit")

    monkeypatch.setattr("qwen38build.steps.cubin.compile_arch", no_compile)
    monkeypatch.setattr("qwen38build.proc.subprocess.run", no_compile)
    assert main(argv) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["build"] == first["build"]
