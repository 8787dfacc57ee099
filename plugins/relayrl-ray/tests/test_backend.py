"""The ``ray`` launcher's backend on a real three-node Ray cluster: placement by resources, the READY
handshake, deaths of processes, actors and their reading, gang-scheduled trainer ranks."""

from __future__ import annotations

import os
import signal

import pytest

from relayrl.cli.hookspecs import LAUNCHERS
from relayrl.cli.run.launcher import RunFailed, TrainerRanks
from relayrl.cli.testing.launcher_tests import LauncherTests, alive, eventually
from relayrl.core.config import ConfigError, resolve_plugin
from relayrl.core.plugins import get_plugin_manager
from relayrl_ray.backend import RayBackend
from relayrl_ray.config import RayLauncherOptions, RoleResources

SERVER = "import sys, time; print('starting', flush=True); print('READY 4321', flush=True); time.sleep(60)"


@pytest.fixture
def backend(cluster, tmp_path):
    options = RayLauncherOptions(address=cluster.address, place_timeout_s=20,
                                 roles={"engine": RoleResources(resources={"engine": 1}),
                                        "rollout": RoleResources(num_cpus=1, resources={"rollout": 1}),
                                        "trainer": RoleResources(num_cpus=1, resources={"trainer": 1})})
    made = RayBackend.create(options=options, world=2, run_dir=tmp_path)
    yield made
    made.close()


class TestRayLauncher(LauncherTests):
    """The ``ray`` launcher passes the launcher conformance suite on the three-node cluster."""

    @pytest.fixture
    def launcher(self, backend):
        return backend


def node_of(cluster, label: str) -> str:
    return cluster.nodes_by_label[label].node_id


def test_a_role_runs_on_the_node_its_resources_name_and_its_ready_port_comes_back(backend, cluster, tmp_path):
    slot = backend.place("engine", "engine-0")
    assert slot.where["node_id"] == node_of(cluster, "engine") and slot.host == "127.0.0.1"
    process = slot.start("engine-0", ["-c", SERVER], tmp_path / "engine-0.log", {"RELAYRL_X": "1"},
                         capture_stdout=True)
    assert process.read_ready(30) == 4321 and process.poll() is None and alive(process.pid)
    eventually(lambda: "starting" in (tmp_path / "engine-0.log").read_text())
    assert "READY" not in (tmp_path / "engine-0.log").read_text()
    pid = process.pid
    process.terminate()
    process.wait(10)
    assert process.poll() == -signal.SIGTERM and not alive(pid)


def test_exit_status_and_environment_reach_the_launcher(backend, tmp_path):
    os.environ["RELAYRL_FORWARDED"] = "yes"  # the launcher's RELAYRL_ variables travel (forward_env)
    try:
        slot = backend.place("rollout", "rollout")
        code = "import os, sys; print(os.environ['RELAYRL_FORWARDED'], os.environ['MINE']); sys.exit(3)"
        process = slot.start("rollout", ["-c", code], tmp_path / "rollout.log", {"MINE": "set"})
    finally:
        del os.environ["RELAYRL_FORWARDED"]
    eventually(lambda: process.poll() is not None)
    assert process.poll() == 3
    process.wait(5)
    assert (tmp_path / "rollout.log").read_text().split() == ["yes", "set"]


def test_a_killed_actor_reads_as_a_killed_process_and_takes_its_process_with_it(backend, tmp_path):
    import ray

    slot = backend.place("engine", "engine-0")
    process = slot.start("engine-0", ["-c", SERVER], tmp_path / "e.log", {}, capture_stdout=True)
    process.read_ready(30)
    pid = process.pid
    ray.kill(slot.actor)
    eventually(lambda: process.poll() is not None)
    assert process.poll() == -signal.SIGKILL
    eventually(lambda: not alive(pid))  # PR_SET_PDEATHSIG: the actor's death took its child
    process.wait(1)
    # The role's resources are free again: its replacement is placed on the same node.
    again = backend.place("engine", "engine-0")
    assert again.where["node_id"] == slot.where["node_id"]
    ray.kill(again.actor)


def test_a_role_no_node_can_take_fails_in_one_line(cluster, tmp_path):
    options = RayLauncherOptions(address=cluster.address, place_timeout_s=3,
                                 roles={"engine": RoleResources(num_gpus=1)})
    made = RayBackend.create(options=options, world=1, run_dir=tmp_path)
    try:
        with pytest.raises(RunFailed, match=r"no Ray node could take engine-0 \(engine: 1 CPU, 1 GPU"):
            made.place("engine", "engine-0")
    finally:
        made.close()


def test_trainer_ranks_are_gang_scheduled_and_rendezvous_at_rank_zero(backend, cluster, tmp_path):
    code = ("import os; print(*(os.environ[k] for k in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'MASTER_ADDR', "
            "'MASTER_PORT')))")
    group = TrainerRanks(["-c", code], tmp_path, 2, env={}, backend=backend)
    group.start()
    eventually(lambda: group.poll() is not None)
    assert group.poll() == 0
    group.wait(5)
    lines = [(tmp_path / name).read_text().split() for name in ("trainer.log", "trainer-1.log")]
    assert [line[:3] for line in lines] == [["0", "0", "2"], ["1", "1", "2"]]
    assert lines[0][3:] == lines[1][3:] and lines[0][3] == "127.0.0.1" and int(lines[0][4]) > 0
    trainer_node = node_of(cluster, "trainer")
    assert {rank.node.split()[-1] for rank in group.ranks} == {trainer_node[:12]}


def test_bad_options_are_refused_with_their_dotted_key():
    pm = get_plugin_manager()
    for options, key in (({"roles": {"engines": {}}}, "launcher.options.roles.engines"),
                         ({"roles": {"engine": {"num_gpus": -1}}}, "launcher.options.roles.engine.num_gpus"),
                         ({"trainer_strategy": "TIGHT"}, "launcher.options.trainer_strategy"),
                         ({"adress": "x"}, "launcher.options.adress")):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            resolve_plugin(pm, LAUNCHERS, "ray", options, path="launcher.backend",
                           options_path="launcher.options")
