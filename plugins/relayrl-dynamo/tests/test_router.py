"""relayrl-dynamo on the real Dynamo runtime: the router conformance suite, engine processes that
register themselves, and a generation that survives the death of its engine.

Discovery: ``file`` always; ``etcd`` when an ``etcd`` binary is installed (the nox session
installs Debian's etcd-server; a fixture starts it on a free loopback port).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

os.environ.setdefault("DYN_LOG", "warn")

from relayrl.rollout.protocol import GenerateRequest, SamplingParams
from relayrl.rollout.routing import TokenRecordingProxy
from relayrl.rollout.testing import RouterTests, save_tiny_model, tiny_llama
from relayrl.rollout.testing.engine_tests import recorded, replayed

pytest.importorskip("dynamo.runtime", reason="ai-dynamo-runtime is not installed here (the `dynamo` nox session installs it)")

from relayrl_dynamo.router import DynamoRouter
from relayrl_dynamo.runtime import DynamoSettings


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    binary = shutil.which("etcd")
    if binary is None:
        pytest.skip("etcd is not installed (Debian's etcd-server; the `dynamo` nox session installs it)")
    client, peer = _free_port(), _free_port()
    data = tmp_path_factory.mktemp("etcd")
    process = subprocess.Popen([binary, "--data-dir", str(data), "--listen-client-urls", f"http://127.0.0.1:{client}",
                                "--advertise-client-urls", f"http://127.0.0.1:{client}",
                                "--listen-peer-urls", f"http://127.0.0.1:{peer}"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", client), timeout=1).close()
            break
        except OSError:
            assert process.poll() is None and time.monotonic() < deadline, "etcd did not start"
            time.sleep(0.1)
    yield f"http://127.0.0.1:{client}"
    process.terminate()
    process.wait(10)


@pytest.fixture(params=["file", "etcd"])
def settings(request, tmp_path) -> DynamoSettings:
    """Fresh settings per test: a unique namespace, and a fresh directory for file discovery."""
    if request.param == "etcd":
        return DynamoSettings.isolated("etcd", etcd_endpoints=request.getfixturevalue("etcd"))
    return DynamoSettings.isolated("file", discovery_dir=str(tmp_path / "discovery"))


class TestDynamoRouter(RouterTests):
    @pytest.fixture
    def make_router(self, settings):
        return lambda engines: DynamoRouter(engines, settings=settings, down_for_s=5.0)


def test_sticky_policy_keeps_a_trajectory_on_one_instance() -> None:
    from relayrl.rollout.engines.torch_engine import TorchEngine

    model = tiny_llama(seed=0)
    engines = [TorchEngine(model, engine_id=f"engine-{index}") for index in range(3)]
    router = DynamoRouter(engines, policy="sticky")

    def turn(trajectory: str, number: int):
        request = GenerateRequest(request_id=f"{trajectory}/turn-{number}", prompt=[1, 2, 3],
                                  params=SamplingParams(max_tokens=3, seed=number))
        return asyncio.run(router.generate(request)).engine_id

    for trajectory in ("g0/0-aa", "g0/1-bb", "g7/3-cc"):
        assert len({turn(trajectory, number) for number in range(4)}) == 1
    spread = {turn(f"g{index}/0-x", 0) for index in range(12)}
    assert len(spread) > 1  # different trajectories do spread
    router.close_sync()


class EngineProcess:
    """An engine server process (``relayrl.rollout.engines.http``) registered with Dynamo."""

    def __init__(self, model_dir, settings: DynamoSettings, engine_id: str) -> None:
        options = {"namespace": settings.namespace, "discovery": settings.discovery,
                   "discovery_dir": settings.discovery_dir}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "relayrl.rollout.engines.http", "--model", str(model_dir), "--engine-id", engine_id,
             "--router", "dynamo", "--router-options", __import__("json").dumps(options),
             # every token as it is sampled: a kill after the first event lands mid-generation
             "--engine-options", '{"stream_interval_s": 0}'],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env={**os.environ, "DYN_LOG": "error"})
        line = self.process.stdout.readline()
        assert line.startswith("READY"), f"engine {engine_id} did not start: {line!r}"

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(10)

    def terminate(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(30)


@pytest.fixture
def model_dir(tmp_path):
    return save_tiny_model(tmp_path / "model", seed=0)


def test_a_generation_survives_the_death_of_its_engine_process(model_dir, tmp_path) -> None:
    """Two engine processes register through file discovery; the one serving a generation is
    SIGKILLed mid-stream; the token-recording proxy resumes it on the other, token-exact."""
    settings = DynamoSettings.isolated("file", discovery_dir=str(tmp_path / "discovery"))
    workers = {name: EngineProcess(model_dir, settings, name) for name in ("engine-a", "engine-b")}
    router = DynamoRouter(settings=settings, serve=False, expect_instances=2)
    try:
        proxy = TokenRecordingProxy(router)
        request = GenerateRequest(request_id="survivor", prompt=[1, 5, 9],
                                  params=SamplingParams(max_tokens=300, seed=4, top_p=0.9))
        killed: list[str] = []

        def on_event(event) -> None:
            if not killed and event.tokens:
                killed.append(event.engine_id)
                workers[event.engine_id].kill()

        result = asyncio.run(proxy.generate(request, on_event=on_event))
        assert result.resumes >= 1 and len(result.span) == 300
        assert result.engine_ids[0] == killed[0] and result.engine_ids[-1] != killed[0]
        model = tiny_llama(seed=0)
        # Every token keeps the logprob and kept-set of the engine that sampled it: replay matches.
        import torch

        torch.testing.assert_close(recorded(result.span), replayed(model, [1, 5, 9], result.span), atol=2e-4, rtol=0)
    finally:
        router.close_sync()
        for worker in workers.values():
            if worker.process.poll() is None:
                worker.kill()


def test_sigterm_deregisters_an_engine_process(model_dir, tmp_path) -> None:
    settings = DynamoSettings.isolated("file", discovery_dir=str(tmp_path / "discovery"))
    first, second = EngineProcess(model_dir, settings, "engine-a"), EngineProcess(model_dir, settings, "engine-b")
    router = DynamoRouter(settings=settings, serve=False, expect_instances=2)
    try:
        first.terminate()
        deadline = time.monotonic() + 30
        while len(router.instance_ids()) != 1:
            assert time.monotonic() < deadline, f"still listed after SIGTERM: {router.instance_ids()}"
            time.sleep(0.1)
        request = GenerateRequest(request_id="after", prompt=[1, 2], params=SamplingParams(max_tokens=4, seed=1))
        assert asyncio.run(router.generate(request)).engine_id == "engine-b"
    finally:
        router.close_sync()
        for worker in (first, second):
            if worker.process.poll() is None:
                worker.kill()
