"""env: a virtual environment of the whole stack, made by uv from the locks and the store.

Order, each step refusing before anything is written: the environment lock must be current
(``envlock.check``); the patched vLLM wheel and the pthfa wheel must be built (in the store,
under the digests the recipe plans) and still hash to what the store recorded; the
interpreter must exist. Then ``uv venv``, ``uv pip sync`` of ``lock/pylock.toml`` with
hashes required, ``uv pip install --no-deps`` of the two wheels, and finally ``verify`` of
the installed vLLM against the build's manifest. ``offline`` (or ``UV_OFFLINE``) keeps uv
off the network: the store and uv's cache must then hold everything.

The interpreter: ``--python`` when given, else the recipe's (``[toolchain] python``, the
stack's), else any other Python the lock covers (it covers every one the pin supports), with
a note saying so. None is ever downloaded. One that the lock does not cover is refused
before anything is made; whatever fails later, a directory ``env`` created is removed, its
created parents with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from qwen38build.digest import sha256_file
from qwen38build.engine.step import Step
from qwen38build.errors import CheckFailed, InputError, Qwen38BuildError, StoreError, UsageError
from qwen38build.files import atomic_write, remove_tree
from qwen38build.inputs import lock as lockmod
from qwen38build.inputs.recipe import LoadedRecipe
from qwen38build.pinning import pylock as envlock
from qwen38build.pinning import universal
from qwen38build.proc import run
from qwen38build.store.entry import Entry
from qwen38build.store.store import Store


@dataclass(frozen=True)
class Made:
    """What ``make`` produced."""

    dest: Path
    python: str  # the environment's interpreter
    python_version: str  # its version (x.y.z)
    note: str | None  # why it is not the recipe's Python, when it is not
    site_packages: Path
    packages: int  # from the environment lock
    wheels: tuple[str, ...]  # installed from the store


def built_wheels(loaded: LoadedRecipe, store: Store) -> list[Path]:
    """The patched vLLM wheel and the pthfa wheel of this recipe, checked against the store.

    A wheel that is not built is a usage error telling which command builds it.
    """
    vllm = _entry(store, _part(loaded, "vllm").digest, "the patched vLLM wheel",
                  "qwen38build build")
    try:
        pthfa_digest = pthfa_step(loaded).digest
    except Qwen38BuildError as exc:
        raise UsageError(f"the pthfa wheel cannot be located: {exc}",
                         hint="run `qwen38build kernels` where its compiler is") from None
    pthfa = _entry(store, pthfa_digest, "the pthfa wheel", "qwen38build kernels")
    return [_checked(vllm), _checked(pthfa)]


def _part(loaded: LoadedRecipe, name: str) -> Step:
    """The top step of one output of the stack, as ``build`` plans it."""
    from qwen38build.engine.plan import make_plan
    from qwen38build.kernels.kernels import system_nvcc_requested

    plan = make_plan(loaded, lockmod.read(loaded.root), only=[name],
                     system_nvcc=system_nvcc_requested(False))
    return plan.targets[name]


def pthfa_step(loaded: LoadedRecipe) -> Step:
    """The step whose output is the recipe's pthfa wheel (every arch of the recipe)."""
    return _part(loaded, "pthfa")


def _entry(store: Store, digest: str, what: str, command: str) -> Entry:
    entry = store.get(digest)
    if entry is None:
        raise UsageError(f"{what} of this recipe (step {digest[:12]}) is not in the store "
                         f"{store.root}.", hint=f"run `{command}` first")
    return entry


def _checked(entry: Entry) -> Path:
    wheel = entry.the_output(".whl")
    want = entry.outputs[wheel.name]["sha256"]
    got = sha256_file(wheel)
    if got != want:
        raise StoreError(f"{wheel}: sha256 {got} differs from the store's record {want}; "
                         "it changed after it was built.",
                         hint="run `qwen38build store verify`, then rebuild")
    return wheel


# Written into an environment `env` made, last: only such an environment is synced again.
MARKER = ".qwen38build-env"


def make(loaded: LoadedRecipe, store: Store, dest: Path, *, python: str | None = None,
         offline: bool = False) -> Made:
    """Make (or bring up to date) the environment in ``dest``; see the module docstring."""
    pylock = envlock.check(loaded)
    wheels = built_wheels(loaded, store)
    top = _first_missing(dest)
    fresh = top is not None or (dest.is_dir() and not any(dest.iterdir()))
    if not fresh and not (dest / MARKER).is_file():
        what = "a virtual environment made by something else" if (
            dest / "pyvenv.cfg").is_file() else "not an environment `env` made"
        raise UsageError(
            f"{dest}: exists and is {what}; `env` syncs an environment to the lock, which "
            "would uninstall what it did not put there.",
            hint="give a new directory (or an empty one), or one `env` made before")
    exe, version, note = interpreter(loaded, pylock, python)
    try:
        made = _make(loaded, dest, pylock, wheels, store, python=(exe, version, note),
                     offline=offline)
    except BaseException:
        made_dir = top if top is not None else dest
        if fresh and made_dir.exists():  # nothing half-made is left behind
            remove_tree(made_dir)
        raise
    atomic_write(dest / MARKER, f"{loaded.path}\n".encode())
    return made


def _first_missing(dest: Path) -> Path | None:
    """The outermost of ``dest`` and its parents that does not exist (what a make creates),
    None when ``dest`` exists."""
    top = None
    for p in (dest.absolute(), *dest.absolute().parents):
        if p.exists() or p.is_symlink():
            break
        top = p
    return top


def _find(request: str) -> tuple[str, str] | None:
    """The interpreter uv finds for ``request`` (a version, a range or a path) and its
    version, never downloading one; None when there is none."""
    try:
        found = envlock.uv(["python", "find", request, "--no-python-downloads"],
                           what=f"find Python {request}").strip()
    except envlock.UvError:
        return None
    if not found:
        return None
    proc = run([found, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
               what=f"Python {request} ({found})")
    return (found, proc.stdout.strip()) if proc.ok else None


def interpreter(loaded: LoadedRecipe, pylock: Path, python: str | None
                ) -> tuple[str, str, str | None]:
    """The interpreter ``env`` uses (path, version, a note when it is not the recipe's):
    ``python`` when given, else the recipe's, else another the lock covers; InputError,
    before anything is made, when there is none or ``python`` is one the lock does not
    cover."""
    spec = universal.covered(envlock.read_text(pylock))
    lock = f"{lockmod.LOCK_DIR}/{pylock.name}"
    if python is not None:
        found = _find(python)
        if found is None:
            raise InputError(f"Python {python} (--python) was not found or does not run.",
                             hint="pass --python PATH of an interpreter to use")
        if not spec.contains(found[1], prereleases=True):
            raise InputError(
                f"Python {python} (--python) is {found[1]}, which {lock} does not cover "
                f"(requires-python {spec}).",
                hint=f"pass --python of a Python in {spec}")
        return (*found, None)
    want = loaded.recipe.toolchain.python
    found = _find(want)
    if found is not None:
        return (*found, None)
    other = _find(str(spec))
    if other is None:
        raise InputError(
            f"no Python that {lock} covers was found (requires-python {spec}): not "
            f"{want} ({loaded.path.name} [toolchain] python, the stack's), nor another; "
            "none is downloaded.",
            hint=f"install Python {want} (or another in {spec}), or pass --python PATH")
    return (*other, f"Python {want} ({loaded.path.name} [toolchain] python) was not found; "
            f"using {other[1]} at {other[0]}, which {lock} also covers")


def _make(loaded: LoadedRecipe, dest: Path, pylock: Path, wheels: list[Path], store: Store, *,
          python: tuple[str, str, str | None], offline: bool) -> Made:
    net = ["--offline"] if offline else []
    envlock.uv(["venv", str(dest), "--python", python[0], "--no-python-downloads",
                "--allow-existing", "--quiet"], what=f"make a virtual environment in {dest}")
    exe = dest / "bin" / "python"
    envlock.uv(["pip", "sync", str(pylock), "--python", str(exe), "--require-hashes",
                "--no-build", "--preview-features", "pylock", "--quiet", *net],
               what=f"install {pylock.name} into {dest}")
    envlock.uv(["pip", "install", "--python", str(exe), "--no-deps", "--reinstall",
                "--quiet", *net, *map(str, wheels)],
               what=f"install the built wheels into {dest}")
    site = site_packages(exe)
    _verify(store, loaded, site, wheels[1])
    entry = lockmod.locked_vllm(loaded, lockmod.read(loaded.root))
    env = universal.marker_values(python[1], universal.machine_of(
        envlock.target_platform(loaded, entry)))
    count = len(envlock.packages_of(envlock.read_text(pylock), str(pylock), env))
    return Made(dest, str(exe), python[1], python[2], site, count,
                tuple(w.name for w in wheels))


def site_packages(exe: Path) -> Path:
    """The environment's purelib directory, as its own interpreter says."""
    proc = run([exe, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
               what=f"the environment's Python ({exe})")
    if not proc.ok:
        raise CheckFailed(f"{exe}: does not run: {proc.stderr.strip()[-300:]}")
    return Path(proc.stdout.strip())


def _verify(store: Store, loaded: LoadedRecipe, site: Path, pthfa: Path) -> None:
    """Every installed part holds exactly the build's bytes (the checks ``verify`` makes):
    the patched vLLM tree, its dist-info, and the pthfa wheel's files."""
    from qwen38build.wheels.installed import (
        read_manifest,
        verify_dist_info,
        verify_tree,
        verify_wheel_files,
    )

    build = _part(loaded, "vllm").digest
    manifest = read_manifest(store.objects / build)
    problems = [*verify_tree(site, manifest), *verify_dist_info(site, manifest),
                *verify_wheel_files(site, pthfa)]
    if problems:
        raise CheckFailed(f"{site}: the installed vLLM differs from build {build[:12]}: "
                          + "; ".join(str(p) for p in problems[:5]) + ".")
