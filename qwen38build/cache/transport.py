"""The cache protocol's transport: GET, HEAD and PUT of files under a URL prefix.

Plain ``http.client`` with a timeout on every connect and read, so a cache that is down
or stalls costs at most that long. Every transport failure (refused, timed out, reset, a
5xx, a redirect, a body shorter than announced) becomes one :class:`CacheError` here, the
one seam where foreign errors are translated. A 404 is an answer, not a failure. No
redirects are followed and no proxy variables are read: the URL names the server.

Credentials are scoped: ``$QWEN38BUILD_CACHE_AUTH`` holds ``URL=VALUE`` entries (one per
line), and VALUE is sent as the ``Authorization`` header only to requests under that URL
(same scheme, host, port and path prefix), never to another cache.
"""

from __future__ import annotations

import http.client
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


class Readable(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...


def join(base: str, *parts: str) -> str:
    """``base/part/...`` with each part percent-quoted (its slashes kept)."""
    return "/".join([base.rstrip("/"), *(quote(p, safe="/") for p in parts)])


def _connect(url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    parts = urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    try:
        conn = cls(parts.netloc, timeout=timeout, blocksize=BLOCK)
    except (ValueError, http.client.HTTPException) as exc:  # a bad port, say
        raise CacheError(f"{url}: not a usable URL: {exc}") from exc
    return conn, parts.path or "/"


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
    if isinstance(exc, TimeoutError | socket.timeout):
        return CacheError(f"{url}: no answer within the timeout")
    return CacheError(f"{url}: {type(exc).__name__}: {exc}".rstrip(": "))


@contextmanager
def get(url: str, timeout: float) -> Iterator[http.client.HTTPResponse | None]:
    """The open response to ``GET url``, or None when the server says 404 (a miss)."""
    conn, path = _connect(url, timeout)
    try:
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
    finally:
        conn.close()


def read_all(url: str, timeout: float, limit: int) -> bytes | None:
    """The whole body of a small file (at most ``limit`` bytes, all within ``timeout``
    seconds in total), or None on 404."""
    deadline = time.monotonic() + timeout
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
                if time.monotonic() > deadline:
                    raise CacheError(f"{url}: not received within {timeout:g}s")
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
    conn, path = _connect(url, timeout)
    try:
        conn.request("HEAD", path, headers=_headers(url))
        resp = conn.getresponse()
        resp.read()
    except (OSError, http.client.HTTPException) as exc:
        raise _failure(url, exc) from exc
    finally:
        conn.close()
    if resp.status in (404, 410):
        return None
    if resp.status != 200:
        raise CacheError(f"{url}: HEAD answered {resp.status} {resp.reason}")
    length = resp.getheader("Content-Length")
    return int(length) if length and length.isdigit() else -1


def put(url: str, body: Readable | bytes, size: int, timeout: float) -> None:
    """``PUT url`` with ``size`` bytes from ``body``; any answer but 2xx is a CacheError."""
    conn, path = _connect(url, timeout)
    try:
        conn.request("PUT", path, body=body, headers=_headers(url, {
            "Content-Length": str(size), "Content-Type": "application/octet-stream"}))
        resp = conn.getresponse()
        text = resp.read(512).decode("utf-8", "replace").strip()
    except (OSError, http.client.HTTPException) as exc:
        raise _failure(url, exc) from exc
    finally:
        conn.close()
    if not 200 <= resp.status < 300:
        raise CacheError(f"{url}: PUT answered {resp.status} {resp.reason}"
                         + (f": {text.splitlines()[0][:200]}" if text else ""))
