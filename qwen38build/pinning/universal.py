"""One environment lock for every Python the pin supports (a universal lock with markers).

The pin's METADATA says which Pythons it supports: its ``Programming Language :: Python ::
3.X`` classifiers that its ``Requires-Python`` admits (vLLM 0.32.0: 3.11 to 3.14). The lock
covers all of them, so ``env`` works with whichever of them a machine has, and the stack's
own Python (``[toolchain] python``) is one of them. uv makes it as a project lock
(``uv lock``, whose ``environments`` restrict it to the target's OS and machine, and whose
``required-environments`` ask a wheel for each covered Python), exported as PEP 751
``pylock.toml``: one version per package wherever one fits every Python, markers where it
does not. The glibc level of the target (``manylinux_2_31``) is not a marker, so after uv
:func:`gaps` checks every package against the target's wheel tags, for each covered Python.
"""

from __future__ import annotations

import json
import re
import tomllib
from email.message import Message

from packaging.markers import Marker
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from qwen38build.errors import InputError

_CLASSIFIER = re.compile(r"^Programming Language :: Python :: 3\.(\d+)$")
_MANYLINUX = re.compile(r"^manylinux_(\d+)_(\d+)_(\w+)$")
# manylinux's legacy names and the glibc minor each stands for (PEP 600)
_LEGACY = (("manylinux2014", 17), ("manylinux2010", 12), ("manylinux1", 5))


def supported_pythons(meta: Message, fallback: str) -> list[str]:
    """The Python minors (``3.11``...) the pin's METADATA supports: its classifiers that its
    ``Requires-Python`` admits; ``fallback`` (the recipe's) when it lists none."""
    spec = SpecifierSet()
    if meta.get("Requires-Python"):
        try:
            spec = SpecifierSet(str(meta["Requires-Python"]))
        except InvalidSpecifier as exc:
            raise InputError(f"the pin's Requires-Python is not valid: {exc}.") from None
    minors = sorted({int(m.group(1)) for c in meta.get_all("Classifier") or []
                     if (m := _CLASSIFIER.match(str(c).strip()))})
    found = [f"3.{n}" for n in minors if spec.contains(f"3.{n}", prereleases=True)]
    return found or [".".join(fallback.split(".")[:2])]


def requires_python(pythons: list[str]) -> str:
    """The ``requires-python`` of a lock covering ``pythons`` (consecutive minors)."""
    minors = sorted(int(p.split(".")[1]) for p in pythons)
    return f">=3.{minors[0]},<3.{minors[-1] + 1}"


def environment_marker(machine: str) -> str:
    """The marker of the target's OS and machine (a uv ``environments`` entry)."""
    return f"sys_platform == 'linux' and platform_machine == '{machine}'"


def project(requirements: list[str], pythons: list[str], machine: str) -> str:
    """The ``pyproject.toml`` uv locks: a virtual project requiring ``requirements``."""
    env = environment_marker(machine)
    required = [f"{env} and python_version == '{p}'" for p in pythons]
    return (
        "[project]\nname = \"qwen38build-stack\"\nversion = \"0\"\n"
        f"requires-python = {json.dumps(requires_python(pythons))}\n"
        f"dependencies = {json.dumps(requirements)}\n\n"
        "[tool.uv]\npackage = false\nno-build = true\n"
        f"environments = {json.dumps([env])}\n"
        f"required-environments = {json.dumps(required)}\n"
    )


def wheels_only(text: str) -> str:
    """An exported lock without its source archives: ``env`` installs wheels only
    (``--no-build``), and :func:`gaps` proves a wheel for every covered Python."""
    return "".join(line for line in text.splitlines(keepends=True)
                   if not line.startswith("sdist = "))


def platform_tags(platform_tag: str) -> list[str]:
    """The wheel platforms a ``manylinux_X_Y_<machine>`` host installs, newest first."""
    m = _MANYLINUX.match(platform_tag)
    if m is None:
        raise InputError(f"{platform_tag!r} is not a manylinux_X_Y_<machine> platform.")
    major, minor, machine = int(m.group(1)), int(m.group(2)), m.group(3)
    out = [f"manylinux_{major}_{n}_{machine}" for n in range(minor, -1, -1)]
    out += [f"{name}_{machine}" for name, at in _LEGACY if major == 2 and minor >= at]
    return [*out, f"linux_{machine}"]


def machine_of(platform_tag: str) -> str:
    """``x86_64`` of ``manylinux_2_31_x86_64``."""
    m = _MANYLINUX.match(platform_tag)
    if m is None:
        raise InputError(f"{platform_tag!r} is not a manylinux_X_Y_<machine> platform.")
    return m.group(3)


def python_tags(python: str, platform_tag: str) -> set[Tag]:
    """The wheel tags CPython ``python`` installs on ``platform_tag``."""
    version = tuple(int(x) for x in python.split(".")[:2])
    plats = platform_tags(platform_tag)
    return {*cpython_tags(version, platforms=plats), *compatible_tags(version, platforms=plats)}


def marker_values(python: str, machine: str) -> dict[str, str]:
    """The PEP 508 marker values of CPython ``python`` on Linux ``machine``."""
    full = python if python.count(".") >= 2 else f"{python}.0"
    return {
        "python_version": ".".join(python.split(".")[:2]), "python_full_version": full,
        "implementation_name": "cpython", "implementation_version": full,
        "platform_python_implementation": "CPython", "sys_platform": "linux",
        "platform_system": "Linux", "os_name": "posix", "platform_machine": machine,
        "platform_release": "", "platform_version": "", "extra": "",
    }


def applies(package: dict[str, object], env: dict[str, str]) -> bool:
    """Whether a lock's package is installed where the markers are ``env``."""
    marker = package.get("marker")
    return not isinstance(marker, str) or Marker(marker).evaluate(env)


def _wheel_tags(artifact: object) -> frozenset[Tag]:
    if not isinstance(artifact, dict):
        return frozenset()
    name = str(artifact.get("name") or str(artifact.get("url", "")).rsplit("/", 1)[-1])
    try:
        return parse_wheel_filename(name)[3]
    except InvalidWheelFilename:
        return frozenset()


def covered(text: str) -> SpecifierSet:
    """A lock's ``requires-python`` (every Python when it has none)."""
    value = tomllib.loads(text).get("requires-python", "")
    return SpecifierSet(value if isinstance(value, str) else "")


def gaps(text: str, pythons: list[str], platform_tag: str) -> list[str]:
    """``name version (Python 3.X)`` for every package that the lock installs on CPython
    3.X on ``platform_tag`` without a wheel that installs there; [] when every covered
    Python is served."""
    packages = tomllib.loads(text).get("packages", [])
    machine = machine_of(platform_tag)
    out = []
    for python in pythons:
        env, tags = marker_values(python, machine), python_tags(python, platform_tag)
        for pkg in packages if isinstance(packages, list) else []:
            if not isinstance(pkg, dict) or not applies(pkg, env):
                continue
            wheels = pkg.get("wheels")
            if not any(_wheel_tags(w) & tags for w in (wheels if isinstance(wheels, list) else [])):
                out.append(f"{pkg.get('name')} {pkg.get('version')} (Python {python})")
    return out
