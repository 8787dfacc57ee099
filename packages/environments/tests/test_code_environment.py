"""The ``code`` environment under relayrl-rollout's manager: real sandboxes, the isolated grader, and
task secrets invisible to agents and graders alike."""

from __future__ import annotations

import asyncio

from relayrl.buffer import PromptScheduler, SegmentWriter
from relayrl.core import codec, wire
from relayrl.core.store import open_store
from relayrl.rollout.agent import AgentConfig, CodingAgent
from relayrl.rollout.manager import RolloutManager
from relayrl.rollout.protocol import SamplingParams
from relayrl.rollout.routing import TokenRecordingProxy
from relayrl.rollout.testing.scripted import CHAT, ScriptedEngine, call


def test_code_task_in_real_sandboxes_graded_by_the_isolated_grader(tmp_path):
    """A shipped bug-fix task: one agent fixes the bug with the edit tool, one reads and gives up."""
    from relayrl.environments.bugfix import shipped_tasks
    from relayrl.environments.code import SandboxEnvironment
    from relayrl.sandbox import SandboxSection

    task = next(task for task in shipped_tasks() if task.task_id == "binary-search")
    fix = call("edit", path="search/bisect_search.py", old="while low < high:", new="while low <= high:")
    look = call("read_file", path="search/bisect_search.py") + call("bash", command="ls tests")
    scripts = {0: [look, fix, "fixed"], 1: [look, "I cannot fix it"]}

    class PerSample(ScriptedEngine):
        def _next_reply(self, request_id):
            sample = int(request_id.split("/")[-2].split("-")[0])  # ".../<group>/<sample>-<id>/turn-n"
            return scripts[sample].pop(0)

    engine = PerSample([], "unused")
    store = open_store(str(tmp_path / "bus"))
    environment = SandboxEnvironment(section=SandboxSection(backend="process"))
    manager = RolloutManager(
        scheduler=PromptScheduler([task], seed=0), harness=CodingAgent(AgentConfig(system_prompt="s")),
        proxy=TokenRecordingProxy(engine), chat=CHAT, sampling=SamplingParams(), grader=environment,
        tools=environment.tools, writer=SegmentWriter(store, "rollout-code", groups_per_segment=1), store=store,
        group_size=2, max_concurrent_groups=1)
    asyncio.run(manager.run(max_groups=1))
    (key,) = store.list("rollouts/")
    (group,) = codec.decode_compressed(store.get(key), wire.RolloutSegment, what=key).groups
    by_sample = {t.sample_index: t for t in group.trajectories}
    assert by_sample[0].reward == 1.0 and by_sample[0].cheating == []
    assert by_sample[1].reward == 0.0
    read = by_sample[0].segments[0].turns[3].tool_results[0]
    assert "def find" in read.output and read.exit_status == 0


def test_the_code_environment_hides_the_task_folder_and_the_run_directory(request):
    """Agents and graders alike: a user task folder (gold patch, originals, hidden tests) and the run
    directory are invisible by absolute path, through the real `code` environment."""
    import os
    import shutil
    import uuid
    from pathlib import Path

    import msgspec

    from relayrl.environments.bugfix import SHIPPED_TASKS
    from relayrl.environments.code import CodeEnvironment, CodeEnvironmentConfig
    from relayrl.environments.testing import answer_diff
    from relayrl.sandbox import SandboxSection
    from relayrl.sandbox.testing import call as tool_call

    # Outside /tmp, which every sandbox sees as a private tmpfs anyway, and world-readable: only the
    # masks can hide it.
    base = Path("/var/lib") if os.access("/var/lib", os.W_OK) else Path.home()
    tmp_path = base / f"relayrl-test-{uuid.uuid4().hex[:8]}"
    tmp_path.mkdir(mode=0o755)
    request.addfinalizer(lambda: shutil.rmtree(tmp_path, ignore_errors=True))
    shutil.copytree(SHIPPED_TASKS / "roman", tmp_path / "tasks" / "roman")
    for directory, _, _ in os.walk(tmp_path):
        os.chmod(directory, 0o755)
    (tmp_path / "tasks" / "roman" / "repo" / "numerals" / "roman.py.orig").write_text("the original\n")
    run_dir = tmp_path / "run"
    (run_dir / "rollouts").mkdir(parents=True, mode=0o755)
    os.chmod(run_dir, 0o755)
    (run_dir / "rollouts" / "other-group.txt").write_text("another answer\n")
    secrets = [tmp_path / "tasks" / "roman" / "gold.patch", tmp_path / "tasks" / "roman" / "repo" / "numerals" /
               "roman.py.orig", tmp_path / "tasks" / "roman" / "hidden_tests" / "tests" / "test_grading.py",
               run_dir / "rollouts" / "other-group.txt"]
    section = SandboxSection(backend="process", require=[], hide_paths=[str(run_dir)])
    environment = CodeEnvironment(CodeEnvironmentConfig(tasks=str(tmp_path / "tasks")), sandbox=section)
    (task,) = environment.tasks()

    async def agent_view() -> str:
        async with environment.tools(task) as toolbox:
            (result,) = await toolbox.execute([tool_call("bash", command=" ; ".join(f"cat {path}" for path in secrets))])
            return result.output

    assert all(text not in asyncio.run(agent_view()) for text in ("diff --git", "the original", "MCMXCIV",
                                                                    "another answer"))
    probe = ("import os\nSECRETS = " + repr([str(path) for path in secrets]) + "\n"
             "VALUES = [(1000, 'M'), (900, 'CM'), (500, 'D'), (400, 'CD'), (100, 'C'), (90, 'XC'), (50, 'L'),\n"
             "          (40, 'XL'), (10, 'X'), (9, 'IX'), (5, 'V'), (4, 'IV'), (1, 'I')]\n\n\n"
             "def to_roman(number):\n"
             "    for path in SECRETS:\n"
             "        if os.path.exists(path) and os.path.getsize(path):\n"
             "            raise AssertionError('visible while graded: ' + path)\n"
             "    out = ''\n    for value, letters in VALUES:\n"
             "        while number >= value:\n            out += letters\n            number -= value\n"
             "    return out\n")
    trajectory = wire.Trajectory(trajectory_id="t", task_id=task.task_id, group_id="g", sample_index=0, segments=[])
    (graded,) = asyncio.run(environment.grade(task, [trajectory], [answer_diff(task, {"numerals/roman.py": probe})]))
    assert graded.reward == 1.0, msgspec.structs.asdict(graded)
