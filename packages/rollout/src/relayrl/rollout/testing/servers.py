"""Engine server subprocesses for tests: ``python -m relayrl.rollout.engines.http`` on loopback."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys


class EngineServer:
    """An engine server subprocess (python -m relayrl.rollout.engines.http)."""

    def __init__(self, model_dir, engine_id: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "relayrl.rollout.engines.http", "--model", str(model_dir), "--engine-id", engine_id,
             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=dict(os.environ, OMP_NUM_THREADS="1"))
        line = self.process.stdout.readline()
        if not line.startswith("READY "):
            self.process.kill()
            raise RuntimeError(f"engine server failed to start: {line!r} {self.process.stderr.read()[-2000:]}")
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"
        self.engine_id = engine_id

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
