"""recipe.toml → a validated, frozen :class:`Recipe`.

Every problem of the file is collected (schema errors from pydantic, then the checks that
need the file system: series entries against the group folders), then raised once as a
:class:`RecipeError` naming the file and each TOML key path.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from packaging.version import InvalidVersion, Version
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    field_validator,
    model_validator,
)

from qwen38build.errors import RecipeError
from qwen38build.inputs.layout import entry_problems, path_problems, series_problem_lines

RECIPE_FILE = "recipe.toml"
_ARCH_RE = re.compile(r"^(?:sm_?|compute_)?(\d)\.?(\d)([af]?)$")
_KNOWN_MAJORS = {5, 6, 7, 8, 9, 10, 11, 12}


def normalise_arch(value: object) -> str:
    """Turn ``sm_86``, ``86``, ``8.6`` (and ``sm_90a``) into the canonical ``8.6`` / ``9.0a``."""
    text = str(value).strip().lower()
    m = _ARCH_RE.match(text)
    if not m or int(m.group(1)) not in _KNOWN_MAJORS:
        raise ValueError(
            f"{value!r} is not a CUDA arch; write it as major.minor, e.g. '8.6' or '9.0'"
        )
    return f"{m.group(1)}.{m.group(2)}{m.group(3)}"


def _check_version(value: str) -> str:
    try:
        Version(value)
    except InvalidVersion:
        raise ValueError(f"{value!r} is not a PEP 440 version") from None
    return value


def _check_hex(value: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{7,40}", value):
        raise ValueError(f"{value!r} is not a git commit (7 to 40 lowercase hex digits)")
    return value


def _check_series(value: str) -> str:
    if not re.fullmatch(r"[1-9][0-9]*\.[0-9]+", value):
        raise ValueError(f"{value!r} is not a CUDA release series; write MAJOR.MINOR, e.g. '13.0'")
    return value


def _check_patch_name(name: str) -> str:
    # ':' never: it marks a group's overlay among the series' names (``kvarn:overlay``).
    bad = any(c in name for c in "/\\:\0") or name.startswith(".")
    if bad or not name.endswith(".patch") or not name.isprintable():
        raise ValueError(f"{name!r} must be a bare file name ending in .patch")
    return name


PatchName = Annotated[str, AfterValidator(_check_patch_name)]
PepVersion = Annotated[str, AfterValidator(_check_version)]
CudaSeries = Annotated[str, AfterValidator(_check_series)]
Arch = Annotated[str, BeforeValidator(normalise_arch)]
Commit = Annotated[str, AfterValidator(_check_hex)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class VllmPin(_Model):
    """The pinned vLLM wheel: name==version and the tags that pick one file."""

    name: str = "vllm"
    version: PepVersion
    python_tag: str = "cp38"
    abi_tag: str = "abi3"
    platform_tag: str = "manylinux_2_28_x86_64"

    @property
    def wheel_filename(self) -> str:
        return (
            f"{self.name}-{self.version}-{self.python_tag}-{self.abi_tag}-"
            f"{self.platform_tag}.whl"
        )


class Group(_Model):
    """One folder of patches, applied in the order listed.

    ``overlay``: a folder of files (relative to the group's folder) copied into the package
    tree before the group's patches apply, each file listed with its sha256 in the folder's
    MANIFEST. ``optional``: built only when asked (``build --with DIR``) or when
    ``enabled``; the build hash says which groups were built. ``source``: a
    ``[sources.<name>]`` tree the overlay comes from (``overlay`` is then a folder of that
    tree, its top by default): until the lock pins it, the group is declared, not built."""

    dir: str
    patches: list[PatchName] = Field(default_factory=list)
    optional: StrictBool = False
    enabled: StrictBool = False
    overlay: str | None = None
    source: str | None = None

    @model_validator(mode="after")
    def _enabled_needs_optional(self) -> Group:
        if self.enabled and not self.optional:
            raise ValueError("enabled: only an optional group is switched on or off; set "
                             "optional = true, or remove enabled (a group is built by default)")
        return self


class Series(_Model):
    """The apply order: the groups in order, each entry in order; and retired topics."""

    groups: list[Group]
    retired: list[str] = Field(default_factory=list)


def _check_source_path(value: str) -> str:
    p = value.strip("/")
    if not p or value != p or "\\" in value or any(x in ("", ".", "..") for x in p.split("/")):
        raise ValueError(f"{value!r} is not a relative path inside the repository")
    return value


def _check_commit40(value: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{40}", value):
        raise ValueError(f"{value!r} is not a full git commit (40 lowercase hex digits)")
    return value


class SourceTree(_Model):
    """A fixed-output source tree (Nix: a fixed-output derivation): a repository's files
    at a commit, only those below ``paths`` (all when empty). The lock pins a hash of the
    tree by content; ``archive`` is the origin's archive URL (``{commit}`` is replaced; a
    GitHub repository needs none)."""

    repository: Annotated[str, Field(min_length=1)]
    commit: Annotated[str, AfterValidator(_check_commit40)]
    paths: list[Annotated[str, AfterValidator(_check_source_path)]] = Field(
        default_factory=list)
    archive: str | None = None


class Fetch(_Model):
    """Where fixed-output inputs are looked for before the network: folders (relative to
    the recipe) of wheels and of source trees' archives; one that does not exist is passed
    over. ``$QWEN38BUILD_SOURCES`` adds more."""

    mirrors: list[str] = Field(default_factory=list)


class Fa2(_Model):
    """The fp8-KV FlashAttention-2 diff against a pinned tree of vllm-project's fork:
    ``source`` and ``cutlass`` name ``[sources.*]`` trees, ``diff`` applies to the first at
    fuzz 0, ``build`` describes the library built from it per arch."""

    source: str
    cutlass: str
    diff: str
    build: str = "fa2/build.toml"


class Pthfa(_Model):
    """Our vendored int8 per-token-head attention extension."""

    tag: str
    path: str = "pthfa"
    commit: Commit | None = None


class Cuda(_Model):
    archs: list[Arch] = Field(min_length=1)


class Toolchain(_Model):
    """What builds and runs the stack.

    ``python``: pip's ``--python-version`` for every fetch and the environment lock;
    ``torch``: the torch the environment lock must hold; ``cuda``: the release series of
    NVIDIA's compiler wheels that ``lock`` pins (the kernels compile with them);
    ``gnu_patch``: the GNU patch release that applies the series, part of the patch step's
    digest (a machine that only substitutes needs no patch at all) and checked against
    the machine's ``patch --version`` where the series is applied.
    """

    python: PepVersion
    torch: PepVersion
    cuda: CudaSeries
    gnu_patch: Annotated[str, Field(pattern=r"^[0-9]+(\.[0-9]+){1,2}$")] = "2.7.6"


class Waiver(_Model):
    """One lint finding let through on the record: the ``rule`` it breaks, the ``patch``
    (topic) it is in, optionally a text its message ``contains`` (to name one finding of
    several), and the ``reason``. Printed on every build and kept in the build record; a
    waiver that matches no finding is itself a finding."""

    rule: Literal["headers", "series", "env-knobs", "diff-hygiene", "enum-alias", "provenance",
                  "fa2-upstream"]
    patch: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")]
    contains: str = ""
    reason: Annotated[str, Field(min_length=10)]


class Lint(_Model):
    """The lint's configuration: ``env_allow`` names other programs' environment variables
    a patch may read without registering them in envs.py (short and explicit, no prefixes);
    ``waivers`` let named findings through, each with its reason."""

    env_allow: list[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]] = Field(
        default_factory=list
    )
    waivers: list[Waiver] = Field(default_factory=list)


class Environment(_Model):
    """The stack's Python environment (lock/pylock.toml, wheels only): the wheel platform
    it is locked for, where the pin's requirements need a newer one than its own wheel."""

    platform: str

    @field_validator("platform")
    @classmethod
    def _manylinux(cls, value: str) -> str:
        if not re.fullmatch(r"manylinux_\d+_\d+_(x86_64|aarch64)", value):
            raise ValueError(f"{value!r} is not a manylinux_X_Y_x86_64 or _aarch64 tag")
        return value


Output = Literal["vllm", "pthfa", "fa2", "pylock", "vllm-py"]
OUTPUTS: tuple[Output, ...] = ("vllm", "pthfa", "fa2", "pylock", "vllm-py")


class Build(_Model):
    """What ``build`` makes with no ``--only``: the stack's outputs, all of them by default
    (the patched vLLM wheel, the pthfa wheel for every arch, the checked environment lock).
    """

    outputs: list[Output] = Field(default_factory=lambda: list(OUTPUTS), min_length=1)

    @field_validator("outputs")
    @classmethod
    def _unique(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("an output is listed twice")
        return value


class Recipe(_Model):
    """The validated content of recipe.toml."""

    vllm: VllmPin
    series: Series
    fa2: Fa2
    pthfa: Pthfa
    cuda: Cuda
    toolchain: Toolchain
    lint: Lint = Field(default_factory=Lint)
    environment: Environment | None = None  # None: the vLLM wheel's platform
    build: Build = Field(default_factory=Build)
    sources: dict[Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")], SourceTree] = Field(
        default_factory=dict)
    fetch: Fetch = Field(default_factory=Fetch)

    @model_validator(mode="after")
    def _sources_named(self) -> Recipe:
        for key, name in (("fa2.source", self.fa2.source), ("fa2.cutlass", self.fa2.cutlass)):
            if name not in self.sources:
                raise ValueError(f"{key}: {name!r} names no [sources.{name}] table")
        for i, g in enumerate(self.series.groups):
            if g.source is not None and g.source not in self.sources:
                raise ValueError(f"series.groups.{i}.source: {g.source!r} names no "
                                 f"[sources.{g.source}] table")
        return self


@dataclass(frozen=True)
class SeriesEntry:
    """One patch of the series, with the name its ledger row carries."""

    group: str
    file: str
    path: Path  # absolute

    @property
    def topic(self) -> str:
        return self.file[: -len(".patch")]

    @property
    def row_name(self) -> str:
        """``topic`` for the first group, ``<group>/<topic>`` for later ones (as the ledger)."""
        return self.topic if self.group == "patches" else f"{self.group}/{self.topic}"


@dataclass(frozen=True)
class LoadedRecipe:
    """A recipe together with where it was read from."""

    recipe: Recipe
    path: Path

    @property
    def root(self) -> Path:
        return self.path.parent

    def mirrors(self) -> list[Path]:
        """The recipe's mirror folders, then ``$QWEN38BUILD_SOURCES``'s."""
        from qwen38build.inputs.env import source_dirs

        return [self.root / m for m in self.recipe.fetch.mirrors] + source_dirs()

    def series_entries(self, groups: Collection[str] | None = None) -> list[SeriesEntry]:
        """Every patch of the series in order, or of the groups named in ``groups``."""
        return [
            # realpath, not resolve(): a link loop must reach the checks, not raise here.
            SeriesEntry(g.dir, name, Path(os.path.realpath(self.root / g.dir / name)))
            for g in self.recipe.series.groups
            if groups is None or g.dir in groups
            for name in g.patches
        ]


def load(path: Path) -> LoadedRecipe:
    """Read and validate ``path``; raise RecipeError listing every problem found.

    The project is the folder the recipe is named in: a recipe that is a link resolving to
    another folder (another checkout) is refused, never built from there."""
    real = os.path.realpath(path)
    if os.path.dirname(real) != os.path.realpath(os.path.dirname(os.path.abspath(path))):
        raise RecipeError(str(path), [f"a link to {real}, outside the folder it is named in; "
                                      "inputs stay inside the project"],
                          hint="pass --recipe with the other project's own recipe.toml, or "
                          "replace the link with the file")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise RecipeError(
            str(path), [f"cannot read the file: {exc.strerror}"],
            hint="run from the project root, or pass --recipe PATH",
        ) from exc
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise RecipeError(str(path), [f"not valid TOML: {exc}"]) from exc
    return validate(data, path)


def validate(data: dict[str, object], path: Path) -> LoadedRecipe:
    """Validate parsed TOML; the file-system checks use ``path``'s folder."""
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        raise RecipeError(str(path), [_describe(e) for e in exc.errors()]) from None
    loaded = LoadedRecipe(recipe, Path(os.path.realpath(path)))
    problems = path_problems(loaded)
    problems = problems or (entry_problems(loaded) + series_problem_lines(loaded))
    if problems:
        raise RecipeError(str(path), problems)
    return loaded


def _describe(err: Any) -> str:
    loc = ".".join(str(p) for p in err["loc"])
    kind = err["type"]
    if kind == "extra_forbidden":
        return f"{loc}: unknown key; remove it or check its spelling"
    if kind == "missing":
        return f"{loc}: required key is missing"
    msg = str(err["msg"]).removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg


