"""Fixed-output source trees: the hash is of the tree's content, not of an archive, and no
archive can write outside the tree or pass with another tree's bytes."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import threading
from collections.abc import Callable, Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from qwen38build.errors import FetchError, InputError
from qwen38build.trees.archive import unpack
from qwen38build.trees.obtain import TreeRequest, obtain
from qwen38build.trees.treehash import tree_hash

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
           "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z", "PATH": os.environ["PATH"]}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], env={**GIT_ENV, "HOME": str(repo)},
                          check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, str]:
    """A repository with sources, an executable, a link and files outside the paths used."""
    r = tmp_path / "flash-attention"
    (r / "csrc" / "src").mkdir(parents=True)
    (r / "csrc" / "src" / "kernel.h").write_text("// kernel\n")
    (r / "csrc" / "src" / "gen.py").write_text("print(1)\n")
    (r / "csrc" / "src" / "gen.py").chmod(0o755)
    os.symlink("kernel.h", r / "csrc" / "src" / "alias.h")
    (r / "docs").mkdir()
    (r / "docs" / "big.md").write_text("not used\n")
    (r / "LICENSE").write_text("BSD\n")
    git(r, "init", "-q")
    git(r, "add", "-A")
    git(r, "commit", "-qm", "x")
    return r, git(r, "rev-parse", "HEAD")


PATHS = ("csrc/src", "LICENSE")


def archive(repo: Path, commit: str, dest: Path, fmt: str, *paths: str) -> Path:
    out = dest / f"{repo.name}-{commit[:8]}.{fmt}"
    dest.mkdir(parents=True, exist_ok=True)
    git(repo, "archive", f"--format={fmt}", f"--prefix={repo.name}-{commit}/", "-o", str(out),
        commit, *paths)
    return out


def test_one_hash_whatever_the_route(repo: tuple[Path, str], tmp_path: Path) -> None:
    """A sparse ``git archive`` (as the mirror's), the origin's whole-repository tar.gz and a
    zip give one hash over the paths used; the checkout itself does too."""
    r, commit = repo
    hashes = set()
    for n, (fmt, paths) in enumerate([("tar", PATHS), ("tar.gz", ()), ("zip", ())]):
        tree = tmp_path / f"t{n}"
        unpack(archive(r, commit, tmp_path / f"a{n}", fmt, *paths), tree, PATHS)
        hashes.add(tree_hash(tree))
        assert (tree / "csrc" / "src" / "alias.h").is_symlink()
        assert os.access(tree / "csrc" / "src" / "gen.py", os.X_OK)
        assert not (tree / "docs").exists()
    hashes.add(tree_hash(r, PATHS))
    assert len(hashes) == 1


def test_the_hash_sees_bytes_modes_links_and_names(repo: tuple[Path, str]) -> None:
    r, _ = repo
    base = tree_hash(r, PATHS)
    src = r / "csrc" / "src"

    def relink() -> None:
        (src / "alias.h").unlink()
        os.symlink("gen.py", src / "alias.h")

    changes: list[Callable[[], object]] = [
        lambda: (r / "LICENSE").write_text("BSD.\n"),
        lambda: (src / "gen.py").chmod(0o644),
        relink,
        lambda: (src / "kernel.h").rename(src / "kernel2.h"),
    ]
    seen = {base}
    for change in changes:
        change()
        h = tree_hash(r, PATHS)
        assert h not in seen
        seen.add(h)
    (r / "docs" / "big.md").write_text("outside the paths: no change\n")
    assert tree_hash(r, PATHS) in seen


def _tar(dest: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    with tarfile.open(dest, "w") as tf:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            tf.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return dest


def _file(name: str) -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), b"x"


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, b""


@pytest.mark.parametrize("members, why", [
    ([_file("top/ok"), _file("top/../../evil")], "outside the tree"),
    ([_file("/etc/evil")], "outside the tree"),
    ([_file("top/ok"), _link("top/l", "/etc/passwd")], "a link out of the tree"),
    ([_file("top/ok"), _link("top/l", "../../x")], "a link out of the tree"),
    # each link looks inside on its own; through the first, the second leaves the tree
    ([_link("top/d/up", ".."), _link("top/d/up/out", "../..")], "a link out of the tree"),
    ([_link("top/d/up", ".."), _link("top/d/up/x", ".."), _file("top/d/up/x/y")],
     "a link out of the tree"),
    ([_file("top/ok"), _link("top/h", "top/ok", tarfile.LNKTYPE)], "a hard link"),
    ([_file("top/a"), _file("other/b")], "beside the archive's one top folder"),
    ([_file("top/a"), _file("top/a")], "in the archive twice"),
])
def test_unsafe_archives_are_refused_and_leave_nothing(
        tmp_path: Path, members: list[tuple[tarfile.TarInfo, bytes]], why: str) -> None:
    bad = _tar(tmp_path / "bad.tar", members)
    dest = tmp_path / "tree"
    with pytest.raises(InputError) as exc:
        unpack(bad, dest)
    assert why in exc.value.message and "bad.tar" in exc.value.message
    assert not dest.exists()
    assert not (tmp_path / "evil").exists() and not (tmp_path / "x").exists()


def _request(commit: str, want: str | None, archive_url: str | None = None) -> TreeRequest:
    return TreeRequest("fa", "https://example.invalid/fa", commit, PATHS, archive_url, want)


def test_a_mirror_candidate_with_other_bytes_is_passed_over(
        repo: tuple[Path, str], tmp_path: Path) -> None:
    r, commit = repo
    good = tree_hash(r, PATHS)
    mirror = tmp_path / "mirror"
    archive(r, commit, mirror, "tar.gz")
    # an unpacked copy named for the commit, one byte off: tried first (name order), refused
    forged = mirror / f"a-forged-{commit[:8]}"
    (forged / "csrc" / "src").mkdir(parents=True)
    (forged / "csrc" / "src" / "kernel.h").write_text("// evil\n")
    work = tmp_path / "work"
    work.mkdir()
    got = obtain(_request(commit, good), [tmp_path / "absent", mirror], work, offline=True)
    assert got.tree_sha256 == good and got.origin.endswith(".tar.gz")
    assert (got.path / "csrc" / "src" / "kernel.h").read_text() == "// kernel\n"


def test_offline_without_a_mirror_says_where_it_looked(repo: tuple[Path, str],
                                                      tmp_path: Path) -> None:
    _, commit = repo
    with pytest.raises(FetchError) as exc:
        obtain(_request(commit, "0" * 64), [tmp_path], tmp_path, offline=True)
    assert "offline mode forbids the origin" in exc.value.message
    assert f"no mirror holds {commit[:8]}" in exc.value.message


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A real HTTP server over a folder, as an origin serving archives."""
    root = tmp_path / "origin"
    root.mkdir()
    handler = partial(SimpleHTTPRequestHandler, directory=str(root))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_origin_is_asked_when_no_mirror_has_it_and_checked(
        repo: tuple[Path, str], tmp_path: Path, served: tuple[Path, str]) -> None:
    r, commit = repo
    root, url = served
    archive(r, commit, root, "tar.gz").rename(root / f"{commit}.tar.gz")
    route = url + "/{commit}.tar.gz"  # the recipe's `archive`, {commit} filled in
    work = tmp_path / "w1"
    work.mkdir()
    got = obtain(_request(commit, tree_hash(r, PATHS), route), [], work, offline=False)
    assert got.origin == f"{url}/{commit}.tar.gz"
    assert (got.path / "LICENSE").read_text() == "BSD\n"
    work = tmp_path / "w2"
    work.mkdir()
    with pytest.raises(FetchError) as exc:
        obtain(_request(commit, "f" * 64, route), [], work, offline=False)
    assert "not the lock's" in exc.value.message and "nothing was kept" in exc.value.message
    assert list(work.iterdir()) == []


def test_an_unreachable_origin_names_the_missing_mirror_too(
        repo: tuple[Path, str], tmp_path: Path) -> None:
    """A machine without the mirror folder and without the origin: the error says the mirror
    is missing, not only that the network failed (a checkout away from ../shared)."""
    import socket

    _, commit = repo
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    route = f"http://127.0.0.1:{port}/fa/{{commit}}.tar.gz"
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(FetchError) as exc:
        obtain(_request(commit, "f" * 64, route), [tmp_path / "shared-sources"], work,
               offline=False)
    assert f"{tmp_path / 'shared-sources'} (missing)" in exc.value.message
    assert "cannot fetch http://127.0.0.1" in exc.value.message
    assert list(work.iterdir()) == []
