"""Peer replicas: a node serves its checkpoint directory over HTTP; other nodes write replicas into it.

A peer is just another relayrl object store: :class:`HttpPeerStore` implements the six store
primitives over HTTP against a :class:`PeerServer` that keeps the objects in a local directory with
:class:`relayrl.core.store.LocalStore`'s atomic writes (temp file, fsync, rename or link). So a
replica inherits every store guarantee (atomic visibility, checksum trailers written by the sender
and verified by the reader, conditional create) and passes ``StoreTests`` itself.

URLs: ``relayrl-peer://HOST:PORT/prefix``. Start a server with
``python -m relayrl.fault_tolerance.peers --root DIR --port 0`` (prints ``READY <port>``).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import sys
import threading
import urllib.parse
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from relayrl.core.errors import ObjectExists, StoreError
from relayrl.core.store import LocalStore, Store
from relayrl.core.store.base import Buffer
from relayrl.core.store.retry import RetryPolicy

__all__ = ["HttpPeerStore", "PeerServer"]

SCHEME = "relayrl-peer"


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _path(self) -> str | None:
        parsed = urllib.parse.urlparse(self.path)
        if not parsed.path.startswith("/o/"):
            return None
        relative = urllib.parse.unquote(parsed.path[3:])
        parts = relative.split("/")
        if not relative or relative.startswith("/") or any(part in ("", ".", "..") for part in parts):
            return None
        return os.path.join(self.server.root, relative)

    def _reply(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def do_PUT(self) -> None:
        path = self._path()
        if path is None:
            return self._reply(400, b"bad object path")
        length = int(self.headers.get("Content-Length", "0"))
        data = self.rfile.read(length)
        if len(data) != length:
            return self._reply(400, b"short body")
        if_absent = "if_absent=1" in urllib.parse.urlparse(self.path).query
        try:
            self.server.local._write(path, [data], if_absent=if_absent)
        except (ObjectExists, FileExistsError):
            return self._reply(409, b"exists")
        self._reply(201)

    def do_GET(self) -> None:
        parsed = urllib.parse.urlparse(self.path)
        if parsed.path.startswith("/list/") or parsed.path == "/list":
            directory = urllib.parse.unquote(parsed.path[len("/list/"):]) if parsed.path != "/list" else ""
            base = os.path.join(self.server.root, directory) if directory else self.server.root
            if ".." in directory.split("/"):
                return self._reply(400, b"bad directory")
            found = [os.path.relpath(path, self.server.root) for path in self.server.local._list(base)]
            return self._reply(200, json.dumps(found).encode(), {"Content-Type": "application/json"})
        path = self._path()
        if path is None:
            return self._reply(400, b"bad object path")
        try:
            start, end = None, None
            if "Range" in self.headers:
                first, last = self.headers["Range"].removeprefix("bytes=").split("-")
                start, end = int(first), int(last) + 1
            data = self.server.local._read(path, start, end)
        except (FileNotFoundError, IsADirectoryError):
            return self._reply(404)
        self._reply(206 if start is not None else 200, data)

    def do_HEAD(self) -> None:
        path = self._path()
        if path is None or not os.path.isfile(path):
            return self._reply(404)
        self.send_response(200)
        self.send_header("Content-Length", str(os.path.getsize(path)))
        self.end_headers()

    def do_DELETE(self) -> None:
        path = self._path()
        if path is None:
            return self._reply(400, b"bad object path")
        try:
            os.unlink(path)
        except FileNotFoundError:
            return self._reply(404)
        self._reply(204)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    root: str
    local: LocalStore


class PeerServer:
    """Serves ``root`` to peers on ``host:port`` (port 0: any free port) in a background thread."""

    def __init__(self, root: str | os.PathLike[str], *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.root = os.path.abspath(root)
        os.makedirs(self.root, exist_ok=True)
        self._server = _Server((host, port), _Handler)
        self._server.root = self.root
        self._server.local = LocalStore(f"file://{self.root}")
        self.host, self.port = self._server.server_address[:2]
        self._thread = threading.Thread(target=self._server.serve_forever, name="peer-server", daemon=True)

    @property
    def url(self) -> str:
        return f"{SCHEME}://{self.host}:{self.port}"

    def start(self) -> PeerServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> PeerServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class HttpPeerStore(Store):
    """A :class:`Store` whose objects live on a :class:`PeerServer`."""

    def __init__(self, url: str, *, retry: RetryPolicy | None = None, timeout_s: float = 60.0) -> None:
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme != SCHEME or not parsed.hostname or not parsed.port:
            raise StoreError(f"peer store URL must look like {SCHEME}://HOST:PORT/prefix, got {url!r}")
        # Objects live under a non-empty prefix on the server (``objects`` when the URL names none).
        super().__init__(url, parsed.path.strip("/") or "objects", retry=retry)
        self.host, self.port, self.timeout_s = parsed.hostname, parsed.port, timeout_s

    @classmethod
    def from_url(cls, url: str, **options: Any) -> HttpPeerStore:
        return cls(url, **options)

    def _request(self, method: str, target: str, body: bytes | None = None,
                 headers: dict[str, str] | None = None) -> tuple[int, bytes, dict[str, str]]:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            connection.request(method, target, body=body, headers=headers or {})
            response = connection.getresponse()
            return response.status, response.read(), dict(response.getheaders())
        finally:
            connection.close()

    @staticmethod
    def _object(path: str) -> str:
        return "/o/" + urllib.parse.quote(path.lstrip("/"))

    def _write(self, path: str, chunks: Sequence[Buffer], *, if_absent: bool) -> None:
        query = "?if_absent=1" if if_absent else ""
        status, body, _ = self._request("PUT", self._object(path) + query, b"".join(chunks))
        if status == 409:
            raise ObjectExists(path)
        if status != 201:
            raise ConnectionError(f"peer {self.host}:{self.port} answered {status} to PUT {path}: {body[:200]!r}")

    def _read(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        headers = {"Range": f"bytes={start}-{end - 1}"} if start is not None and end is not None else {}
        status, body, _ = self._request("GET", self._object(path), headers=headers)
        if status == 404:
            raise FileNotFoundError(path)
        if status not in (200, 206):
            raise ConnectionError(f"peer {self.host}:{self.port} answered {status} to GET {path}")
        return body

    def _size(self, path: str) -> int:
        status, _, headers = self._request("HEAD", self._object(path))
        if status == 404:
            raise FileNotFoundError(path)
        return int({key.lower(): value for key, value in headers.items()}["content-length"])

    def _list(self, directory: str) -> list[str]:
        status, body, _ = self._request("GET", "/list/" + urllib.parse.quote(directory.strip("/")))
        if status != 200:
            raise ConnectionError(f"peer {self.host}:{self.port} answered {status} to a listing of {directory}")
        return [path for path in json.loads(body)]

    def _delete(self, path: str) -> None:
        status, _, _ = self._request("DELETE", self._object(path))
        if status == 404:
            raise FileNotFoundError(path)

    def _exists(self, path: str) -> bool:
        return self._request("HEAD", self._object(path))[0] == 200


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve a directory as a relayrl peer store.")
    parser.add_argument("--root", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    server = PeerServer(args.root, host=args.host, port=args.port).start()
    print(f"READY {server.port}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    server.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
