"""The ledger's rules: a clean project passes, and each rule broken on purpose is named.

Every test starts from a small project that passes every rule (built in ``tmp_path``),
breaks one thing, and reads the finding: file, line, rule, message and hint.
"""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

import pytest

from qwen38build.errors import LintFailed, RecipeError
from qwen38build.inputs.recipe import load
from qwen38build.lint.envknobs import read_pristine_knobs
from qwen38build.lint.finding import Finding
from qwen38build.lint.lint import check, load_for_lint
from qwen38build.lint.provenance import vendored_files
from qwen38build.series import knobtext
from qwen38build.series.patchfile import marker_for

REPO = Path(__file__).resolve().parents[1]
WHEEL = "vllm-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"

RECIPE = """\
[vllm]
version = "0.32.0"

[series]
retired = ["old-topic"]

[[series.groups]]
dir = "patches"
patches = [
    "speed-knobs-envs.patch",
    "feature-a.patch",
]

[[series.groups]]
dir = "kvarn"
patches = ["kvarn-x.patch"]

[fa2]
source = "flash-attention"
cutlass = "cutlass"
diff = "fa2/fp8-kv.diff"

[sources.flash-attention]
repository = "https://github.com/vllm-project/flash-attention"
commit = "0123456789abcdef0123456789abcdef01234567"

[sources.cutlass]
repository = "https://github.com/NVIDIA/cutlass"
commit = "89abcdef0123456789abcdef0123456789abcdef"

[pthfa]
tag = "v0.1.0"
path = "pthfa"

[cuda]
archs = ["8.6"]

[toolchain]
python = "3.12"
torch = "2.11.0"
cuda = "13.0"

[lint]
env_allow = ["OPENAI_API_KEY"]
"""

HEADERS = {
    "speed-knobs-envs": "Kind: local\nWhat: register this repo's env knobs in `envs.py`\n",
    "feature-a": "Kind: feature\nWhat: a feature that reads its own knob and a local one,\n"
    "  over two lines\n",
    "kvarn-x": "Kind: own\nWhat: the KVarN side\n",
}
COMMON = "Upstream: none\nCut-against: 0.32.0\nRetires-when: stays\n"

DIFFS = {
    "speed-knobs-envs": """\
diff --git a/envs.py b/envs.py
--- a/envs.py
+++ b/envs.py
@@ -10,2 +10,5 @@ environment_variables = {
     "VLLM_HOST_IP": lambda: os.getenv("VLLM_HOST_IP", ""),
+    "VLLM_LOCAL_KNOB": lambda: bool(
+        int(os.getenv("VLLM_LOCAL_KNOB", "0"))
+    ),
 }
""",
    "feature-a": """\
diff --git a/envs.py b/envs.py
--- a/envs.py
+++ b/envs.py
@@ -20,2 +20,3 @@ environment_variables = {
     "VLLM_PORT": get_vllm_port,
+    "VLLM_FEATURE_KNOB": lambda: os.getenv("VLLM_FEATURE_KNOB"),
 }
diff --git a/v1/feature.py b/v1/feature.py
--- a/v1/feature.py
+++ b/v1/feature.py
@@ -1,3 +1,8 @@
 import os
+from vllm import envs
+if envs.VLLM_FEATURE_KNOB and envs.is_set("VLLM_LOCAL_KNOB"):
+    key = os.environ.get("OPENAI_API_KEY")  # another program's variable, not a knob
+    os.environ["VLLM_CHILD_FLAG"] = "1"  # a write, not a read
+    # os.getenv("VLLM_IN_A_COMMENT")

 def f():
""",
    "kvarn-x": """\
diff --git a/v1/attention/kvarn.py b/v1/attention/kvarn.py
--- a/v1/attention/kvarn.py
+++ b/v1/attention/kvarn.py
@@ -5,3 +5,3 @@ class Kvarn:
     def a(self):
-        return 1
+        return 2
     def b(self):
""",
}
FILES = {
    "speed-knobs-envs": "patches",
    "feature-a": "patches",
    "kvarn-x": "kvarn",
}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_manifest(folder: Path) -> None:
    lines = [f"{sha256(folder / rel)}  {rel}" for rel in vendored_files(folder)]
    (folder / "MANIFEST").write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project whose every rule passes: three patches, fa2 declared, pthfa vendored."""
    (tmp_path / "recipe.toml").write_text(RECIPE, encoding="utf-8")
    for topic, folder in FILES.items():
        (tmp_path / folder).mkdir(exist_ok=True)
        text = (
            f"Prose about {topic}.\n\n{HEADERS[topic]}{COMMON}"
            f"{marker_for('1234567abcdef', topic)}\n{DIFFS[topic]}"
        )
        (tmp_path / folder / f"{topic}.patch").write_text(text, encoding="utf-8")
    (tmp_path / "fa2").mkdir()
    (tmp_path / "fa2" / "README.md").write_text(
        "# fa2\n\nAgainst https://github.com/vllm-project/flash-attention, not pinned yet.\n",
        encoding="utf-8",
    )
    pthfa = tmp_path / "pthfa"
    (pthfa / "csrc").mkdir(parents=True)
    (pthfa / "PIN").write_text("v0.1.0\n", encoding="utf-8")
    (pthfa / ".gitignore").write_text("*.cubin\n/build/\n", encoding="utf-8")
    (pthfa / "csrc" / "a.cu").write_text("__global__ void k() {}\n", encoding="utf-8")
    write_manifest(pthfa)
    (pthfa / "csrc" / "a.sm_86.cubin").write_bytes(b"\x7fELF built, ignored")
    (pthfa / "build").mkdir()
    (pthfa / "build" / "out.o").write_bytes(b"ignored")
    return tmp_path


def run(root: Path, **kwargs: object) -> list[Finding]:
    return check(load_for_lint(root / "recipe.toml"), **kwargs)  # type: ignore[arg-type]


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_bytes().decode("utf-8")
    assert old in text, f"{old!r} not in {path}"
    path.write_bytes(text.replace(old, new, 1).encode("utf-8"))


def line_of(path: Path, needle: str) -> int:
    lines = path.read_bytes().decode("utf-8").split("\n")
    return next(i for i, ln in enumerate(lines, start=1) if needle in ln)


def only(findings: list[Finding]) -> Finding:
    assert len(findings) == 1, "\n".join(map(str, findings))
    return findings[0]


def test_clean_project_passes_every_rule(project: Path) -> None:
    assert run(project) == []


def test_finding_reads_file_line_rule_message(project: Path) -> None:
    f = Finding(Path("patches/x.patch"), 7, "headers", "header 'What' is missing.", "add it")
    assert str(f) == "patches/x.patch:7: [headers] header 'What' is missing."
    err = LintFailed([f])
    assert str(err) == ("1 ledger rule(s) broken: patches/x.patch:7: [headers] header 'What' "
                        "is missing.")
    assert err.exit_code == 2  # bad input: the file and line are named, nothing was applied


# -- headers -----------------------------------------------------------------------------


def test_missing_header_is_named_at_the_header_block(project: Path) -> None:
    path = project / "patches" / "feature-a.patch"
    edit(path, "Upstream: none\n", "")
    f = only(run(project))
    assert (f.file, f.line, f.rule) == (Path("patches/feature-a.patch"), 3, "headers")
    assert f.message == "header 'Upstream' is missing; the ledger row of feature-a is " \
        "written from it."
    assert "add 'Upstream: ...'" in f.hint and "re-export" in f.hint


def test_empty_header_is_named_at_its_line(project: Path) -> None:
    path = project / "patches" / "feature-a.patch"
    edit(path, "Retires-when: stays", "Retires-when:")
    f = only(run(project))
    assert (f.line, f.rule) == (line_of(path, "Retires-when:"), "headers")
    assert f.message == "header 'Retires-when' is empty."
    assert "'none'" in f.hint


def test_unknown_kind(project: Path) -> None:
    path = project / "kvarn" / "kvarn-x.patch"
    edit(path, "Kind: own", "Kind: bugfix")
    f = only(run(project))
    assert (f.file, f.line, f.rule) == (Path("kvarn/kvarn-x.patch"), 3, "headers")
    assert f.message == "Kind 'bugfix' is not one of backport, fix, feature, local, own."


@pytest.mark.parametrize("cut", ["0.31.0", "0.32.01", "v0.32.0", "main"])
def test_cut_against_must_start_with_the_pin(project: Path, cut: str) -> None:
    path = project / "patches" / "feature-a.patch"
    edit(path, "Cut-against: 0.32.0", f"Cut-against: {cut}")
    f = only(run(project))
    assert (f.line, f.rule) == (line_of(path, "Cut-against:"), "headers")
    assert f.message == f"Cut-against {cut!r} does not start with the recipe's vLLM pin 0.32.0."
    assert "re-cut the topic on v0.32.0" in f.hint


def test_cut_against_with_a_note_passes(project: Path) -> None:
    path = project / "patches" / "feature-a.patch"
    edit(path, "Cut-against: 0.32.0", "Cut-against: 0.32.0: re-anchored after #61126\n  moved")
    assert run(project) == []


def test_missing_marker(project: Path) -> None:
    path = project / "patches" / "feature-a.patch"
    edit(path, marker_for("1234567abcdef", "feature-a") + "\n", "")
    f = only(run(project))
    assert (f.line, f.rule) == (9, "headers")
    assert "marker line is missing" in f.message
    assert "qwen38build export" in f.hint


def test_marker_commit_must_be_hex(project: Path) -> None:
    path = project / "patches" / "feature-a.patch"
    edit(path, "from 1234567abcdef (", "from HEAD~1 (")
    f = only(run(project))
    assert (f.line, f.rule) == (line_of(path, "--- exported from"), "headers")
    assert f.message == "the marker names 'HEAD~1', which is not a commit (7 to 40 hex digits)."


def test_marker_topic_must_match_the_file_name(project: Path) -> None:
    path = project / "patches" / "feature-a.patch"
    edit(path, "(feature-a)", "(feature-b)")
    f = only(run(project))
    assert (f.line, f.rule) == (line_of(path, "--- exported from"), "headers")
    assert f.message == "the marker names topic 'feature-b' but the file is feature-a.patch."
    assert "rename the file to feature-b.patch" in f.hint


def test_duplicate_header(project: Path) -> None:
    path = project / "patches" / "feature-a.patch"
    edit(path, "Upstream: none\n", "Upstream: none\nUpstream: vllm #1\n")
    f = only(run(project))
    assert (f.line, f.rule) == (line_of(path, "Upstream: vllm #1"), "headers")
    assert f.message == "header 'Upstream' appears twice (first at line 6)."


# -- series ------------------------------------------------------------------------------


def test_file_not_in_the_series(project: Path) -> None:
    stray = project / "patches" / "stray.patch"
    stray.write_bytes((project / "patches" / "feature-a.patch").read_bytes())
    with pytest.raises(RecipeError):
        load(project / "recipe.toml")  # why the lint loads with load_for_lint
    f = only(run(project))
    assert (f.file, f.line, f.rule) == (Path("patches/stray.patch"), 1, "series")
    assert f.message == "patches/stray.patch is in the folder but not in the recipe's series."
    assert "add 'stray.patch' to the patches of the 'patches' group" in f.hint


def test_series_entry_without_a_file(project: Path) -> None:
    (project / "kvarn" / "kvarn-x.patch").unlink()
    f = only(run(project))
    recipe = project / "recipe.toml"
    assert (f.file, f.line, f.rule) == (Path("recipe.toml"), line_of(recipe, "kvarn-x"), "series")
    assert f.message == "series entry kvarn/kvarn-x.patch has no file."


def test_series_entry_twice(project: Path) -> None:
    recipe = project / "recipe.toml"
    edit(recipe, 'patches = ["kvarn-x.patch"]', 'patches = ["kvarn-x.patch", "feature-a.patch"]')
    (project / "kvarn" / "feature-a.patch").write_bytes(
        (project / "patches" / "feature-a.patch").read_bytes()
    )
    f = only([f for f in run(project) if f.rule == "series"])
    assert (f.file, f.line) == (Path("recipe.toml"), line_of(recipe, '"kvarn-x.patch", "feat'))
    assert f.message == "kvarn/feature-a.patch is listed twice in the series (also in patches/)."


def test_retired_topic_present_as_a_file(project: Path) -> None:
    (project / "patches" / "old-topic.patch").write_text("x\n", encoding="utf-8")
    f = only(run(project))
    assert (f.file, f.line, f.rule) == (Path("patches/old-topic.patch"), 1, "series")
    assert "is a retired topic (series.retired) and must not be in the tree" in f.message
    assert f.hint.startswith("delete the file")


def test_retired_topic_listed(project: Path) -> None:
    recipe = project / "recipe.toml"
    edit(recipe, '"feature-a.patch",\n', '"feature-a.patch",\n    "old-topic.patch",\n')
    findings = [f for f in run(project) if f.rule == "series"]
    assert [(f.file, f.line) for f in findings] == [
        (Path("recipe.toml"), line_of(recipe, "old-topic.patch")),
    ] * 2
    assert "is a retired topic (series.retired) but is listed" in findings[0].message
    assert findings[1].message == "series entry patches/old-topic.patch has no file."


# -- env knobs ---------------------------------------------------------------------------


def test_knob_read_without_registration(project: Path) -> None:
    path = project / "patches" / "feature-a.patch"
    edit(path, "@@ -1,3 +1,8 @@", "@@ -1,3 +1,9 @@")
    edit(path, "+from vllm import envs\n",
         "+from vllm import envs\n+LIMIT = int(os.getenv('VLLM_UNREGISTERED', '4'))\n")
    f = only(run(project, pristine_knobs=frozenset()))
    assert (f.file, f.line, f.rule) == (
        Path("patches/feature-a.patch"), line_of(path, "VLLM_UNREGISTERED"), "env-knobs"
    )
    assert f.message == (
        "feature-a reads env knob VLLM_UNREGISTERED (os.getenv) in v1/feature.py, but no "
        "envs.py hunk of feature-a or speed-knobs-envs registers it."
    )
    assert "register VLLM_UNREGISTERED in envs.py's environment_variables in a hunk of " \
        "feature-a (or in speed-knobs-envs for a local knob)" in f.hint
    assert str(f).startswith(f"patches/feature-a.patch:{f.line}: [env-knobs] feature-a reads")


def test_knob_registered_by_another_patch_does_not_count(project: Path) -> None:
    kvarn = project / "kvarn" / "kvarn-x.patch"
    kvarn.write_text(kvarn.read_text(encoding="utf-8") + DIFFS["feature-a"].split(
        "diff --git a/v1")[0].replace("VLLM_FEATURE_KNOB", "KVARN_KNOB"), encoding="utf-8")
    path = project / "patches" / "feature-a.patch"
    edit(path, "envs.is_set(\"VLLM_LOCAL_KNOB\")", "envs.is_set(\"KVARN_KNOB\")")
    f = only(run(project, pristine_knobs=frozenset()))
    assert (f.line, f.rule) == (line_of(path, "KVARN_KNOB"), "env-knobs")
    assert "reads env knob KVARN_KNOB (envs.is_set)" in f.message
    assert "kvarn-x registers it, but a patch may rely only on its own hunks or on " \
        "speed-knobs-envs." in f.message


@pytest.mark.parametrize(
    "expr",
    ['os.environ["VLLM_NEW"]', "os.environ.get('VLLM_NEW')", 'os.getenv("VLLM_NEW", "1")',
     "envs.VLLM_NEW", 'envs.is_set("VLLM_NEW")', 'vllm.envs.VLLM_NEW'],
)
def test_every_form_of_knob_read_is_seen(project: Path, expr: str) -> None:
    path = project / "patches" / "feature-a.patch"
    edit(path, "@@ -1,3 +1,8 @@", "@@ -1,3 +1,9 @@")
    edit(path, "+from vllm import envs\n", f"+from vllm import envs\n+x = {expr}\n")
    f = only(run(project, pristine_knobs=frozenset()))
    assert f.rule == "env-knobs" and "VLLM_NEW" in f.message


def test_pristine_knob_is_registered(project: Path, tmp_path_factory: pytest.TempPathFactory
                                     ) -> None:
    path = project / "patches" / "feature-a.patch"
    edit(path, "@@ -1,3 +1,8 @@", "@@ -1,3 +1,9 @@")
    edit(path, "+from vllm import envs\n", "+from vllm import envs\n+h = envs.VLLM_HOST_IP\n")
    # Without pristine envs.py the lint cannot know, and says so.
    f = only(run(project))
    assert f.rule == "env-knobs"
    assert "Pristine envs.py was not read (no wheel given)" in f.message
    assert run(project, pristine_knobs=frozenset({"VLLM_HOST_IP"})) == []
    other = tmp_path_factory.mktemp("pristine")
    envs_py = other / "envs.py"
    envs_py.write_text(
        "import os\nenvironment_variables: dict[str, object] = {\n"
        '    "VLLM_HOST_IP": lambda: os.getenv("VLLM_HOST_IP", ""),\n}\n',
        encoding="utf-8",
    )
    assert read_pristine_knobs(envs_py) == frozenset({"VLLM_HOST_IP"})
    assert run(project, pristine_envs=envs_py) == []
    wheel = other / WHEEL
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("vllm/envs.py", envs_py.read_text(encoding="utf-8"))
    assert run(project, pristine_envs=wheel) == []


def test_text_fallback_ignores_writes_and_comments() -> None:
    def names(text: str) -> list[tuple[str, str]]:
        return [(r.name, r.form) for r in knobtext.reads_in_text(text)]

    assert names('os.environ["VLLM_X"] = "1"') == []
    assert names('del os.environ["VLLM_X"]') == []
    assert names('# envs.VLLM_X') == []
    assert names('x = os.environ["VLLM_X"] == "1"') == [("VLLM_X", "os.environ[...]")]
    assert names("envs.is_set('A_B') or envs.environment_variables") == [
        ("A_B", "envs.is_set")
    ]


def test_real_wheel_knobs_when_present() -> None:
    wheel = find_wheel()
    if wheel is None:
        pytest.skip(f"no {WHEEL} here (set QWEN38_VLLM_WHEEL)")
    knobs = read_pristine_knobs(wheel)
    assert {"VLLM_USE_FLASHINFER_SAMPLER", "VLLM_HOST_IP", "CUDA_VISIBLE_DEVICES"} <= knobs
    assert len(knobs) > 300


# -- diff hygiene ------------------------------------------------------------------------


def test_path_leaving_the_package(project: Path) -> None:
    path = project / "kvarn" / "kvarn-x.patch"
    text = path.read_text(encoding="utf-8").replace("v1/attention/kvarn.py", "../setup.py")
    path.write_text(text, encoding="utf-8")
    findings = run(project)
    assert [(f.line, f.rule) for f in findings] == [
        (line_of(path, "--- a/../setup.py"), "diff-hygiene"),
        (line_of(path, "+++ b/../setup.py"), "diff-hygiene"),
    ]
    assert findings[0].message == "diff path 'a/../setup.py' leaves the vllm/ package."
    assert "relative to the vllm/ package" in findings[0].hint


def test_absolute_path(project: Path) -> None:
    path = project / "kvarn" / "kvarn-x.patch"
    edit(path, "--- a/v1/attention/kvarn.py", "--- /etc/kvarn.py")
    f = only(run(project))
    assert (f.line, f.rule) == (line_of(path, "--- /etc/kvarn.py"), "diff-hygiene")
    assert "'/etc/kvarn.py' has no a/ or b/ prefix" in f.message


def test_diff_git_names_that_disagree_with_minus_plus(project: Path) -> None:
    path = project / "patches" / "feature-a.patch"
    edit(path, "diff --git a/v1/feature.py b/v1/feature.py",
         "diff --git a/v1/other.py b/v1/other.py")
    f = only(run(project, pristine_knobs=frozenset()))
    assert (f.file, f.line, f.rule) == (
        Path("patches/feature-a.patch"), line_of(path, "diff --git a/v1/other.py"),
        "diff-hygiene",
    )
    assert f.message == (
        "'diff --git' names v1/other.py but '---'/'+++' name v1/feature.py and "
        "v1/feature.py; GNU patch follows the one, git apply the other."
    )


def test_diff_git_two_names_need_a_rename_line(project: Path) -> None:
    path = project / "patches" / "feature-a.patch"
    edit(path, "diff --git a/v1/feature.py b/v1/feature.py",
         "diff --git a/v1/feature.py b/v1/moved.py")
    f = run(project, pristine_knobs=frozenset())[0]
    assert "names two files (v1/feature.py, v1/moved.py) but no rename or copy line" \
        in f.message
    edit(path, "diff --git a/v1/feature.py b/v1/moved.py\n",
         "diff --git a/v1/feature.py b/v1/moved.py\nsimilarity index 90%\n"
         "rename from v1/feature.py\nrename to v1/moved.py\n")
    edit(path, "+++ b/v1/feature.py", "+++ b/v1/moved.py")
    assert [x for x in run(project, pristine_knobs=frozenset()) if "diff --git" in x.message
            ] == []


def test_binary_diff(project: Path) -> None:
    path = project / "kvarn" / "kvarn-x.patch"
    path.write_text(
        path.read_text(encoding="utf-8")
        + "diff --git a/kernels/k.so b/kernels/k.so\nindex 1..2 100644\n"
        "Binary files a/kernels/k.so and b/kernels/k.so differ\n",
        encoding="utf-8",
    )
    f = only(run(project))
    assert (f.line, f.rule) == (line_of(path, "diff --git a/kernels/k.so"), "diff-hygiene")
    assert f.message == "kernels/k.so is a binary diff; GNU patch cannot apply it at fuzz 0."


def test_trailing_whitespace_on_an_added_line(project: Path) -> None:
    path = project / "kvarn" / "kvarn-x.patch"
    edit(path, "+        return 2\n", "+        return 2 \t\n")
    f = only(run(project))
    assert (f.line, f.rule) == (line_of(path, "return 2"), "diff-hygiene")
    assert f.message == "added line in v1/attention/kvarn.py has trailing whitespace."
    assert "git diff --check" in f.hint


def test_whitespace_on_context_and_removed_lines_is_not_ours(project: Path) -> None:
    path = project / "kvarn" / "kvarn-x.patch"
    edit(path, "-        return 1\n", "-        return 1  \n")
    assert run(project) == []


def test_space_before_tab_in_the_indent(project: Path) -> None:
    path = project / "kvarn" / "kvarn-x.patch"
    edit(path, "+        return 2\n", "+    \treturn 2\n")
    f = only(run(project))
    assert (f.line, f.rule) == (line_of(path, "return 2"), "diff-hygiene")
    assert f.message == "added line in v1/attention/kvarn.py has a space before a tab in its " \
        "indent."


def test_blank_lines_added_at_the_end_of_a_file(project: Path) -> None:
    path = project / "kvarn" / "kvarn-x.patch"
    path.write_text(
        path.read_text(encoding="utf-8")
        + "diff --git a/v1/tail.py b/v1/tail.py\n--- a/v1/tail.py\n+++ b/v1/tail.py\n"
        "@@ -9,1 +9,3 @@\n last = 1\n+\n+\n",
        encoding="utf-8",
    )
    f = only(run(project))
    assert (f.line, f.rule) == (line_of(path, "last = 1") + 1, "diff-hygiene")
    assert f.message == "the hunk adds blank lines at the end of v1/tail.py."


def test_hunk_counts_that_do_not_match(project: Path) -> None:
    path = project / "kvarn" / "kvarn-x.patch"
    edit(path, "@@ -5,3 +5,3 @@", "@@ -5,4 +5,3 @@")
    f = only(run(project))
    assert (f.line, f.rule) == (line_of(path, "@@ -5,4"), "diff-hygiene")
    assert f.message == "hunk header says -4 +3 lines but the hunk has -3 +3."
    assert "qwen38build export" in f.hint


def test_hunk_that_counts_too_few_lines(project: Path) -> None:
    path = project / "kvarn" / "kvarn-x.patch"
    edit(path, "@@ -5,3 +5,3 @@", "@@ -5,2 +5,2 @@")
    f = only(run(project))
    assert (f.line, f.rule) == (line_of(path, "@@ -5,2"), "diff-hygiene")
    assert "goes on past them" in f.message


def test_crlf_added_to_an_lf_file(project: Path) -> None:
    path = project / "kvarn" / "kvarn-x.patch"
    edit(path, "+        return 2\n", "+        return 2\r\n")
    f = only(run(project))
    assert (f.line, f.rule) == (line_of(path, "return 2"), "diff-hygiene")
    assert f.message == "added line in v1/attention/kvarn.py ends with CRLF, but the file has " \
        "LF line endings."


def test_crlf_in_a_crlf_file_is_fine(project: Path) -> None:
    path = project / "kvarn" / "kvarn-x.patch"
    for old in ("     def a(self):\n", "-        return 1\n", "+        return 2\n",
                "     def b(self):\n"):
        edit(path, old, old.replace("\n", "\r\n"))
    assert run(project) == []


def test_unreadable_patch_file(project: Path) -> None:
    path = project / "kvarn" / "kvarn-x.patch"
    path.write_bytes(b"\xff\xfe not utf-8\n")
    f = only(run(project))
    assert (f.file, f.line, f.rule) == (Path("kvarn/kvarn-x.patch"), 1, "diff-hygiene")
    assert "cannot read the patch file" in f.message


# -- provenance --------------------------------------------------------------------------


def test_fa2_undeclared_commit_and_no_diff_is_fine(project: Path) -> None:
    (project / "fa2" / "README.md").unlink()
    assert run(project) == []


def test_fa2_readme_must_name_the_pinned_commit(project: Path) -> None:
    """The commit is [sources.<fa2.source>]'s: the README beside the diff must name it and
    its repository, once the diff exists (before, FA2 is declared and nothing is checked)."""
    (project / "fa2" / "fp8-kv.diff").write_text("diff\n", encoding="utf-8")
    f = only(run(project))
    assert (f.file, f.line, f.rule) == (Path("fa2/README.md"), 1, "provenance")
    assert f.message == "fa2/README.md does not name commit " \
        "0123456789abcdef0123456789abcdef01234567, the one [sources.flash-attention] pins."
    readme = project / "fa2" / "README.md"
    readme.write_text(readme.read_text(encoding="utf-8") + "Commit 0123456789ab.\n",
                      encoding="utf-8")
    assert run(project) == []
    readme.write_text("Commit 0123456789ab.\n", encoding="utf-8")
    f = only(run(project))
    assert "does not name the repository https://github.com/vllm-project/flash-attention" \
        in f.message
    readme.unlink()
    f = only(run(project))
    assert "fa2/README.md is missing" in f.message


def test_pthfa_pin_names_another_tag(project: Path) -> None:
    (project / "pthfa" / "PIN").write_text("v0.0.9\n", encoding="utf-8")
    f = only(run(project))
    assert (f.file, f.line, f.rule) == (Path("pthfa/PIN"), 1, "provenance")
    assert f.message == "pthfa/PIN names 'v0.0.9' but recipe.toml pins pthfa tag 'v0.1.0'."


def test_pthfa_pin_missing(project: Path) -> None:
    (project / "pthfa" / "PIN").unlink()
    f = only(run(project))
    assert (f.file, f.line, f.rule) == (Path("pthfa/PIN"), 1, "provenance")
    assert f.hint == "write v0.1.0 on the first line of pthfa/PIN"


def test_pthfa_manifest_names_changed_missing_and_extra_files(project: Path) -> None:
    pthfa = project / "pthfa"
    (pthfa / "csrc" / "b.cu").write_text("// b\n", encoding="utf-8")
    (pthfa / "csrc" / "c.cu").write_text("// c\n", encoding="utf-8")
    write_manifest(pthfa)
    (pthfa / "csrc" / "a.cu").write_text("// edited by hand\n", encoding="utf-8")
    (pthfa / "csrc" / "b.cu").unlink()
    (pthfa / "csrc" / "new.cuh").write_text("// new\n", encoding="utf-8")
    manifest = pthfa / "MANIFEST"
    findings = run(project)
    assert [(f.file, f.line, f.rule) for f in findings] == [
        (Path("pthfa/MANIFEST"), line_of(manifest, "csrc/a.cu"), "provenance"),
        (Path("pthfa/MANIFEST"), line_of(manifest, "csrc/b.cu"), "provenance"),
        (Path("pthfa/MANIFEST"), 5, "provenance"),
    ]
    assert "pthfa/csrc/a.cu has sha256" in findings[0].message
    assert "the vendored file changed" in findings[0].message
    assert findings[1].message == "pthfa/MANIFEST lists csrc/b.cu, which is missing from pthfa/."
    assert findings[2].message == "pthfa/csrc/new.cuh is not listed in pthfa/MANIFEST."
    assert "regenerate pthfa/MANIFEST" in findings[2].hint


def test_pthfa_manifest_missing_or_malformed(project: Path) -> None:
    manifest = project / "pthfa" / "MANIFEST"
    manifest.write_text("not a line\n" + manifest.read_text(encoding="utf-8"),
                        encoding="utf-8")
    f = only(run(project))
    assert (f.file, f.line) == (Path("pthfa/MANIFEST"), 1)
    assert f.message == "pthfa/MANIFEST line 1 is not '<sha256>  <path>'."
    manifest.unlink()
    f = only(run(project))
    assert f.message == "pthfa/MANIFEST is missing; nothing checks the vendored files."


def test_vendored_files_skip_ignored_build_output(project: Path) -> None:
    assert vendored_files(project / "pthfa") == [".gitignore", "csrc/a.cu"]


# -- the project itself ------------------------------------------------------------------


def find_wheel() -> Path | None:
    """The pinned vLLM wheel, where a test run or the build left one."""
    candidates = [
        Path(os.environ.get("QWEN38_VLLM_WHEEL", "/nonexistent")),
        *Path(os.environ["QWEN38BUILD_STORE"], "objects").glob(f"*/{WHEEL}"),
    ]
    return next((c for c in candidates if c.is_file()), None)


def test_project_series_passes_every_rule() -> None:
    loaded = load_for_lint(REPO / "recipe.toml")
    wheel = find_wheel()
    findings = check(loaded, pristine_envs=wheel)
    if wheel is None:
        unread = [f for f in findings if "Pristine envs.py was not read" in f.message]
        rest = [f for f in findings if f not in unread]
        assert rest == [], "\n".join(f"{f}\n  hint: {f.hint}" for f in rest)
        if unread:
            pytest.skip(f"{len(unread)} knob reads need pristine envs.py to clear; "
                        f"set QWEN38_VLLM_WHEEL to the {WHEEL}")
    assert findings == [], "\n".join(f"{f}\n  hint: {f.hint}" for f in findings)


CASES = Path(__file__).resolve().parent / "lint_cases"


@pytest.mark.parametrize("case", sorted(p.name for p in CASES.iterdir() if p.is_dir()))
def test_scenario_report_matches_its_transcript(case: str) -> None:
    """Each scenario's report (finding and hint lines) is the one in its expected.txt."""
    folder = CASES / case
    findings = check(load_for_lint(folder / "recipe.toml"),
                     pristine_knobs=frozenset({"VLLM_HOST_IP"}))
    report = "".join(f"{f}\n  hint: {f.hint}\n" for f in findings)
    assert report == (folder / "expected.txt").read_text(encoding="utf-8")
