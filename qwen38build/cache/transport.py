"""The cache protocol's transport: GET, HEAD and PUT of files under a URL prefix.

Plain ``http.client`` with three deadlines on every request: the connect and each read or
write within ``timeout``, and the whole exchange (headers included) within a deadline of its
own: ``timeout`` for a record or a HEAD, ``timeout + size / MIN_RATE`` for a file of a
declared size. A cache that is down, stalls or trickles a byte at a time costs at most that
long. Every transport failure (refused, timed out, reset, a
5xx, a redirect, a body shorter than announced) becomes one :class:`CacheError` here, the
one seam where foreign errors are translated. A 404 is an answer, not a failure. No
redirects are followed and no proxy variables are read: the URL names the server.

Credentials are scoped: ``$QWEN38BUILD_CACHE_AUTH`` holds ``URL=VALUE`` entries (one per
line), and VALUE is sent as the ``Authorization`` header only to requests under that URL
(same scheme, host, port and path prefix), never to another cache.
"""

from __future__ import annotations

import http.client
import io
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol
from urllib.parse import quote, urlsplit

from qwen38build.errors import CacheError

ENV_AUTH = "QWEN38BUILD_CACHE_AUTH"
BLOCK = 1 << 20
MIN_RATE = 1 << 20  # bytes per second: a transfer slower than this overall is abandoned


class Readable(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...


def join(base: str, *parts: str) -> str:
    """``base/part/...`` with each part percent-quoted (its slashes kept)."""
    return "/".join([base.rstrip("/"), *(quote(p, safe="/") for p in parts)])


class Overdue(TimeoutError):
    """The whole-transfer deadline passed (each read may have been prompt)."""


def budget(timeout: float, size: int = 0) -> float:
    """Seconds a whole exchange of ``size`` declared bytes may take."""
    return timeout + max(size, 0) / MIN_RATE


class _Reader(io.RawIOBase):
    """The socket's read side for http.client: each read waits at most the per-read timeout
    and never past the deadline."""

    def __init__(self, owner: _DeadlineSocket) -> None:
        self.owner = owner
        # The socket's own raw file: it keeps the descriptor open after the connection is
        # closed (http.client closes it early on a Connection: close answer).
        self.raw = owner.sock.makefile("rb", buffering=0)

    def readable(self) -> bool:
        return True

    def readinto(self, b: memoryview | bytearray) -> int:  # type: ignore[override]
        self.owner.arm()
        try:
            return self.raw.readinto(b) or 0  # None only on a non-blocking socket
        except TimeoutError as exc:
            self.owner.overdue(exc)
            raise

    def close(self) -> None:
        self.raw.close()
        super().close()


class _DeadlineSocket:
    """A connected socket whose every read and write is bounded by ``min(timeout, the time
    left before the deadline)``. http.client reads through :meth:`makefile`."""

    def __init__(self, sock: socket.socket, timeout: float, deadline: float,
                 seconds: float) -> None:
        self.sock, self.timeout, self.deadline, self.seconds = sock, timeout, deadline, seconds

    def arm(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise Overdue(f"not received within {self.seconds:g}s")
        self.sock.settimeout(min(self.timeout, left))

    def overdue(self, exc: TimeoutError) -> None:
        if time.monotonic() >= self.deadline:
            raise Overdue(f"not received within {self.seconds:g}s") from exc

    def makefile(self, mode: str = "r", *args: object, **kwargs: object) -> io.BufferedReader:
        assert mode == "rb", mode
        return io.BufferedReader(_Reader(self), BLOCK)

    def sendall(self, data: bytes | memoryview) -> None:
        self.arm()
        try:
            self.sock.sendall(data)
        except TimeoutError as exc:
            self.overdue(exc)
            raise

    def close(self) -> None:
        self.sock.close()

    def __getattr__(self, name: str) -> object:
        return getattr(self.sock, name)


@contextmanager
def _connection(url: str, timeout: float, seconds: float
                ) -> Iterator[tuple[http.client.HTTPConnection, str]]:
    """A connection to ``url``'s server, connected within ``timeout``, whose whole exchange
    must end within ``seconds`` of now; closed when the block ends."""
    deadline = time.monotonic() + seconds
    parts = urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    try:
        conn = cls(parts.netloc, timeout=min(timeout, seconds), blocksize=BLOCK)
    except (ValueError, http.client.HTTPException) as exc:  # a bad port, say
        raise CacheError(f"{url}: not a usable URL: {exc}") from exc
    try:
        try:
            conn.connect()
        except (OSError, http.client.HTTPException) as exc:
            raise _failure(url, exc) from exc
        assert conn.sock is not None
        conn.sock = _DeadlineSocket(conn.sock, timeout, deadline, seconds)
        yield conn, parts.path or "/"
    finally:
        conn.close()


def credentials(text: str | None = None) -> list[tuple[str, str]]:
    """(URL prefix, header value) of each ``URL=VALUE`` line of ``$QWEN38BUILD_CACHE_AUTH``;
    UsageError (before any request) for a line that names no http(s) URL."""
    from qwen38build.errors import UsageError

    raw = os.environ.get(ENV_AUTH, "") if text is None else text
    out: list[tuple[str, str]] = []
    for n, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        url, sep, value = line.strip().partition("=")
        parts = urlsplit(url) if sep else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.netloc \
                or not value.strip():
            raise UsageError(
                f"${ENV_AUTH}: line {n} is not URL=VALUE: credentials are given per cache, "
                "so none reaches another.",
                hint=f"set {ENV_AUTH}='https://cache.example.org/q38=Bearer TOKEN' (one line "
                "per cache)")
        out.append((url.rstrip("/"), value.strip()))
    return out


def _scope(url: str) -> tuple[str, str, str]:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, f"{parts.hostname}:{port}", parts.path.rstrip("/")


def auth_for(url: str) -> str | None:
    """The credential of the longest URL prefix that ``url`` falls under, if any."""
    scheme, host, path = _scope(url)
    best: tuple[int, str] | None = None
    for prefix, value in credentials():
        s, h, p = _scope(prefix)
        if (s, h) == (scheme, host) and (path == p or path.startswith(p + "/")) and (
                best is None or len(p) > best[0]):
            best = (len(p), value)
    return best[1] if best else None


def _headers(url: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    headers = {"User-Agent": "qwen38build-cache/1", **(extra or {})}
    auth = auth_for(url)
    if auth:
        headers["Authorization"] = auth
    return headers


def _failure(url: str, exc: BaseException) -> CacheError:
    if isinstance(exc, Overdue):
        return CacheError(f"{url}: {exc} (the whole-transfer deadline)")
    if isinstance(exc, TimeoutError | socket.timeout):
        return CacheError(f"{url}: no answer within the timeout")
    return CacheError(f"{url}: {type(exc).__name__}: {exc}".rstrip(": "))


@contextmanager
def get(url: str, timeout: float, size: int = 0
        ) -> Iterator[http.client.HTTPResponse | None]:
    """The open response to ``GET url``, or None when the server says 404 (a miss). The
    whole exchange, headers and body, must end within :func:`budget` of ``size``."""
    with _connection(url, timeout, budget(timeout, size)) as (conn, path):
        try:
            conn.request("GET", path, headers=_headers(url))
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            raise _failure(url, exc) from exc
        if resp.status in (404, 410):
            yield None
            return
        if resp.status != 200:
            raise CacheError(f"{url}: the server answered {resp.status} {resp.reason}")
        yield resp


def read_all(url: str, timeout: float, limit: int) -> bytes | None:
    """The whole body of a small file (at most ``limit`` bytes, all within ``timeout``
    seconds in total, headers included), or None on 404."""
    chunks: list[bytes] = []
    total = 0
    with get(url, timeout) as resp:
        if resp is None:
            return None
        try:
            # read1: what has arrived, so a server trickling bytes meets the deadline.
            while chunk := resp.read1(min(BLOCK, limit + 1 - total)):
                chunks.append(chunk)
                total += len(chunk)
                if total > limit:
                    raise CacheError(f"{url}: larger than {limit} bytes; not a cache record")
        except (OSError, http.client.HTTPException) as exc:
            raise _failure(url, exc) from exc
    return b"".join(chunks)


def copy_to(
    resp: http.client.HTTPResponse, url: str, sink: Callable[[memoryview], None], limit: int,
) -> int:
    """Stream the body into ``sink`` in blocks, at most ``limit`` bytes; the count copied.

    Each block is a new object, so ``sink`` may hand it to another thread. A body longer
    than ``limit`` stops at ``limit + 1`` bytes (the caller sees the excess).
    """
    total = 0
    try:
        while total <= limit:
            buf = bytearray(min(BLOCK, limit + 1 - total))
            n = resp.readinto(buf)
            if not n:
                break
            sink(memoryview(buf)[:n])
            total += n
    except (OSError, http.client.HTTPException) as exc:
        raise _failure(url, exc) from exc
    return total


def exists(url: str, timeout: float) -> int | None:
    """``HEAD url``: the size the server gives (-1 if none), or None when it has no such file."""
    with _connection(url, timeout, budget(timeout)) as (conn, path):
        try:
            conn.request("HEAD", path, headers=_headers(url))
            resp = conn.getresponse()
            resp.read()
        except (OSError, http.client.HTTPException) as exc:
            raise _failure(url, exc) from exc
    if resp.status in (404, 410):
        return None
    if resp.status != 200:
        raise CacheError(f"{url}: HEAD answered {resp.status} {resp.reason}")
    length = resp.getheader("Content-Length")
    return int(length) if length and length.isdigit() else -1


def put(url: str, body: Readable | bytes, size: int, timeout: float) -> None:
    """``PUT url`` with ``size`` bytes from ``body`` (all within :func:`budget` of ``size``);
    any answer but 2xx is a CacheError."""
    with _connection(url, timeout, budget(timeout, size)) as (conn, path):
        try:
            conn.request("PUT", path, body=body, headers=_headers(url, {
                "Content-Length": str(size), "Content-Type": "application/octet-stream"}))
            resp = conn.getresponse()
            text = resp.read(512).decode("utf-8", "replace").strip()
        except (OSError, http.client.HTTPException) as exc:
            raise _failure(url, exc) from exc
    if not 200 <= resp.status < 300:
        raise CacheError(f"{url}: PUT answered {resp.status} {resp.reason}"
                         + (f": {text.splitlines()[0][:200]}" if text else ""))
