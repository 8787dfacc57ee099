"""Countdown-lite: task generation, the sandboxed grader against its reference, batched grading, environments."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from relayrl.core.config import ConfigError, load_config
from relayrl.core.wire import Trajectory, TrajectorySegment, Turn
from relayrl.environments.countdown import ALPHABET, CountdownConfig, CountdownEnvironment, evaluate, make_tasks, score
from relayrl.rollout.chat import CharTokenizer, RawChatFormat
from relayrl.rollout.config import build_environment, build_harness
from relayrl.rollout.models import load_tokenizer, make_chat_format, materialize_model

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_tasks_are_solvable_by_their_demonstration_and_deterministic():
    tasks = make_tasks(500, seed=3)
    assert [task.instruction for task in tasks] == [task.instruction for task in make_tasks(500, seed=3)]
    for task in tasks:
        numbers, target = task.metadata["numbers"], task.metadata["target"]
        assert 0 <= target <= 99 and len(numbers) == 3 and all(1 <= n <= 9 for n in numbers)
        assert task.instruction == f"{numbers[0]} {numbers[1]} {numbers[2]}>{target}:"
        assert score(numbers, target, task.answer) == 1.0
        assert set(task.instruction) <= set(ALPHABET)


def test_evaluate_uses_the_usual_precedence():
    assert evaluate("2+3*4") == 14 and evaluate("9-2*3") == 3 and evaluate("2*3-4*1") == 2 and evaluate("7") == 7


@pytest.mark.parametrize("answer,reward", [
    ("7*3-4", 1.0), ("3*7-4", 1.0), ("4-7*3", 0.0),        # the value must be the target
    ("7*3-4-0", 0.0), ("7*4-3", 0.0), ("21-4", 0.0),       # exactly the three numbers, single digits
    ("7*3-", 0.0), ("*7*3-4", 0.0), ("7**3-4", 0.0), ("", 0.0), (" 7*3-4 ", 1.0),
    ("__import__('os')", 0.0), ("7*(3)-4", 0.0),
])
def test_reference_scores(answer, reward):
    assert score([3, 4, 7], 17, answer) == reward


def test_the_sandboxed_grader_agrees_with_the_reference_on_random_answers():
    rng = random.Random(0)
    tasks = make_tasks(100, seed=1)
    items = []
    for task in tasks:
        for answer in (task.answer, task.answer[::-1], "".join(rng.choice("123456789+-*") for _ in range(5)), "1+1"):
            items.append({"numbers": task.metadata["numbers"], "target": task.metadata["target"], "answer": answer})
    environment = CountdownEnvironment()
    rewards = environment.grade_sync(items)
    assert rewards == [score(item["numbers"], item["target"], item["answer"]) for item in items]
    assert sum(rewards) >= 100 and environment.sandbox_calls == 1


def trajectory(task, index, text):
    return Trajectory(trajectory_id=f"{task.task_id}/{index}", task_id=task.task_id, group_id=task.task_id,
                      sample_index=index, segments=[TrajectorySegment(turns=[Turn(role="assistant", text=text)])])


def test_groups_finishing_together_are_graded_by_one_sandbox_command():
    environment = CountdownEnvironment(CountdownConfig(grade_window_s=0.05))
    tasks = make_tasks(6, seed=2)

    async def grade_all():
        return await asyncio.gather(*(environment.grade(task, [trajectory(task, 0, task.answer), trajectory(task, 1, "1")],
                                                        ["", ""]) for task in tasks))

    graded = asyncio.run(grade_all())
    assert environment.sandbox_calls == 1 and environment.graded_answers == 12
    for group in graded:
        assert [t.reward for t in group] == [1.0, 0.0]
        assert group[0].reward_components["correct"] == 1.0


def test_environment_options_and_harness_options_are_validated_by_key():
    config = load_config({"rollout": {"environment_options": {"tasks": 50}, "harness_options": {"max_tokens": 8}}})
    environment = build_environment(config.rollout)
    assert len(environment.tasks()) == 50 and len(environment.eval_tasks()) == 200
    assert build_harness(config.rollout).config.max_tokens == 8
    with pytest.raises(ConfigError, match=r"rollout\.environment_options\.taskz: unknown key; did you mean tasks"):
        load_config({"rollout": {"environment_options": {"taskz": 5}}})
    with pytest.raises(ConfigError, match=r"rollout\.environment: .*nope"):
        load_config({"rollout": {"environment": "nope"}})
    with pytest.raises(ConfigError, match=r"model\.tokenizer"):
        load_config({"model": {"init": {"hidden_size": 32}}})


def test_code_environment_serves_the_shipped_tasks():
    config = load_config({"rollout": {"environment": "code"}})
    assert len(build_environment(config.rollout).tasks()) == 12


def test_a_fresh_model_directory_with_its_character_tokenizer(tmp_path):
    config = load_config({"model": {"init": {"hidden_size": 32, "num_hidden_layers": 1, "intermediate_size": 64},
                                    "tokenizer": "char", "chat_format": "raw"}})
    directory = materialize_model(config.model, tmp_path / "model", alphabet=ALPHABET, seed=0)
    assert json.loads((directory / "config.json").read_text())["vocab_size"] == len(CharTokenizer(ALPHABET))
    tokenizer = load_tokenizer(directory)
    chat = make_chat_format(config.model, tokenizer)
    assert isinstance(chat, RawChatFormat)
    assert chat.decode(chat.render("user", "3 4 7>17:")) == "3 4 7>17:" and chat.assistant_prefix() == []
    before = (directory / "model.safetensors").read_bytes()
    assert materialize_model(config.model, tmp_path / "model", alphabet=ALPHABET, seed=1) == directory
    assert (directory / "model.safetensors").read_bytes() == before  # a resumed run keeps its model
