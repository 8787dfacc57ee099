"""A real S3 protocol server on loopback for tests: moto's server mode in a subprocess.

Nothing leaves 127.0.0.1. The server speaks the S3 REST protocol (multipart uploads, conditional
``If-None-Match`` puts, listing), so the code under test talks to it exactly as to a cloud bucket.

Example::

    with S3Server() as server:
        server.create_bucket("bus")
        with server.environment():         # AWS_ENDPOINT_URL & fake credentials for this process
            store = open_store("s3://bus/run")
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class S3Server:
    """moto's S3 server on ``127.0.0.1:<free port>``, started and stopped as a context manager."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def env(self) -> dict[str, str]:
        """Environment variables that point boto3/s3fs (in any process) at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": "relayrl-test",
            "AWS_SECRET_ACCESS_KEY": "relayrl-test",
            "AWS_DEFAULT_REGION": "us-east-1",
            # No instance-metadata lookups on a machine without network.
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def start(self, timeout_s: float = 60.0) -> S3Server:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout_s
        while True:
            if self._process.poll() is not None:
                raise RuntimeError(f"moto server exited with status {self._process.returncode} (is moto[server] installed?)")
            try:
                urllib.request.urlopen(self.endpoint_url + "/moto-api/", timeout=1).close()
                return self
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto server did not answer on {self.endpoint_url} within {timeout_s} s") from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def create_bucket(self, name: str) -> str:
        """Create bucket ``name`` (idempotent) and return ``s3://name``."""
        import boto3

        client = boto3.client("s3", endpoint_url=self.endpoint_url, region_name="us-east-1",
                              aws_access_key_id="relayrl-test", aws_secret_access_key="relayrl-test")
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            client.create_bucket(Bucket=name)
        return f"s3://{name}"

    @contextlib.contextmanager
    def environment(self) -> Iterator[None]:
        """Set :attr:`env` in ``os.environ`` (inherited by subprocesses), restoring it on exit."""
        saved = {key: os.environ.get(key) for key in self.env}
        os.environ.update(self.env)
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
