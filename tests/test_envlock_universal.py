"""The environment lock covers every Python the pin supports: the committed lock read for
3.11 to 3.13 (and whatever else its requires-python admits), the coverage check that
refuses a lock with a hole, and the Pythons read from a pin's METADATA."""

from __future__ import annotations

import tomllib
from email.message import Message
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import parse_wheel_filename

from qwen38build.errors import LockError
from qwen38build.inputs import recipe
from qwen38build.pinning import pylock as envlock
from qwen38build.pinning import sources as locking
from qwen38build.pinning import universal
from qwen38build.store.store import Store
from tests.conftest import Project
from tests.env_fixtures import env_project

REPO = Path(__file__).resolve().parents[1]


def _tags(minor: int) -> set[Tag]:
    """CPython 3.minor on manylinux_2_31 x86_64, written out here (not the tool's code)."""
    plats = [f"manylinux_2_{n}_x86_64" for n in range(31, 4, -1)]
    plats += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64",
              "linux_x86_64"]
    return {*cpython_tags((3, minor), platforms=plats),
            *compatible_tags((3, minor), platforms=plats)}


@pytest.mark.parametrize("minor", [11, 12, 13])
def test_committed_lock_installs_every_package_from_a_wheel_on_python(minor: int) -> None:
    """For each Python 3.11 to 3.13 on the recipe's platform: the lock admits it, and every
    package whose marker holds there has a wheel that installs there. Before the lock was
    universal, 3.11 and 3.13 failed (51 and 47 packages had cp312 wheels only)."""
    data = tomllib.loads(envlock.pylock_path(REPO).read_text())
    assert recipe.load(REPO / "recipe.toml").recipe.environment is not None
    assert universal.covered(envlock.pylock_path(REPO).read_text()).contains(f"3.{minor}.0")
    env = {"python_version": f"3.{minor}", "python_full_version": f"3.{minor}.0",
           "implementation_name": "cpython", "platform_python_implementation": "CPython",
           "sys_platform": "linux", "platform_machine": "x86_64", "platform_system": "Linux",
           "os_name": "posix", "implementation_version": f"3.{minor}.0",
           "platform_release": "", "platform_version": "", "extra": ""}
    tags = _tags(minor)
    installed, holes = set(), []
    for pkg in data["packages"]:
        if "marker" in pkg and not Marker(pkg["marker"]).evaluate(env):
            continue
        installed.add(pkg["name"])
        names = [w["url"].rsplit("/", 1)[1] for w in pkg.get("wheels", [])]
        if not any(parse_wheel_filename(n)[3] & tags for n in names):
            holes.append(f"{pkg['name']} {pkg['version']}")
        assert "sdist" not in pkg  # wheels only: env never builds
    assert holes == []
    assert {"torch", "cupy-cuda13x", "numpy", "transformers"} <= installed
    assert len(installed) > 150


def test_pythons_come_from_the_pins_classifiers_within_requires_python() -> None:
    meta = Message()
    meta["Requires-Python"] = "<3.15,>=3.11"
    for minor in (10, 11, 12, 13, 14, 15):
        meta["Classifier"] = f"Programming Language :: Python :: 3.{minor}"
    meta["Classifier"] = "Programming Language :: Python :: 3 :: Only"
    assert universal.supported_pythons(meta, "3.12") == ["3.11", "3.12", "3.13", "3.14"]
    assert universal.requires_python(["3.11", "3.12", "3.13", "3.14"]) == ">=3.11,<3.15"
    assert universal.supported_pythons(Message(), "3.12.4") == ["3.12"]


def _lock(*wheels: str, marker: str | None = None) -> str:
    files = ", ".join(f'{{ url = "https://x/{w}", hashes = {{ sha256 = "00" }} }}'
                      for w in wheels)
    mark = f'marker = "{marker}"\n' if marker else ""
    return f'[[packages]]\nname = "fast"\nversion = "1.0"\n{mark}wheels = [{files}]\n'


def test_a_package_without_a_wheel_for_one_covered_python_is_a_gap() -> None:
    pythons, plat = ["3.11", "3.12", "3.13"], "manylinux_2_31_x86_64"
    only312 = _lock("fast-1.0-cp312-cp312-manylinux_2_28_x86_64.whl")
    assert universal.gaps(only312, pythons, plat) == ["fast 1.0 (Python 3.11)",
                                                      "fast 1.0 (Python 3.13)"]
    abi3 = _lock("fast-1.0-cp311-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl")
    assert universal.gaps(abi3, pythons, plat) == []
    too_new_glibc = _lock("fast-1.0-py3-none-manylinux_2_34_x86_64.whl")
    assert len(universal.gaps(too_new_glibc, pythons, plat)) == 3
    # where the marker says it is not installed, no wheel is needed
    marked = _lock("fast-1.0-cp312-cp312-manylinux_2_28_x86_64.whl",
                   marker="python_version == '3.12'")
    assert universal.gaps(marked, pythons, plat) == []


def test_lock_refuses_a_resolution_with_a_hole_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p: Project = env_project(tmp_path, monkeypatch)
    monkeypatch.setattr(universal, "gaps", lambda text, pys, plat: ["tinydep 1.2.0 (Python 3.9)"])
    with pytest.raises(LockError, match=r"no wheel for manylinux_2_28_x86_64 of tinydep 1\.2\.0"):
        locking.relock_env(recipe.load(p.root / "recipe.toml"), Store(p.store))
    assert not envlock.pylock_path(p.root).exists()


def test_a_recipe_python_the_pin_does_not_support_is_refused_before_uv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = env_project(tmp_path, monkeypatch)
    recipe_toml = p.root / "recipe.toml"
    loaded = recipe.load(recipe_toml)
    meta = Message()
    meta["Requires-Python"] = ">=3.11"
    meta["Classifier"] = "Programming Language :: Python :: 3.11"
    meta["Classifier"] = "Programming Language :: Python :: 3.13"
    monkeypatch.setattr(envlock, "metadata", lambda wheel: meta)
    recipe_toml.write_text(recipe_toml.read_text().replace(
        f'python = "{loaded.recipe.toolchain.python}"', 'python = "3.12"'))

    def no_uv(*args: object, **kwargs: object) -> str:
        raise AssertionError("uv ran")

    monkeypatch.setattr(envlock, "uv", no_uv)
    with pytest.raises(LockError, match=r'python = "3\.12" is not a Python vllm 0\.0\.1 '
                       r"supports \(3\.11, 3\.13"):
        locking.relock_env(recipe.load(recipe_toml), Store(p.store))


def test_check_refuses_a_lock_that_does_not_cover_the_recipes_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = env_project(tmp_path, monkeypatch)
    recipe_toml = p.root / "recipe.toml"
    locking.relock_env(recipe.load(recipe_toml), Store(p.store))
    python = recipe.load(recipe_toml).recipe.toolchain.python
    recipe_toml.write_text(recipe_toml.read_text().replace(
        f'python = "{python}"', 'python = "3.9"'))
    with pytest.raises(LockError, match=r"stale: it covers Python .*python is 3\.9"):
        envlock.check(recipe.load(recipe_toml))
