"""Who is using the store right now: per-digest locks, temporary roots, owned temp space.

Nix's protocol, with flock(2), whose locks die with their process (a SIGKILL included):

- ``gc.lock``: gc holds it exclusively while it decides and moves dead entries aside; a
  process takes it shared only for the moment it creates its session or adds digests to
  its temporary roots. So a digest added before a lookup is never collected after it, and
  gc never sees half a registration.
- ``temproots/<id>``: one file per live session, flocked by its owner for its lifetime,
  listing the digests it has made or is using. A file nobody holds belongs to a dead process.
- ``tmp/<id>.<label>.<random>``: work dirs of session ``<id>``; removed by anyone (gc or
  the next build) once that session's temproot is unlocked or gone.
- ``locks/<digest>.lock``: one builder per digest. The file is unlinked under the lock
  when released, and an acquirer checks the inode it locked is still the file's, so no
  lock file outlives its step.

Standard library only: the no-op build takes a temporary root for the build it links.
"""

from __future__ import annotations

import _thread  # not threading: this module is on the no-op path, _thread is built in
import contextlib
import fcntl
import os
from pathlib import Path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

GC_LOCK = "gc.lock"
TEMPROOTS = "temproots"


@contextlib.contextmanager
def flocked(path: Path, *, shared: bool = False) -> Iterator[None]:
    """Hold flock on the long-lived file ``path`` (created if missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def digest_lock(path: Path) -> Iterator[None]:
    """Exclusive lock on ``path`` that leaves no file behind once released."""
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # its holder unlinked it while we waited: lock the new one
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)


@contextlib.contextmanager
def try_digest_lock(path: Path) -> Iterator[bool]:
    """Like digest_lock, without waiting: yields False (holding nothing) if it is taken."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            got = os.stat(path).st_ino == os.fstat(fd).st_ino
        except (BlockingIOError, FileNotFoundError):
            got = False
        try:
            yield got
        finally:
            if got:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
    finally:
        os.close(fd)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def drop_dead_temps(folder: Path, prefix: str = ".") -> None:
    """Remove ``.<name>.<pid>.<random>.tmp`` files (atomic writes) of dead processes."""
    if not folder.is_dir():
        return
    for p in folder.iterdir():
        parts = p.name.split(".")
        if p.name.startswith(prefix) and parts[-1] == "tmp" and len(parts) >= 5 and \
                parts[-3].isdigit() and not pid_alive(int(parts[-3])):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()


def is_held(path: Path) -> bool:
    """True if some live process holds flock on ``path`` (ours included)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


class Session:
    """This process's temporary roots in one store, and the owner of its temp dirs."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.id = f"{os.getpid()}-{os.urandom(4).hex()}"
        self.path = root / TEMPROOTS / self.id
        self.digests: set[str] = set()
        self.depth = 0
        self.cleaned = False  # dead sessions' tmp/ work removed once per session
        self._mutex = _thread.allocate_lock()
        with flocked(root / GC_LOCK, shared=True):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND,
                              0o644)
            fcntl.flock(self.fd, fcntl.LOCK_EX)

    def add(self, digests: Iterable[str]) -> None:
        """Make ``digests`` roots for as long as this session lives (before using them)."""
        with self._mutex:
            new = sorted(set(digests) - self.digests)
            if not new:
                return
            with flocked(self.root / GC_LOCK, shared=True):
                os.write(self.fd, "".join(f"{d}\n" for d in new).encode())
            self.digests.update(new)

    def close(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        os.close(self.fd)


_SESSIONS: dict[str, Session] = {}
_GUARD = _thread.allocate_lock()


@contextlib.contextmanager
def hold(root: Path) -> Iterator[Session]:
    """This process's session in the store at ``root``, for the ``with`` block.

    Reentrant: nested holds share one session, released when the outermost one ends.
    """
    key = os.path.abspath(root)
    with _GUARD:
        session = _SESSIONS.get(key)
        if session is None:
            session = _SESSIONS[key] = Session(root)
        session.depth += 1
    try:
        yield session
    finally:
        with _GUARD:
            session.depth -= 1
            if session.depth == 0:
                del _SESSIONS[key]
                session.close()


def live_sessions(root: Path) -> dict[str, set[str]]:
    """Live sessions by id with their temporary roots; dead ones' files are removed.

    Call with ``gc.lock`` held exclusively, so no session is half made or half written.
    """
    out: dict[str, set[str]] = {}
    folder = root / TEMPROOTS
    if not folder.is_dir():
        return out
    for p in sorted(folder.iterdir()):
        if not is_held(p):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
            continue
        try:
            text = p.read_text()
        except (OSError, UnicodeDecodeError):
            text = ""
        out[p.name] = {line for line in text.split() if line}
    return out


def has_dead(root: Path) -> bool:
    """True if a temproot file of a dead session is left (cheap: no store lock)."""
    folder = root / TEMPROOTS
    return folder.is_dir() and any(not is_held(p) for p in folder.iterdir())


def drop_stale_locks(locks: Path) -> list[str]:
    """Remove digest lock files their (killed) holders left; each taken as a lock first."""
    gone: list[str] = []
    if not locks.is_dir():
        return gone
    for p in sorted(locks.iterdir()):
        try:
            fd = os.open(p, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.stat(p).st_ino == os.fstat(fd).st_ino:
                os.unlink(p)  # as a holder releasing it would: waiters re-check the inode
                gone.append(p.name)
        except (BlockingIOError, FileNotFoundError):
            pass
        finally:
            os.close(fd)
    return gone


def owner_of(tmp_name: str) -> str:
    """The session id a ``tmp/`` entry belongs to."""
    return tmp_name.split(".", 1)[0]


def dead_tmp(root: Path, tmp: Path) -> list[Path]:
    """``tmp/`` entries whose owning session is no longer alive."""
    if not tmp.is_dir():
        return []
    folder = root / TEMPROOTS
    return [p for p in sorted(tmp.iterdir()) if not is_held(folder / owner_of(p.name))]
