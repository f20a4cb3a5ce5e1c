"""The topic workspace: series → commits → patch files, byte for byte."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from qwen38build.errors import InputError
from qwen38build.inputs import recipe
from qwen38build.series.patchfile import PatchFile
from qwen38build.store.store import Store
from qwen38build.workspace import gitrepo, workspace
from tests.bump_fixtures import PIN, Project, make_project, make_wheel, numbered

REPO = Path(__file__).resolve().parents[1]
A, B = numbered("a"), numbered("b")


@pytest.fixture
def proj(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Project:
    files: dict[str, str | bytes] = {
        "__init__.py": "",
        "a.py": A,
        "sub/b.py": B,
        "configs/x.json": "{}\n",
        "_C.abi3.so": b"\x7fELF\x00\x01binary",
    }
    wheel = make_wheel(tmp_path / "wheels", PIN, files)
    p = make_project(tmp_path, wheel, ["alpha", "beta"], kvarn=["gamma"])
    a1 = A.replace("a line 10\n", "a line 10 alpha\n")
    p.patch("patches", "alpha", [("a.py", A, a1)])
    p.patch("patches", "beta", [("sub/b.py", B, B.replace("b line 5\n", "b line 5 beta\n")),
                                ("new.py", None, "created = True\n")])
    p.patch("kvarn", "gamma", [("a.py", a1, a1.replace("a line 25\n", "a line 25 gamma\n"))])
    monkeypatch.setenv("QWEN38BUILD_SOURCES", str(p.wheels))
    return p


def subjects(repo: Path) -> list[str]:
    return gitrepo.git(repo, "log", "--reverse", "--format=%s").splitlines()


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.patch"))}


def test_create_commits_pristine_then_one_commit_per_topic(proj: Project, tmp_path: Path) -> None:
    repo = workspace.create(proj.loaded(), proj.store, tmp_path / "ws")
    assert subjects(repo) == [
        f"vllm {PIN} (pristine)", "[qwen38] alpha", "[qwen38] beta", "[qwen38] kvarn/gamma",
    ]
    pristine = gitrepo.git(repo, "ls-tree", "-r", "--name-only", f"v{PIN}").split()
    # text members only: the compiled library stays out
    assert pristine == ["vllm/__init__.py", "vllm/a.py", "vllm/configs/x.json", "vllm/sub/b.py"]
    body = gitrepo.git(repo, "log", "-1", "--format=%B", "HEAD~2")
    assert body.startswith("[qwen38] alpha\n\nWhy alpha is right")
    assert "# a line that starts like a comment" in body
    assert "Retires-when: upstream PR" in body
    assert (repo / "vllm" / "a.py").read_text().count("gamma") == 1
    assert not gitrepo.git(repo, "status", "--porcelain")


def test_same_series_gives_same_commit_ids(proj: Project, tmp_path: Path) -> None:
    one = workspace.create(proj.loaded(), proj.store, tmp_path / "one")
    two = workspace.create(proj.loaded(), proj.store, tmp_path / "two")
    assert gitrepo.git(one, "rev-parse", "HEAD") == gitrepo.git(two, "rev-parse", "HEAD")


def test_round_trip_is_byte_identical(proj: Project, tmp_path: Path) -> None:
    before = snapshot(proj.root)
    repo = workspace.create(proj.loaded(), proj.store, tmp_path / "ws")
    assert workspace.export(proj.loaded(), repo, check=True) == []
    assert workspace.export(proj.loaded(), repo) == []
    assert snapshot(proj.root) == before


def test_create_refuses_a_directory_that_is_not_empty(proj: Project, tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "x").write_text("")
    with pytest.raises(InputError, match="not empty"):
        workspace.create(proj.loaded(), proj.store, tmp_path / "ws")


def commit_all(repo: Path, subject: str) -> str:
    gitrepo.git(repo, "add", "-A")
    gitrepo.git(repo, "commit", "-q", "-m", subject)
    return gitrepo.git(repo, "rev-parse", "HEAD").strip()


def test_edited_topic_is_exported_with_its_new_commit(proj: Project, tmp_path: Path) -> None:
    repo = workspace.create(proj.loaded(), proj.store, tmp_path / "ws")
    loaded = proj.loaded()
    # amend the last topic (kvarn/gamma): change its diff and its prose
    p = repo / "vllm" / "a.py"
    p.write_text(p.read_text().replace("a line 25 gamma", "a line 25 gamma v2"))
    gitrepo.git(repo, "add", "-A")
    msg = gitrepo.git(repo, "log", "-1", "--format=%B").replace("Why gamma", "Why gamma, v2,")
    gitrepo.git(repo, "commit", "-q", "--amend", "--cleanup=verbatim", "-F", "-", stdin=msg)
    head = gitrepo.git(repo, "rev-parse", "HEAD").strip()
    gamma = proj.root / "kvarn" / "gamma.patch"
    assert workspace.export(loaded, repo, check=True) == [gamma]
    assert workspace.export(loaded, repo) == [gamma]
    pf = PatchFile.parse(gamma)
    assert pf.marker_commit == head and pf.marker_topic == "gamma"
    assert pf.prose.startswith("Why gamma, v2, is right")
    assert "+a line 25 gamma v2" in pf.diff
    # the others keep their bytes, marker included
    assert PatchFile.parse(proj.root / "patches" / "alpha.patch").marker_commit == "ab" * 20
    assert workspace.export(loaded, repo, check=True) == []


def test_a_topic_committed_with_a_subject_alone_keeps_its_prose_and_headers(
        proj: Project, tmp_path: Path) -> None:
    """``git commit --amend -m "[qwen38] gamma"`` (a subject, no body): export keeps the
    file's prose and header block and writes the new diff; before, it wrote the file with
    neither, and the topic's prose and ledger row were lost."""
    repo = workspace.create(proj.loaded(), proj.store, tmp_path / "ws")
    gamma = proj.root / "kvarn" / "gamma.patch"
    before = PatchFile.parse(gamma)
    p = repo / "vllm" / "a.py"
    p.write_text(p.read_text().replace("a line 25 gamma", "a line 25 gamma v3"))
    gitrepo.git(repo, "add", "-A")
    gitrepo.git(repo, "commit", "-q", "--amend", "-m", "[qwen38] kvarn/gamma")
    assert workspace.export(proj.loaded(), repo) == [gamma]
    after = PatchFile.parse(gamma)
    assert after.prose == before.prose and after.headers == before.headers
    assert "+a line 25 gamma v3" in after.diff


def test_fixup_commit_folds_into_its_topic(proj: Project, tmp_path: Path) -> None:
    repo = workspace.create(proj.loaded(), proj.store, tmp_path / "ws")
    b = repo / "vllm" / "sub" / "b.py"
    b.write_text(b.read_text().replace("b line 20\n", "b line 20 fixed later\n"))
    commit_all(repo, "fixup! [qwen38] beta")  # after kvarn/gamma: not adjacent to its topic
    beta, gamma = proj.root / "patches" / "beta.patch", proj.root / "kvarn" / "gamma.patch"
    gamma_before = gamma.read_bytes()
    assert workspace.export(proj.loaded(), repo, ["beta"]) == [beta]
    text = beta.read_text()
    assert "+b line 20 fixed later" in text and "+b line 5 beta" in text
    assert gamma.read_bytes() == gamma_before
    assert workspace.export(proj.loaded(), repo, check=True) == []
    # the exported series builds the same tree as the workspace
    fresh = workspace.create(proj.loaded(), proj.store, tmp_path / "fresh")
    assert (fresh / "vllm" / "sub" / "b.py").read_text() == b.read_text()


def test_export_writes_the_finished_topics_and_names_the_unfinished(
        proj: Project, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from qwen38build.cli import main

    repo = workspace.create(proj.loaded(), proj.store, tmp_path / "ws")
    gitrepo.git(repo, "reset", "-q", "--hard", "HEAD~2")  # beta and gamma not done yet
    p = repo / "vllm" / "a.py"
    p.write_text(p.read_text().replace("a line 10 alpha", "a line 10 alpha v2"))
    gitrepo.git(repo, "commit", "-q", "-a", "--amend", "--no-edit")
    before = snapshot(proj.root)
    argv = ["--recipe", str(proj.root / "recipe.toml"), "--store", str(proj.store_root),
            "export", str(repo)]
    assert main([*argv, "--check"]) == 1
    err = capsys.readouterr().err
    assert "patches/alpha.patch" in err and snapshot(proj.root) == before
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert out == "wrote patches/alpha.patch\n"
    assert "+a line 10 alpha v2" in PatchFile.parse(proj.root / "patches" / "alpha.patch").diff
    assert "no commit in" in err and "beta, kvarn/gamma" in err
    assert "fresh" not in err and "throw" not in err
    after = snapshot(proj.root)
    assert {k for k in after if after[k] != before[k]} == {"patches/alpha.patch"}
    assert main([*argv, "--check"]) == 1  # alpha agrees now; the two are still unfinished
    err = capsys.readouterr().err
    assert "disagree" not in err and "beta, kvarn/gamma" in err
    assert main([*argv, "alpha", "--check"]) == 0
    assert "every patch file matches" in capsys.readouterr().out


def test_commit_naming_no_topic_is_an_error_naming_it(proj: Project, tmp_path: Path) -> None:
    repo = workspace.create(proj.loaded(), proj.store, tmp_path / "ws")
    (repo / "vllm" / "a.py").write_text("stray\n")
    sha = commit_all(repo, "wip: try something")
    with pytest.raises(InputError, match=sha[:12]) as err:
        workspace.export(proj.loaded(), repo)
    assert "wip: try something" in str(err.value)


def test_fixup_for_unknown_topic_is_an_error(proj: Project, tmp_path: Path) -> None:
    repo = workspace.create(proj.loaded(), proj.store, tmp_path / "ws")
    (repo / "vllm" / "a.py").write_text("stray\n")
    sha = commit_all(repo, "fixup! [qwen38] nonesuch")
    with pytest.raises(InputError, match=sha[:12]):
        workspace.export(proj.loaded(), repo, check=True)


def test_unknown_topic_argument_is_an_error(proj: Project, tmp_path: Path) -> None:
    repo = workspace.create(proj.loaded(), proj.store, tmp_path / "ws")
    with pytest.raises(InputError, match="no topic nonesuch"):
        workspace.export(proj.loaded(), repo, ["nonesuch"])


@pytest.mark.e2e
def test_real_series_round_trip_is_byte_identical(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """create + export on the project's whole series changes no byte of any patch file."""
    project = tmp_path / "proj"
    project.mkdir()
    shutil.copy(REPO / "recipe.toml", project)
    shutil.copytree(REPO / "lock", project / "lock")
    for group in recipe.load(REPO / "recipe.toml").recipe.series.groups:
        shutil.copytree(REPO / group.dir, project / group.dir)
    loaded = recipe.load(project / "recipe.toml")
    before = snapshot(project)
    sources = [d for d in ("/tmp/wh", "/tmp/wh33") if Path(d).is_dir()]
    if sources:
        monkeypatch.setenv("QWEN38BUILD_SOURCES", ":".join(sources))
    from qwen38build.store.store import default_root

    repo = workspace.create(loaded, Store(default_root()), tmp_path / "ws")
    assert workspace.export(loaded, repo, check=True) == []
    assert workspace.export(loaded, repo) == []
    assert snapshot(project) == before
