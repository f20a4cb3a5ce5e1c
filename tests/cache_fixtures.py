"""Real HTTP servers for the cache tests: nginx with PUT (its DAV module) on a free port of
127.0.0.1 with a config the test writes, and a small Python server that serves the same
folder but misbehaves on request (slow, 5xx, garbage, truncated, tampered)."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

NGINX_CONF = """\
daemon off;
master_process on;
worker_processes 1;
user {user};
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    sendfile on;
    default_type application/octet-stream;
    server {{
        listen 127.0.0.1:{port};
        location /q38/ {{
            alias {root}/;
            dav_methods PUT;
            create_full_put_path on;
            dav_access user:rw group:r all:r;
            client_max_body_size 0;
        }}
    }}
}}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_listening(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"nginx exited {proc.returncode}: {log.read_text()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("nginx did not start listening within 20 s")


@contextmanager
def nginx(root: Path, tmp: Path) -> Iterator[str]:
    """Run nginx in the foreground serving ``root`` (GET, HEAD, PUT) under /q38/; yield
    the cache URL. Stopped (by its pid) when the block ends."""
    exe = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists()
                                    else None)
    if exe is None:
        pytest.skip("nginx is not installed (Debian: apt-get install nginx; .ci/run does)")
    root.mkdir(parents=True, exist_ok=True)
    tmp.mkdir(parents=True, exist_ok=True)
    port = free_port()
    conf = tmp / "nginx.conf"
    conf.write_text(NGINX_CONF.format(user=pwd.getpwuid(os.geteuid()).pw_name, tmp=tmp,
                                      port=port, root=root))
    log = tmp / "stderr.log"
    with log.open("wb") as err:
        proc = subprocess.Popen([exe, "-e", str(tmp / "error.log"), "-p", str(tmp), "-c",
                                 str(conf)], stdout=err, stderr=err)
    try:
        _wait_listening(port, proc, log)
        yield f"http://127.0.0.1:{port}/q38"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# A fault maps a part of a request path to what to do instead of serving the file honestly.
Fault = Callable[["FaultHandler", bytes], None]


class FaultHandler(BaseHTTPRequestHandler):
    server: FaultServer

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def _file(self) -> bytes | None:
        rel = self.path.split("/q38/", 1)[-1]
        p = self.server.root / rel
        return p.read_bytes() if p.is_file() else None

    def _send(self, status: int, body: bytes, length: int | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        self.server.requests.append(f"{self.command} {self.path}")
        self.server.auths.append(self.headers.get("Authorization"))
        data = self._file()
        for part, fault in self.server.faults.items():
            if part in self.path:
                fault(self, data or b"")
                return
        if data is None:
            self._send(404, b"not here\n")
        else:
            self._send(200, data)

    do_HEAD = do_GET

    def do_PUT(self) -> None:
        self.server.requests.append(f"PUT {self.path}")
        self._send(405, b"read-only\n")


class FaultServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path) -> None:
        super().__init__(("127.0.0.1", 0), FaultHandler)
        self.root = root
        self.faults: dict[str, Fault] = {}
        self.requests: list[str] = []
        self.auths: list[str | None] = []  # the Authorization header of each GET or HEAD

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that hangs up on a fault is the point, not a failure

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/q38"


@contextmanager
def fault_server(root: Path) -> Iterator[FaultServer]:
    server = FaultServer(root)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


# -- the faults ------------------------------------------------------------------------


def slow(seconds: float) -> Fault:
    def fault(h: FaultHandler, data: bytes) -> None:
        time.sleep(seconds)
        h._send(200, data)
    return fault


def status(code: int) -> Fault:
    def fault(h: FaultHandler, data: bytes) -> None:
        h._send(code, b"<html>oops</html>\n")
    return fault


def trickle(h: FaultHandler, data: bytes) -> None:
    """Announce the whole file, then send a byte every 0.1 s: no single read times out."""
    h.send_response(200)
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    for i in range(len(data)):
        h.wfile.write(data[i : i + 1])
        h.wfile.flush()
        time.sleep(0.1)


def garbage(h: FaultHandler, data: bytes) -> None:
    h._send(200, b"\x00\xffnot json at all" * 10)


def truncated(h: FaultHandler, data: bytes) -> None:
    """Announce the whole file, send half, hang up."""
    h._send(200, data[: len(data) // 2], length=len(data))
    h.close_connection = True


def serve(body: bytes) -> Fault:
    def fault(h: FaultHandler, data: bytes) -> None:
        h._send(200, body)
    return fault


def flip_last_byte(h: FaultHandler, data: bytes) -> None:
    h._send(200, data[:-1] + bytes([data[-1] ^ 1]))


FAKE_NVCC = """\
#!{python}
# A stand-in for nvcc in the cache tests: answers --version, writes an ELF64 "cubin" whose
# e_flags carry the SM, and logs every compile to {state}/nvcc.log (the kernel steps scrub
# the environment, so its state lives in a folder); refuses to compile if {state}/FAIL exists.
import os, struct, sys
args = sys.argv[1:]
if args == ["--version"]:
    print("fake nvcc: Cuda compilation tools, release 13.0")
    sys.exit(0)
with open("{state}/nvcc.log", "a") as log:
    log.write(" ".join(args) + "\\n")
if os.path.exists("{state}/FAIL"):
    sys.exit("fake nvcc: compiling is forbidden here")
out = args[args.index("-o") + 1]
sm = 0
for a in args:
    if "code=sm_" in a:
        sm = int(a.rsplit("sm_", 1)[1])
    if a.startswith("-arch=compute_"):
        sm = int(a.rsplit("_", 1)[1])
head = bytearray(64)
head[:5] = b"\\x7fELF\\x02"
struct.pack_into("<I", head, 48, sm << 8)
with open(out, "wb") as f:
    f.write(bytes(head) + b"kernel for sm_%d\\n" % sm)
"""


def install_fake_nvcc(bin_dir: Path, python: str, state: Path) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    state.mkdir(parents=True, exist_ok=True)
    exe = bin_dir / "nvcc"
    exe.write_text(FAKE_NVCC.format(python=python, state=state))
    exe.chmod(0o755)
    return exe


def trickle_headers(h: FaultHandler, data: bytes) -> None:
    """Send the status line and headers a byte every 0.05 s (a long padding header makes it
    last ~10 s), then the body: no single read times out, yet the answer never ends soon."""
    head = (b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nX-Pad: %s\r\n\r\n"
            % (len(data), b"." * 200))
    for i in range(len(head)):
        h.wfile.write(head[i : i + 1])
        h.wfile.flush()
        time.sleep(0.05)
    h.wfile.write(data)
    h.close_connection = True
