"""The front door's own logic: which interpreter and stack `nox -s gpu_tests` uses, and the
install stamp that keeps a second `nox -s build` from reinstalling."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.engine_fixtures import load_noxfile

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def noxfile() -> ModuleType:
    return load_noxfile()


def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_gpu_arch_reads_the_drivers_answer(noxfile: ModuleType, tmp_path: Path) -> None:
    smi = _script(tmp_path / "nvidia-smi", 'echo "9.0"\necho "9.0"\n')
    assert noxfile.gpu_arch(smi) == "9.0"


@pytest.mark.parametrize("body", ["exit 9\n", "", "echo 'No devices were found' >&2; exit 6\n"])
def test_no_gpu_when_the_driver_has_none(noxfile: ModuleType, tmp_path: Path, body: str) -> None:
    assert noxfile.gpu_arch(_script(tmp_path / "nvidia-smi", body)) is None


def test_no_gpu_without_nvidia_smi(noxfile: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert noxfile.gpu_arch() is None


def test_the_interpreters_own_stack_is_used_when_it_imports(
    noxfile: ModuleType, tmp_path: Path
) -> None:
    """A Python whose torch and CuPy import (and see a GPU) is used as it is; one that
    lacks them is not, and the session installs the locked environment instead."""
    with_stack = tmp_path / "with"
    (with_stack / "torch").mkdir(parents=True)
    (with_stack / "torch" / "__init__.py").write_text(
        "class cuda:\n    @staticmethod\n    def is_available():\n        return True\n")
    (with_stack / "cupy.py").write_text("")
    py = _script(tmp_path / "py-with", f'PYTHONPATH={with_stack} exec {sys.executable} "$@"\n')
    assert noxfile.has_gpu_stack(py)
    bare = _script(tmp_path / "py-bare", f'PYTHONPATH= exec {sys.executable} -I "$@"\n')
    assert not noxfile.has_gpu_stack(bare)
    no_gpu = tmp_path / "nogpu"
    (no_gpu / "torch").mkdir(parents=True)
    (no_gpu / "torch" / "__init__.py").write_text(
        "class cuda:\n    @staticmethod\n    def is_available():\n        return False\n")
    (no_gpu / "cupy.py").write_text("")
    py_no_gpu = _script(tmp_path / "py-nogpu", f'PYTHONPATH={no_gpu} exec {sys.executable} "$@"\n')
    assert not noxfile.has_gpu_stack(py_no_gpu)


def test_gpu_session_sees_the_interpreters_site_packages(noxfile: ModuleType) -> None:
    assert "--system-site-packages" in (noxfile.gpu_tests.venv_params or [])


@pytest.mark.slow
def test_gpu_session_skips_with_its_reason_where_there_is_no_gpu(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": f"{tmp_path}:/usr/bin:/bin"}
    _script(tmp_path / "nvidia-smi", "exit 9\n")
    proc = subprocess.run([sys.executable, "-m", "nox", "-s", "gpu_tests",
                           "--envdir", str(tmp_path / "nox")],
                          cwd=REPO, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "no NVIDIA GPU here" in proc.stderr


def test_a_venv_made_from_a_venv_sees_the_outer_venvs_packages(
    noxfile: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nox under a venv's Python (a GPU image's torch venv): the session venv's
    --system-site-packages reaches the base Python only; the .pth adds the outer venv's."""
    monkeypatch.delenv("NOXW_PYTHON", raising=False)  # nox run directly, not by ./noxw
    inner = tmp_path / "session"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                    str(inner)], check=True)
    py = str(inner / "bin" / "python")
    # qwen38build is installed in the venv running these tests, not in its base Python
    probe = [py, "-I", "-c", "import qwen38build"]
    if sys.prefix == sys.base_prefix:
        pytest.skip("the tests run on a base interpreter: nothing to inherit")
    assert subprocess.run(probe, capture_output=True, check=False, cwd=tmp_path).returncode != 0
    noxfile.inherit_site_packages(py)
    assert subprocess.run(probe, capture_output=True, check=False, cwd=tmp_path).returncode == 0


def test_through_noxw_the_session_sees_the_users_pythons_packages(
    noxfile: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """./noxw runs nox from its own venv and names the Python the user ran in
    $NOXW_PYTHON: that one's packages (a torch venv's) are the ones the session gets, not
    the launcher venv's."""
    user = tmp_path / "user-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(user)], check=True)
    user_py = str(user / "bin" / "python")
    purelib = subprocess.run([user_py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "q38_users_package.py").write_text("")
    inner = tmp_path / "session"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                    str(inner)], check=True)
    py = str(inner / "bin" / "python")
    probe = [py, "-I", "-c", "import q38_users_package"]
    assert subprocess.run(probe, capture_output=True, check=False, cwd=tmp_path).returncode != 0
    monkeypatch.setenv("NOXW_PYTHON", user_py)
    noxfile.inherit_site_packages(py)
    assert subprocess.run(probe, capture_output=True, check=False, cwd=tmp_path).returncode == 0


def _trees_zip(path: Path, patched: str) -> Path:
    import json
    import zipfile

    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("trees.json", json.dumps({"patched": patched, "pristine": "v.whl"}))
    return path


def test_carried_trees_are_checked_against_the_plan(noxfile: ModuleType, tmp_path: Path) -> None:
    """`nox -s gpu_tests` takes a carried vllm-py zip only when it holds the trees of the
    patched wheel this checkout plans (its label is the wheel step's digest)."""
    plan = {"steps": [{"kind": "fetch", "digest": "ab" * 32},
                      {"kind": "wheel", "digest": "cdd6e216" + "0" * 56}]}
    good = _trees_zip(tmp_path / "good.zip", "vllm-0.32.0+q38.cdd6e216-cp38-abi3-x.whl")
    assert noxfile.trees_mismatch(good, plan) is None
    stale = _trees_zip(tmp_path / "stale.zip", "vllm-0.32.0+q38.0badc0de-cp38-abi3-x.whl")
    why = noxfile.trees_mismatch(stale, plan)
    assert why is not None and "0badc0de" in why and "cdd6e2160000" in why
    (tmp_path / "junk.zip").write_bytes(b"not a zip")
    assert "not a vllm-py zip" in str(noxfile.trees_mismatch(tmp_path / "junk.zip", plan))
    assert "no patched wheel" in str(noxfile.trees_mismatch(good, {"steps": []}))


def test_wheel_libs_takes_the_kernel_wheels_libraries_only(noxfile: ModuleType,
                                                          tmp_path: Path) -> None:
    import zipfile

    wheel = tmp_path / "fa2fp8-0.1.0-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("fa2fp8/__init__.py", "")
        zf.writestr("fa2fp8/lib/libfa2fp8_sm90.so", b"\x7fELF90")
        zf.writestr("fa2fp8/lib/../../evil.so", b"x")
        zf.writestr("fa2fp8-0.1.0.dist-info/RECORD", "")
    (tmp_path / "libs").mkdir()
    (tmp_path / "libs" / "stale.so").write_bytes(b"old")
    got = Path(noxfile.wheel_libs(wheel, tmp_path / "libs"))
    assert sorted(p.name for p in got.iterdir()) == ["libfa2fp8_sm90.so"]
    assert (got / "libfa2fp8_sm90.so").read_bytes() == b"\x7fELF90"
    assert not (tmp_path / "evil.so").exists()
