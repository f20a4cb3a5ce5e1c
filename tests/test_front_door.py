"""The front door on a fresh machine: the README's two commands through ``./noxw``, and the
tool installed every documented way, each copy able to fetch.

A fresh machine here is a new HOME, ``PATH`` of the system directories only and the
distribution's ``/usr/bin/python3``, "externally managed" (PEP 668: Debian, Ubuntu), so that
``pip install`` into it is refused. The machine's own configuration (``/etc/pip.conf``, CA
certificates) stays, as it would on any machine.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from tests.engine_fixtures import FILES, make_project, make_wheel, write_patch

REPO = Path(__file__).resolve().parents[1]
SYSTEM_PYTHON = Path("/usr/bin/python3")
# What a user's shell adds and a fresh machine lacks: another Python, a venv, a nox, caches.
DROP = re.compile(r"VIRTUAL_ENV|CONDA_.*|PYENV.*|PYTHON.*|NOX.*|XDG_.*|QWEN38.*|UV_.*|"
                  r"PIP_(?!CERT$).*|PYTEST.*|COV_.*|COVERAGE.*")


def readme_commands() -> list[str]:
    """The README's first code block: the two commands a newcomer types."""
    block = re.search(r"```sh\n(.*?)```", (REPO / "README.md").read_text(), re.DOTALL)
    assert block is not None, "README.md opens with no sh block"
    return block.group(1).strip().splitlines()


def fresh_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not DROP.fullmatch(k)}
    system = ["/usr/local/bin", "/usr/bin", "/bin"]
    if Path("/usr/local/bin/python3").exists():  # then /usr/bin/python3 would not come first
        system.remove("/usr/local/bin")
    home.mkdir(parents=True, exist_ok=True)
    return {**env, "HOME": str(home), "PATH": ":".join(system), **extra}


def externally_managed() -> Path | None:
    """The PEP 668 marker of /usr/bin/python3, or None where it has none."""
    if not SYSTEM_PYTHON.exists():
        return None
    stdlib = subprocess.run(
        [str(SYSTEM_PYTHON), "-c", "import sysconfig; print(sysconfig.get_path('stdlib'))"],
        capture_output=True, text=True, check=True).stdout.strip()
    marker = Path(stdlib) / "EXTERNALLY-MANAGED"
    return marker if marker.is_file() else None


def front_door_copy(dest: Path) -> Path:
    """The launcher, the noxfile, pyproject.toml, README.md and the tool's own code, copied
    to ``dest`` (the checkout's .nox and caches stay behind)."""
    dest.mkdir(parents=True)
    for name in ("noxw", "noxfile.py", "pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, dest / name)
    shutil.copytree(REPO / "qwen38build", dest / "qwen38build",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return dest


# -- the README and CI ------------------------------------------------------------------


def test_readme_opens_with_the_launchers_build_and_tests() -> None:
    build, tests = readme_commands()
    assert re.fullmatch(r"\./noxw -s build", build), build
    assert re.fullmatch(r"\./noxw -s tests", tests), tests
    assert os.access(REPO / "noxw", os.X_OK), "noxw must be executable (git keeps the bit)"


def test_ci_runs_the_readmes_test_command() -> None:
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.lstrip().startswith("#")]
    assert ci[-1] == readme_commands()[1]


# -- the launcher's decisions (no network) --------------------------------------------------


@pytest.fixture
def launcher(tmp_path: Path) -> ModuleType:
    """noxw loaded as a module from a copy whose venv is a stand-in (bin/python a file)."""
    root = tmp_path / "proj"
    root.mkdir()
    shutil.copy2(REPO / "noxw", root / "noxw")
    shutil.copy2(REPO / "pyproject.toml", root / "pyproject.toml")
    loader = importlib.machinery.SourceFileLoader("noxw_under_test", str(root / "noxw"))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    Path(module.PYTHON).parent.mkdir(parents=True)
    Path(module.PYTHON).write_text("")
    return module


def test_the_pin_is_pyprojects_test_extra(launcher: ModuleType) -> None:
    pins = re.findall(r'"(nox==[^"]+)"', (REPO / "pyproject.toml").read_text())
    assert [launcher.nox_pin(os.path.join(launcher.ROOT, "pyproject.toml"))] == pins


def test_the_venv_is_reused_until_the_pin_or_the_interpreter_changes(
    launcher: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    pyproject = Path(launcher.ROOT, "pyproject.toml")
    pin = launcher.nox_pin(pyproject)
    assert not launcher.ready(pyproject)  # no stamp: made
    launcher.write_stamp({"nox": pin, "pyproject": launcher.pyproject_key(pyproject),
                          **launcher.interpreter()})
    assert launcher.ready(pyproject)
    # pyproject.toml edited elsewhere (same pin): reused, and the stamp learns the new file
    pyproject.write_text(pyproject.read_text() + "\n# an edit\n")
    assert launcher.ready(pyproject)
    assert launcher.read_stamp()["pyproject"] == launcher.pyproject_key(pyproject)
    # the pin moved: remade
    pyproject.write_text(pyproject.read_text().replace(pin, "nox==2000.1.1"))
    assert not launcher.ready(pyproject)
    pyproject.write_text(pyproject.read_text().replace("nox==2000.1.1", pin))
    assert launcher.ready(pyproject)
    # another interpreter runs it: remade
    monkeypatch.setattr(launcher.sys, "executable", "/elsewhere/python3")
    assert not launcher.ready(pyproject)
    monkeypatch.undo()
    Path(launcher.PYTHON).unlink()  # a venv whose python is gone
    assert not launcher.ready(pyproject)


def _shadow(tmp_path: Path, package: str, files: dict[str, str]) -> Path:
    """A folder for PYTHONPATH holding a stand-in for a standard library package."""
    d = tmp_path / "shadow"
    for name, text in files.items():
        (d / package).mkdir(parents=True, exist_ok=True)
        (d / package / name).write_text(text)
    return d


DEBIAN_VENV_FAILURE = """\
import sys
print("The virtual environment was not created successfully because ensurepip is not")
print("available.  On Debian/Ubuntu systems, you need to install the python3-venv")
sys.exit(1)
"""


@pytest.mark.parametrize("case", ["no ensurepip", "venv fails"])
def test_without_a_working_venv_it_says_what_to_install_and_leaves_nothing(
    tmp_path: Path, case: str
) -> None:
    """Debian and Ubuntu without python3-venv: ensurepip is missing, or venv itself fails
    (stood in for by a package of the same name ahead on PYTHONPATH)."""
    root = front_door_copy(tmp_path / "proj")
    if case == "no ensurepip":
        shadow = _shadow(tmp_path, "ensurepip", {"__init__.py": ""})
    else:
        shadow = _shadow(tmp_path, "venv", {"__init__.py": "", "__main__.py": DEBIAN_VENV_FAILURE})
    env = fresh_env(tmp_path / "home", PYTHONPATH=str(shadow))
    proc = subprocess.run([sys.executable, "noxw", "-s", "build"], cwd=root, env=env,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 1
    version = sysconfig.get_python_version()
    assert f"noxw: cannot make the venv for nox: {sys.executable}" in proc.stderr \
        or f"noxw: cannot make the venv for nox: `{sys.executable} -m venv` failed" in proc.stderr
    assert f"apt install python{version}-venv" in proc.stderr
    assert "Traceback" not in proc.stderr
    if case == "venv fails":
        assert "    available.  On Debian/Ubuntu systems" in proc.stderr  # venv's own words
    assert not (root / ".nox" / ".noxw").exists()


# -- the README's two commands on a fresh PEP 668 machine -----------------------------------

SERVER = FILES["vllm/server.py"]


@dataclass
class FreshMachine:
    root: Path
    env: dict[str, str]


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> FreshMachine:
    """A copy of the front door whose recipe is a tiny one (one patch over a small wheel,
    found through QWEN38BUILD_SOURCES), this suite's tests, and a fresh HOME, with
    /usr/bin/python3 first on PATH and externally managed."""
    if externally_managed() is None:
        pytest.skip("/usr/bin/python3 is missing or not externally managed (PEP 668) here")
    tmp = tmp_path_factory.mktemp("fresh")
    root = front_door_copy(tmp / "proj")
    shutil.copytree(REPO / "tests", root / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    wheels = tmp / "wheels"
    make_project(root, make_wheel(wheels), ["route-fix"])
    write_patch(root, "patches", "route-fix",
                [("server.py", SERVER, SERVER.replace("return 3\n", "return 33\n"))],
                tmp / "diffs")
    env = fresh_env(tmp / "home", QWEN38BUILD_SOURCES=str(wheels))
    assert shutil.which("python3", path=env["PATH"]) == str(SYSTEM_PYTHON)
    # what the README said before: refused by PEP 668
    old = subprocess.run(["python3", "-m", "pip", "install", "-q", "nox"], cwd=root, env=env,
                         capture_output=True, text=True, check=False)
    assert old.returncode != 0 and "externally-managed-environment" in old.stderr + old.stdout, \
        old.stderr
    return FreshMachine(root, env)


@pytest.mark.slow
@pytest.mark.network
def test_the_readmes_build_command_on_an_externally_managed_python(fresh: FreshMachine) -> None:
    """The README's first line, verbatim: the launcher makes its venv from /usr/bin/python3,
    nox installs the tool into the session's venv from the index, and the tool really builds
    the tiny recipe and links ./result. A second call reuses the launcher's venv."""
    build = readme_commands()[0]
    proc = subprocess.run(build, shell=True, cwd=fresh.root, env=fresh.env,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "noxw: installing nox==" in proc.stderr
    wheel = next((fresh.root / "result").glob("vllm-0.0.1+q38.*.whl"))
    with zipfile.ZipFile(wheel) as z:
        assert "return 33\n" in z.read("vllm/server.py").decode()
    stamp = (fresh.root / ".nox" / ".noxw" / "noxw.stamp").read_text()
    assert f"python={SYSTEM_PYTHON}\n" in stamp

    t0 = time.perf_counter()
    again = subprocess.run(build, shell=True, cwd=fresh.root, env=fresh.env,
                           capture_output=True, text=True, check=False)
    took = time.perf_counter() - t0
    assert again.returncode == 0, again.stderr[-3000:]
    assert "noxw: installing" not in again.stderr and "pip install" not in again.stderr
    assert took < 10, took  # a no-op: nox's start and the tool's fast path


@pytest.mark.slow
@pytest.mark.network
def test_the_readmes_test_command_on_an_externally_managed_python(fresh: FreshMachine) -> None:
    """The README's second line, verbatim: the tests session installs the tool with every
    test extra into a fresh venv (the bulk of this test's time: torch among them) and runs
    pytest, which PYTEST_ADDOPTS limits to one quick test of this suite (so this does not
    recurse into the whole suite)."""
    tests = readme_commands()[1]
    env = {**fresh.env, "PYTEST_ADDOPTS": ("-p no:cacheprovider tests/test_noxfile.py "
                                           "-k test_gpu_arch_reads_the_drivers_answer")}
    proc = subprocess.run(tests, shell=True, cwd=fresh.root, env=env, capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(r"\b1 passed\b", proc.stdout), proc.stdout[-2000:]


# -- every documented install, each able to fetch -----------------------------------------


def _fetches(qwen38build: str, tmp_path: Path, home: Path) -> None:
    """``qwen38build build`` of a tiny recipe whose wheel only pip can fetch (no index: a
    find-links folder), run by an installed copy: it fetches through its own pip."""
    wheels = tmp_path / "wheels"
    root = make_project(tmp_path / "proj", make_wheel(wheels), [])
    env = fresh_env(home, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheels))
    proc = subprocess.run([qwen38build, "--store", str(tmp_path / "store"), "build", "-q",
                           "--no-link", "--json"], cwd=root, env=env, capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert list((tmp_path / "store").glob("objects/*/vllm-0.0.1-cp38-abi3-*.whl"))


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.parametrize("how", ["uv tool install", "venv", "pipx"])
def test_every_documented_install_runs_and_fetches(tmp_path: Path, how: str) -> None:
    home = tmp_path / "home"
    env = fresh_env(home)
    bindir = tmp_path / "bin"
    src = str(front_door_copy(tmp_path / "src"))  # builds write egg-info beside the sources
    python = str(SYSTEM_PYTHON if SYSTEM_PYTHON.exists() else sys.executable)
    if how == "uv tool install":
        uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
        cmd = [uv, "tool", "install", "--python", python, src]
        env = {**env, "UV_TOOL_DIR": str(tmp_path / "tools"), "UV_TOOL_BIN_DIR": str(bindir)}
    elif how == "venv":
        subprocess.run([python, "-m", "venv", str(tmp_path / "venv")], check=True, env=env)
        cmd = [str(tmp_path / "venv" / "bin" / "python"), "-m", "pip", "install", "-q", src]
        bindir = tmp_path / "venv" / "bin"
    else:
        # pipx itself, in a venv of its own (on Debian and Ubuntu: apt install pipx)
        subprocess.run([python, "-m", "venv", str(tmp_path / "pipx")], check=True, env=env)
        subprocess.run([str(tmp_path / "pipx" / "bin" / "python"), "-m", "pip", "install",
                        "-q", "pipx"], check=True, env=env, capture_output=True)
        cmd = [str(tmp_path / "pipx" / "bin" / "pipx"), "install", "--python", python, src]
        env = {**env, "PIPX_HOME": str(tmp_path / "pipx-home"), "PIPX_BIN_DIR": str(bindir)}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    exe = str(bindir / "qwen38build")
    helped = subprocess.run([exe, "--help"], env=fresh_env(home), capture_output=True,
                            text=True, check=False)
    assert helped.returncode == 0 and "usage: qwen38build" in helped.stdout, helped.stderr
    _fetches(exe, tmp_path, home)
