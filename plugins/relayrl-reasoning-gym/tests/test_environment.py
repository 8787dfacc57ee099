"""The reasoning-gym environment: relayrl's conformance suite, its config errors, its scorer in a real sandbox."""

from __future__ import annotations

import asyncio

import pytest
import reasoning_gym

from relayrl.core.config import resolve_plugin
from relayrl.core.errors import ConfigError, RelayrlError
from relayrl.core.plugins import get_plugin_manager
from relayrl.rollout.evaluation import split_tasks
from relayrl.rollout.hookspecs import ENVIRONMENTS
from relayrl.rollout.testing import EnvironmentTests
from relayrl.rollout.testing.environment_tests import answered
from relayrl_reasoning_gym.environment import ReasoningGymConfig, ReasoningGymEnvironment
from relayrl_reasoning_gym.plugin import NAME

CHAIN = {"dataset": "chain_sum", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
         "tasks": 40, "eval_tasks": 20}
MIX = {"mix": [{"name": "chain_sum", "weight": 2.0, "config": {"max_terms": 2, "max_digits": 1}},
               {"name": "leg_counting", "config": {"min_animals": 1, "max_animals": 2}}], "tasks": 40, "eval_tasks": 20}


def build(options: dict) -> ReasoningGymEnvironment:
    registration, config = resolve_plugin(get_plugin_manager(), ENVIRONMENTS, NAME, options, path="rollout.environment")
    return registration.factory(config)


@pytest.fixture(scope="module")
def chain() -> ReasoningGymEnvironment:
    environment = build(CHAIN)
    yield environment
    environment.close()


def grade(environment, task, texts):
    trajectories = [answered(task, text, index) for index, text in enumerate(texts)]
    return asyncio.run(environment.grade(task, trajectories, [""] * len(texts)))


class TestReasoningGym(EnvironmentTests):
    @pytest.fixture
    def environment(self, chain):
        return chain


class TestReasoningGymMix(EnvironmentTests):
    @pytest.fixture
    def environment(self):
        environment = build(MIX)
        yield environment
        environment.close()


# ---------------------------------------------------------------------------------------- tasks
def test_tasks_are_the_datasets_entries_in_the_documented_prompt(chain) -> None:
    dataset = reasoning_gym.create_dataset("chain_sum", size=40, seed=0, **CHAIN["config"])
    for index, task in enumerate(chain.tasks()[:5]):
        assert task.instruction == chain.config.prompt.format(question=dataset[index]["question"])
        assert task.answer == dataset[index]["answer"] and task.metadata["category"] == "chain_sum"
    assert "<answer>" in chain.tasks()[0].instruction


def test_held_out_tasks_come_from_seeds_disjoint_from_training(chain) -> None:
    train, held = chain.config.seed_ranges()
    assert train[1] <= held[0] or held[1] <= train[0]
    training, held_out = split_tasks(chain)
    assert len(held_out) == 20 and {task.instruction for task in training}.isdisjoint(
        {task.instruction for task in held_out})
    # The same options give the same tasks (a resumed run, an eval after training).
    assert [task.instruction for task in build(CHAIN).eval_tasks()] == [task.instruction for task in held_out]


def test_a_mix_draws_every_dataset_and_names_it(chain) -> None:
    categories = [task.metadata["category"] for task in build(MIX).tasks()]
    assert set(categories) == {"chain_sum", "leg_counting"}
    assert categories.count("chain_sum") > categories.count("leg_counting")  # weight 2 against 1


def test_a_filtered_task_set_trains_through_task_file_and_still_grades(chain, tmp_path) -> None:
    # What `relayrl data filter` writes: the kept tasks as JSONL TaskSpecs, a pass rate in their metadata.
    import json

    import msgspec

    kept = chain.tasks()[3:6]
    path = tmp_path / "filtered.jsonl"
    path.write_text("".join(json.dumps(msgspec.to_builtins(msgspec.structs.replace(
        task, metadata={**task.metadata, "pass_rate": 0.25}))) + "\n" for task in kept))
    filtered = build({**CHAIN, "task_file": str(path)})
    assert [task.task_id for task in filtered.tasks()] == [task.task_id for task in kept]
    task = filtered.tasks()[0]
    assert grade(filtered, task, [f"<answer>{task.answer}</answer>"])[0].reward == 1.0
    filtered.close()


def test_tasks_are_the_same_in_every_process_whatever_its_hash_seed() -> None:
    # word_ladder builds entries from sets of strings: under per-process hash randomisation the same
    # seed made other entries in another process (and the sandbox scored answers against those).
    import json
    import os
    import subprocess
    import sys

    from relayrl_reasoning_gym.grading import generate_entries

    source = {"name": "word_ladder", "config": {}, "size": 3, "seed": 5}
    here = generate_entries(source)
    code = ("import json, sys; from relayrl_reasoning_gym.grading import generate_entries; "
            f"print(json.dumps(generate_entries({source!r})))")
    there = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                      env={**os.environ, "PYTHONHASHSEED": "123"}).stdout)
    assert here == there and len(here) == 3


def test_every_datasets_reference_answer_earns_full_marks_in_the_sandbox() -> None:
    """All of reasoning-gym at once: a mix of every dataset, the first task of each graded with its own
    reference answer, in one sandbox command (each answer in a child of its own)."""
    from reasoning_gym.factory import DATASETS

    names = sorted(name for name in DATASETS if name != "composite")
    environment = build({"mix": [{"name": name} for name in names], "tasks": 12 * len(names), "eval_tasks": 0,
                         "answer_format": "whole"})
    first: dict[str, object] = {}
    for task in environment.tasks():
        first.setdefault(task.metadata["category"], task)
    graded = [task for task in first.values() if task.answer is not None]
    assert len(first) > 0.9 * len(names) and len(graded) > 0.85 * len(names)
    results = environment.grader.grade_sync([{"source": task.metadata["source"], "index": task.metadata["index"],
                                              "text": task.answer} for task in graded])
    wrong = {task.metadata["category"]: result for task, result in zip(graded, results)
             if result.reward != 1.0 or result.flag}
    assert not wrong
    environment.close()


# -------------------------------------------------------------------------------------- grading
def test_the_reward_is_the_datasets_own_score_of_the_tagged_answer(chain) -> None:
    task = chain.tasks()[0]
    entry = reasoning_gym.create_dataset("chain_sum", size=40, seed=0, **CHAIN["config"])[0]
    wrong = str(int(entry["answer"]) + 1)
    graded = grade(chain, task, [f"<answer>{entry['answer']}</answer>", f"It is <answer> {wrong} </answer>",
                                 entry["answer"], f"<answer>1</answer> no, <answer>{entry['answer']}</answer>"])
    assert [trajectory.reward for trajectory in graded] == [1.0, 0.0, 0.0, 1.0]
    assert [trajectory.reward_components["answered"] for trajectory in graded] == [1.0, 1.0, 0.0, 1.0]
    assert chain.metrics()["reasoning_gym/unanswered"] >= 1.0


def test_without_a_tag_the_whole_final_message_is_the_answer() -> None:
    environment = build({**CHAIN, "answer_format": "whole", "prompt": "{question}\nReply with only the final answer."})
    task = environment.tasks()[0]
    graded = grade(environment, task, [f" {task.answer}\n", f"The answer is {task.answer}.", ""])
    assert graded[0].reward == 1.0 and graded[1].reward < 1.0 and graded[2].reward == 0.0
    assert [trajectory.reward_components["answered"] for trajectory in graded] == [1.0, 1.0, 0.0]
    assert environment.demonstration(task) == task.answer
    environment.close()


@pytest.mark.parametrize(("answer_format", "reply", "expected"), [
    ("last-number", "3 + 4 = {answer}", 1.0),
    ("last-number", "{answer} is wrong, it is 1,000", 0.0),
    ("last-number", "no number here", 0.0),
    ("last-line", "Let me think.\n{answer}\n\n", 1.0),
    ("last-line", "{answer}\nThat is all.", 0.0),
])
def test_the_answer_format_says_where_the_answer_is(answer_format, reply, expected) -> None:
    from relayrl_reasoning_gym.scorer import extract_answer

    environment = build({**CHAIN, "answer_format": answer_format})
    task = environment.tasks()[0]
    text = reply.format(answer=task.answer)
    graded = grade(environment, task, [text])
    assert graded[0].reward == expected, (text, extract_answer(text, answer_format))
    environment.close()


def test_partial_credit_is_the_datasets_not_ours() -> None:
    # spell_backward's score_answer gives partial credit for a near miss: the reward is that score.
    environment = build({"dataset": "spell_backward", "tasks": 5, "eval_tasks": 0})
    task = environment.tasks()[0]
    entry = reasoning_gym.create_dataset("spell_backward", size=5, seed=0)[0]
    near = entry["answer"][:-1] + ("a" if entry["answer"][-1] != "a" else "b")
    graded = grade(environment, task, [f"<answer>{near}</answer>"])
    expected = reasoning_gym.create_dataset("spell_backward", size=5, seed=0).score_answer(near, entry)
    assert graded[0].reward == pytest.approx(min(1.0, max(0.0, expected)))


def test_the_scorer_regenerates_the_entry_rather_than_trust_the_task(chain) -> None:
    import msgspec

    task = chain.tasks()[0]
    forged = msgspec.structs.replace(task, answer="12345")  # what the host holds is not what is scored
    assert grade(chain, forged, ["<answer>12345</answer>"])[0].reward == 0.0


@pytest.mark.parametrize("answer", [
    "__import__('os').system('true')",
    "type('X', (), {'__eq__': lambda a, b: True})()",
    "eval('1+1')",
])
def test_an_answer_that_is_code_earns_zero_and_a_flag(chain, answer) -> None:
    task = chain.tasks()[0]
    graded = grade(chain, task, [f"<answer>{answer}</answer>"])
    assert graded[0].reward == 0.0 and graded[0].cheating and graded[0].cheating[0].detector


def test_code_run_by_a_sympy_scorer_cannot_pay_itself_or_its_neighbours() -> None:
    # countdown's score_answer parses the answer with sympy (eval), so an answer's code runs in its
    # scoring child. Scored directly (past the host's code-in-answer screen): the child is ended when
    # it walks frames, and what it writes to its standard streams reaches no one.
    environment = build({"dataset": "countdown", "tasks": 3, "eval_tasks": 0})
    task = environment.tasks()[0]
    source, index = task.metadata["source"], task.metadata["index"]
    escape = "__import__('sys')._getframe(1).f_back and 0"  # walks to the frame that holds the key
    forged = '[{"reward": 1.0, "answered": true, "flag": ""}]' * 3
    write = f"__import__('os').write(1, b'{forged}') or __import__('os')._exit(0)"
    honest = "1+1"
    results = environment.grader.grade_sync([{"source": source, "index": index, "text": f"<answer>{text}</answer>"}
                                             for text in (escape, write, honest)])
    entry = reasoning_gym.create_dataset("countdown", size=3, seed=0)[0]
    honest_score = reasoning_gym.create_dataset("countdown", size=3, seed=0).score_answer(honest, entry)
    assert results[0].reward == 0.0 and results[0].flag == "scorer-escape"
    # The forged list went to /dev/null: the writer earns the dataset's score of what it evaluated to.
    assert results[1].reward < 1.0 and results[2].reward == honest_score < 1.0
    environment.close()


def test_an_answer_that_is_not_text_is_refused_in_one_line(chain) -> None:
    task = chain.tasks()[0]
    with pytest.raises(RelayrlError, match=r"answer 0 of task 'rg-0-0' is int, not text"):
        asyncio.run(chain.grade(task, [answered(task, "x")], [7]))


# --------------------------------------------------------------------------------------- config
@pytest.mark.parametrize(("options", "message"), [
    ({"dataset": "chain_sums"}, r"rollout.environment_options.dataset: unknown reasoning-gym dataset 'chain_sums'; "
                                r"did you mean chain_sum"),
    ({"dataset": "chain_sum", "config": {"max_term": 3}},
     r"rollout.environment_options.config.max_term: unknown key for chain_sum; did you mean max_terms\?"),
    ({"dataset": "chain_sum", "config": {"min_terms": 5, "max_terms": 2}},
     r"rollout.environment_options.config: chain_sum refuses this config"),
    ({}, r"rollout.environment_options: set exactly one of dataset .* or mix"),
    ({"dataset": "chain_sum", "mix": [{"name": "gcd"}]}, r"set exactly one of dataset"),
    ({"mix": [{"name": "gcd", "weight": 0}]}, r"rollout.environment_options.mix\[0\].weight: must be a finite number > 0"),
    ({"mix": [{"name": "gcd"}, {"name": "lcmm"}]}, r"rollout.environment_options.mix\[1\].name: unknown reasoning-gym dataset 'lcmm'"),
    ({"dataset": "gcd", "prompt": "no question here"}, r"rollout.environment_options.prompt: must contain \{question\}"),
    ({"dataset": "gcd", "prompt": "{question} {other}"}, r"rollout.environment_options.prompt: not a format string"),
    ({"dataset": "gcd", "answer_tag": "a b"}, r"rollout.environment_options.answer_tag: 'a b' is not a tag name"),
    ({"dataset": "gcd", "answer_format": "first-word"}, r"rollout.environment_options.answer_format"),
    ({"dataset": "gcd", "seed": 0, "tasks": 100, "eval_seed": 50}, r"rollout.environment_options.eval_seed: .* overlap"),
    ({"dataset": "gcd", "tasks": 0}, r"rollout.environment_options.tasks: must be >= 1"),
    ({"dataset": "gcd", "answer_timeout_s": float("inf")}, r"rollout.environment_options.answer_timeout_s: must be a finite"),
    ({"dataset": "gcd", "colour": 1}, r"rollout.environment_options.colour: unknown key"),
])
def test_bad_options_get_one_line_naming_the_key(options, message) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        build(options)
    assert "\n" not in str(caught.value)


def test_a_python_that_lacks_reasoning_gym_is_refused_in_one_line(tmp_path) -> None:
    environment = build({**CHAIN, "python": "/bin/false"})
    task = environment.tasks()[0]
    with pytest.raises(RelayrlError, match=r"rollout.environment_options.python: '/bin/false' in the sandbox fails") as caught:
        grade(environment, task, ["<answer>1</answer>"])
    assert "\n" not in str(caught.value)


def test_the_example_config_validates(tmp_path) -> None:
    from pathlib import Path

    from relayrl.core.config import load_config
    from relayrl.rollout.testing.models import save_tiny_model

    example = Path(__file__).resolve().parents[3] / "examples" / "reasoning.toml"
    config = load_config(example, overrides=[f"model.path='{save_tiny_model(tmp_path / 'model')}'"])
    assert config.rollout.environment == NAME and config.trainer.steps > 0
    options = config.rollout.environment_options
    assert options["answer_format"] == "last-number" and "{question}" in options["prompt"]


def test_defaults_decode() -> None:
    assert ReasoningGymConfig(dataset="gcd").held_out_seed() == 1_000_000_007


def test_without_an_interpreter_that_can_score_a_grader_environment_is_built(monkeypatch) -> None:
    """What a root user whose interpreter lives under /root gets: relayrl builds a world-readable
    environment of /usr/bin/python3 with the host's reasoning-gym release, and the scorer runs there.
    (The host's interpreter and the sandbox's python3 are made to fail here; the build and the probe
    of what it built are real.)"""
    import shutil
    import sys
    import tempfile
    from pathlib import Path

    from relayrl.sandbox import SandboxSection, open_backend
    from relayrl_reasoning_gym import interpreter

    if shutil.which("python3", path="/usr/bin:/bin") is None:
        pytest.skip("no /usr/bin/python3 to build a grader environment from")
    Path("/var/cache").mkdir(exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="relayrl-grader-test-", dir="/var/cache"))  # not /tmp: private in a sandbox
    monkeypatch.setenv("RELAYRL_GRADER_HOME", str(home))
    real_probe = interpreter.probe
    monkeypatch.setattr(interpreter, "probe", lambda backend, python: (None, "made to fail") if python in (
        sys.executable, "python3") else real_probe(backend, python))
    try:
        try:
            python = interpreter.resolve_python(open_backend(section=SandboxSection()), "auto")
        except interpreter.GraderPythonError as exc:
            if "pip" in str(exc) or "could not build" in str(exc):
                pytest.skip(f"cannot install reasoning-gym from the package index here: {exc}")
            raise
        assert python == str(home / f"reasoning-gym-{interpreter.host_release()}" / "bin" / "python3")
        assert real_probe(open_backend(section=SandboxSection()), python) == (interpreter.host_release(), "")
    finally:
        shutil.rmtree(home, ignore_errors=True)
