"""The real thing: the pinned vLLM 0.32.0 wheel and the project's own series.

The wheel is fetched once through pip into the default store (or $QWEN38BUILD_STORE) and
stays there between runs, so only the first run pays for the download.
"""

from __future__ import annotations

import json
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from qwen38build.inputs import recipe

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def built() -> dict[str, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "qwen38build", "--recipe", str(REPO / "recipe.toml"), "build",
         "--json", "--no-link", "-q"],
        capture_output=True, text=True, cwd=REPO, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out: dict[str, str] = json.loads(proc.stdout)
    return out


def test_real_build_carries_every_patch_of_the_series(built: dict[str, str]) -> None:
    wheel = Path(built["wheel"])
    # the local label names the wheel step's own digest (the stack's links to its entry)
    assert wheel.name.startswith(f"vllm-0.32.0+q38.{wheel.parent.name[:8]}-cp38-abi3-")
    manifest = json.loads((wheel.parent / "manifest.json").read_text())
    series = [e.row_name for e in recipe.load(REPO / "recipe.toml").series_entries()]
    owners = {o for f in manifest["owned"].values() for o in f["owners"]}
    assert owners == set(series)
    with zipfile.ZipFile(wheel) as z:
        assert len(z.namelist()) > 5000
        for rel, rec in manifest["owned"].items():
            if rec["patched"] is not None:
                import hashlib

                assert hashlib.sha256(z.read(f"vllm/{rel}")).hexdigest() == rec["patched"]


def test_real_wheel_installs_and_verify_catches_one_byte(built: dict[str, str], tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    # every wheel of the stack: verify checks each installed part (vLLM, its dist-info, pthfa)
    outputs: dict[str, str] = json.loads(json.dumps(built))["outputs"]
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                    "--disable-pip-version-check", "--no-index", outputs["wheel"],
                    outputs["pthfa"]],
                   check=True, capture_output=True)
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    base = [sys.executable, "-m", "qwen38build", "--recipe", str(REPO / "recipe.toml"),
            "verify", str(site), "--build", built["build"]]
    ok = subprocess.run([*base, "--full"], capture_output=True, text=True, cwd=REPO, check=False)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    manifest = json.loads((Path(built["wheel"]).parent / "manifest.json").read_text())
    rel, rec = next((r, v) for r, v in sorted(manifest["owned"].items()) if v["patched"])
    target = site / "vllm" / rel
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    bad = subprocess.run(base, capture_output=True, text=True, cwd=REPO, check=False)
    assert bad.returncode == 1
    assert f"drifted: vllm/{rel} (owned by {', '.join(rec['owners'])})" in bad.stdout
