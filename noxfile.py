"""The front door: thin sessions over the qwen38build CLI and the test suite.

``nox -s build`` builds on the embedded default (a local store under the user cache dir);
everything else is listed by ``nox -l``. Arguments after ``--`` go to the command.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sysconfig
import zipfile
from pathlib import Path

import nox

nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["build"]
# The interpreter running nox: any Python the project supports (pyproject's requires-python),
# so a machine with 3.12 only (a hosted runner) needs no second interpreter.
PYTHON = None
HERE = Path(__file__).parent
STAMP = ".qwen38build-install"
# The trees of `qwen38build build --only vllm-py`, carried to a GPU machine without the index.
TREES_ZIP = Path("result") / "vllm-py-trees.zip"
TREE_VARS = ("QWEN38_VLLM_TREE", "QWEN38_VLLM_PRISTINE", "QWEN38_VLLM_TREES")


def _tool(session: nox.Session, *extras: str) -> None:
    """Install the project (editable) into the session's venv, once per pyproject change.

    The install is editable, so source edits need no reinstall; only pyproject.toml (the pinned
    dependencies) and the extras decide what is installed. When they match the stamp left by
    the last install, nothing runs: the front door then costs nox's start and the tool's, and
    works offline.
    """
    spec = f".[{','.join(extras)}]" if extras else "."
    want = hashlib.sha256(spec.encode() + b"\0" + (HERE / "pyproject.toml").read_bytes())
    venv = getattr(session.virtualenv, "location", None)
    stamp = Path(venv) / STAMP if venv else None
    if stamp is not None and stamp.is_file() and stamp.read_text() == want.hexdigest():
        return
    session.install("-e", spec)
    if stamp is not None:
        stamp.write_text(want.hexdigest())


@nox.session(python=PYTHON)
def build(session: nox.Session) -> None:
    """Build the patched vLLM wheel (lock-checked, cached, linked to ./result)."""
    _tool(session)
    session.run("qwen38build", "build", *session.posargs)


@nox.session(python=PYTHON)
def apply(session: nox.Session) -> None:
    """Write the last build's files into an installed vLLM: nox -s apply -- SITE_PACKAGES."""
    _tool(session)
    session.run("qwen38build", "apply", *session.posargs)


@nox.session(python=PYTHON)
def verify(session: nox.Session) -> None:
    """Check a tree holds exactly the build's bytes: nox -s verify -- SITE_PACKAGES."""
    _tool(session)
    session.run("qwen38build", "verify", *session.posargs)


@nox.session(python=PYTHON)
def kernels(session: nox.Session) -> None:
    """Build the pthfa cubins per CUDA arch and its wheel: nox -s kernels -- --arch 9.0."""
    _tool(session)
    session.run("qwen38build", "kernels", *session.posargs)


@nox.session(python=PYTHON)
def env(session: nox.Session) -> None:
    """Make the stack's virtual environment from the locks and the store: nox -s env -- DIR."""
    _tool(session)
    session.run("qwen38build", "env", *session.posargs)


def gpu_arch(smi: str | None = None) -> str | None:
    """The compute capability of the first NVIDIA GPU (``9.0``), or None where there is none.

    Asks ``nvidia-smi`` (the driver's own tool: present wherever a GPU is usable).
    """
    exe = smi or shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        proc = subprocess.run([exe, "--query-gpu=compute_cap", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=60, check=False)
    except OSError:
        return None
    caps = [c.strip() for c in proc.stdout.splitlines() if c.strip()]
    if proc.returncode != 0 or not caps:
        return None
    return caps[0]


def has_gpu_stack(python: str) -> bool:
    """Whether ``python`` imports torch (with CUDA) and CuPy: then the session uses them."""
    probe = "import torch, cupy; raise SystemExit(0 if torch.cuda.is_available() else 1)"
    try:
        return subprocess.run([python, "-c", probe], capture_output=True, timeout=300,
                              check=False).returncode == 0
    except OSError:
        return False


def _site_paths(python: str, *names: str) -> list[str]:
    code = f"import sysconfig; print(*(sysconfig.get_path(n) for n in {names!r}), sep='\\n')"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def inherit_site_packages(python: str) -> None:
    """Let the session venv see the site-packages of the Python the user ran.

    That is the one that ran ``./noxw`` (it says so in ``$NOXW_PYTHON``; nox itself then runs
    in the launcher's own venv), else the interpreter running nox. ``--system-site-packages``
    reaches the base Python's; when that Python is a venv's (a GPU image that installs torch
    into one), the venv's packages are added by a ``.pth`` file. Only read by this venv;
    nothing of the interpreter's is changed.
    """
    user = os.environ.get("NOXW_PYTHON")
    if user:
        own = set(_site_paths(user, "purelib", "platlib"))
    else:
        own = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    site = _site_paths(python, "purelib")[0]
    # an "import" line of a .pth runs: addsitedir also reads the outer venv's own .pth files
    lines = [f"import site; site.addsitedir({p!r})\n" for p in sorted(own)]
    Path(site, "_qwen38build_outer_site.pth").write_text("".join(lines))


# The session venv sees the interpreter's own site-packages: a GPU machine's torch and CuPy
# (built for its driver) are used as they are, never shadowed by a second copy.
@nox.session(python=PYTHON, venv_params=["--system-site-packages"])
def gpu_tests(session: nox.Session) -> None:
    """The GPU tests, for real: pthfa's cubin and FA2's library for the GPU present are built
    through the recipe's own steps (`kernels --arch X --fa2`), the pthfa wheel installed,
    FA2's libraries handed in, and tests/gpu run. torch and CuPy come from the interpreter's
    site-packages where they are installed, else from the environment lock. Without a GPU
    the session says so and skips; with one it never passes having run no test."""
    arch = gpu_arch()
    if arch is None:
        session.skip("no NVIDIA GPU here (nvidia-smi reports none): the GPU tests need one")
    _tool(session)
    python = str(Path(session.bin) / "python")
    if not has_gpu_stack(python):
        inherit_site_packages(python)
    if has_gpu_stack(python):
        session.log("torch and CuPy: the interpreter's own (its site-packages)")
    else:
        session.log("torch and CuPy are missing: installing the locked environment")
        session.run("uv", "pip", "install", "--python", python, "-r", "lock/pylock.toml")
    plan = json.loads(str(session.run("qwen38build", "plan", "--json", silent=True,
                                      stderr=None)))
    kernels = ["qwen38build", "kernels", "--arch", arch, "--json", "-q"]
    fa2_missing = [str(d["status"]) for d in plan["declared"] if d["name"] == "fa2"]
    if fa2_missing:  # its GPU tests then fail, saying which library is missing
        session.warn(f"fa2: {fa2_missing[0]} (a mirror of its trees: QWEN38BUILD_SOURCES)")
    else:
        kernels.append("--fa2")
    built = json.loads(str(session.run(*kernels, silent=True, stderr=None)))
    session.run("python", "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                "--force-reinstall", built["wheel"])
    env = {"QWEN38_GPU_REQUIRED": "1", **_carried_trees(session, plan)}
    if "fa2" in built and not os.environ.get("FA2FP8_LIB_DIR"):
        env["FA2FP8_LIB_DIR"] = wheel_libs(Path(built["fa2"]["wheel"]),
                                           Path(session.create_tmp()) / "fa2-lib")
        session.log(f"FA2's libraries: {env['FA2FP8_LIB_DIR']} (from {built['fa2']['wheel']})")
    # QWEN38_GPU_REQUIRED turns the GPU tests' skips into failures: on this machine a
    # skip would be a pass that tested nothing.
    session.run("python", "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-q", "-rA",
                "tests/gpu", *session.posargs, env=env)


def wheel_libs(wheel: Path, dest: Path) -> str:
    """The shared libraries of a kernel wheel (``<package>/lib/*.so``) copied into ``dest``."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            parts = name.split("/")
            if len(parts) == 3 and parts[1] == "lib" and parts[2].endswith(".so"):
                (dest / parts[2]).write_bytes(zf.read(name))
    return str(dest)


def trees_mismatch(trees_zip: Path, plan: dict[str, object]) -> str | None:
    """Why a carried ``vllm-py`` zip is not the trees the recipe plans, or None when it is.

    The zip's ``trees.json`` names the patched wheel, whose local version label holds the
    first 8 hex of its wheel step's digest; ``plan`` is `qwen38build plan --json` of this
    checkout. A zip made from another series, pin or engine is refused, never tested."""
    try:
        with zipfile.ZipFile(trees_zip) as zf:
            patched = str(json.loads(zf.read("trees.json"))["patched"])
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as exc:
        return f"{trees_zip} is not a vllm-py zip of `qwen38build build --only vllm-py` ({exc})"
    steps = plan.get("steps")
    wheel = [s for s in steps if s.get("kind") == "wheel"] if isinstance(steps, list) else []
    if not wheel:
        return "`qwen38build plan --json` lists no patched wheel"
    digest = str(wheel[0]["digest"])
    if f"+q38.{digest[:8]}-" not in patched:
        return (f"{trees_zip} holds the trees of {patched}, but this checkout's recipe plans "
                f"the patched wheel {digest[:12]} (another series, pin or engine)")
    return None


def _carried_trees(session: nox.Session, plan: dict[str, object]) -> dict[str, str]:
    """The trees tests/gpu loads: what the environment names, else a carried
    ``result/vllm-py-trees.zip`` checked against ``plan``, else (none) the engine's build."""
    if any(os.environ.get(v) for v in TREE_VARS) or not TREES_ZIP.is_file():
        return {}
    why = trees_mismatch(TREES_ZIP, plan)
    if why is not None:
        session.error(f"{why}: run `qwen38build build --only vllm-py` and carry it again")
    session.log(f"vLLM trees: {TREES_ZIP} (checked against the plan)")
    return {"QWEN38_VLLM_TREES": str(TREES_ZIP.resolve())}


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff, mypy --strict, the ledger rules and the generated table."""
    _tool(session, "test", "lint", "patches-test")
    session.run("ruff", "check", "qwen38build", "tests", "noxfile.py", "noxw", "bench")
    session.run("mypy", "qwen38build", "tests", "noxw")
    # The env-knob rule reads the pinned wheel's envs.py: fetched once into the store the
    # tests use too (the checkout's .cache/store), by building the series.
    store = ("--store", str(HERE / ".cache" / "store"))
    session.run("qwen38build", *store, "build", "--only", "vllm", "--no-link", "-q")
    session.run("qwen38build", *store, "lint")
    session.run("qwen38build", "table", "--check")


@nox.session(python=PYTHON)
def lock(session: nox.Session) -> None:
    """Re-pin lock/ from the recipe (nox -s lock -- --check to only check)."""
    _tool(session)
    session.run("qwen38build", "lock", *session.posargs)


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The test suite (GPU tests skip here), with a coverage figure."""
    _tool(session, "test", "patches-test", "patches-torch")
    session.run(
        "pytest", "-m", "not gpu", "--cov=qwen38build", "--cov-report=term:skip-covered",
        *session.posargs,
    )
