"""The eval core: per-sample records graded by the real environment, pass rules, resumption, determinism."""

from __future__ import annotations

import asyncio
import json

import msgspec
import pytest

from relayrl.algo.evaluation import pass_at_k
from relayrl.core.wire import CheatingFlag
from relayrl.environments.countdown import ALPHABET, CountdownEnvironment, make_tasks, score
from relayrl.rollout.agent import SingleTurn
from relayrl.rollout.chat import CharTokenizer, RawChatFormat
from relayrl.rollout.demonstrations import ScriptedEngine
from relayrl.rollout.engines.torch_engine import TorchEngine
from relayrl.rollout.evaluation import RecordFile, SampleRecord, completed_tasks, evaluate, sample_seed, summarize
from relayrl.rollout.protocol import SamplingParams
from relayrl.rollout.routing import TokenRecordingProxy

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

TOKENIZER = CharTokenizer(ALPHABET, specials=["<pad>", "<bos>", "<|end|>"])
CHAT = RawChatFormat(TOKENIZER)


def solver(tasks):
    """A scripted player that solves countdown tasks with an even target (the others get a wrong
    answer); it also counts the requests it served, by task."""
    by_prompt = {task.instruction: task for task in tasks}
    served: list[str] = []

    def reply(group_id: str, context: str) -> str:
        task = next(task for prompt, task in by_prompt.items() if context.endswith(prompt))
        served.append(task.task_id)
        return task.answer if task.metadata["target"] % 2 == 0 else "1+1"

    return reply, served


def run(tasks, engine, environment, **options):
    return asyncio.run(evaluate(tasks, harness=SingleTurn(SingleTurn.Config(max_tokens=8)),
                                proxy=TokenRecordingProxy(engine), chat=CHAT, sampling=SamplingParams(),
                                grader=environment, tools=environment.tools, **options))


def test_records_are_graded_in_the_sandbox_in_task_order_and_pass_at_k_follows():
    tasks = make_tasks(6, seed=5)
    reply, served = solver(tasks)
    environment = CountdownEnvironment()
    records = run(tasks, ScriptedEngine(TOKENIZER, reply), environment, samples=3, concurrency=4)
    assert [(record.task_id, record.sample) for record in records] == [(task.task_id, s) for task in tasks for s in range(3)]
    for task in tasks:
        mine = [record for record in records if record.task_id == task.task_id]
        expected = score(task.metadata["numbers"], task.metadata["target"],
                         task.answer if task.metadata["target"] % 2 == 0 else "1+1")
        assert [record.reward for record in mine] == [expected] * 3
        assert all(record.passed == (expected == 1.0) and record.turns == 1 and record.generated_tokens > 0
                   for record in mine)
        answer = task.answer if task.metadata["target"] % 2 == 0 else "1+1"
        assert all(record.final_text == answer and record.versions == [0, 0] for record in mine)
    assert environment.sandbox_calls >= 1 and len(served) == 18
    # Every sample has its own seed, stable for (seed, task, sample).
    assert len({record.seed for record in records}) == 18
    assert records[0].seed == sample_seed(0, tasks[0].task_id, 0) != sample_seed(1, tasks[0].task_id, 0)
    summary = summarize(records, [1, 3])
    solved = sum(task.metadata["target"] % 2 == 0 for task in tasks)
    assert summary["overall"]["pass@1"] == pytest.approx(solved / 6)
    assert summary["overall"]["passed_samples"] == 3 * solved
    tokens = sum(record.generated_tokens for record in records)
    assert summary["overall"]["tokens_per_solved"] == pytest.approx(tokens / (3 * solved))
    assert [task["pass@3"] for task in summary["tasks"]] == [pass_at_k(3, 3 * (t.metadata["target"] % 2 == 0), 3)
                                                             for t in tasks]


class FlaggingGrader:
    """Full reward for everything, and a detector flag on sample 1 (a unit test of the pass rule)."""

    async def grade(self, task, trajectories, answers):
        return [msgspec.structs.replace(trajectory, reward=1.0, cheating=[
            CheatingFlag(detector="test-tamper", evidence="wrote the tests")] if trajectory.sample_index == 1 else [])
            for trajectory in trajectories]


def test_a_flagged_sample_fails_whatever_its_reward_and_is_listed():
    tasks = make_tasks(2, seed=1)
    reply, _ = solver(tasks)
    environment = CountdownEnvironment()
    records = asyncio.run(evaluate(tasks, samples=2, harness=SingleTurn(SingleTurn.Config(max_tokens=8)),
                                   proxy=TokenRecordingProxy(ScriptedEngine(TOKENIZER, reply)), chat=CHAT,
                                   sampling=SamplingParams(), grader=FlaggingGrader(), tools=environment.tools))
    assert [record.passed for record in records] == [True, False, True, False]
    assert records[1].flags == ["test-tamper"] and records[1].reward == 1.0
    summary = summarize(records, [1])
    assert summary["overall"]["pass@1"] == 0.5 and summary["overall"]["flagged_samples"] == 2
    assert [(item["task_id"], item["sample"]) for item in summary["flagged"]] == [(tasks[0].task_id, 1),
                                                                                   (tasks[1].task_id, 1)]


def test_tasks_with_a_category_are_also_summarised_per_category():
    def record(task_id, sample, reward):
        return SampleRecord(task_id=task_id, sample=sample, seed=0, reward=reward, passed=reward >= 1.0)

    records = [record("a1", 0, 1.0), record("a1", 1, 0.0), record("a2", 0, 0.0), record("a2", 1, 0.0),
               record("b1", 0, 1.0), record("b1", 1, 1.0)]
    summary = summarize(records, [1, 2], categories={"a1": "sums", "a2": "sums", "b1": "legs"})
    assert summary["by_category"] == {
        "legs": {"tasks": 1, "samples": 2, "pass@1": 1.0, "pass@2": 1.0, "mean_reward": 1.0},
        "sums": {"tasks": 2, "samples": 4, "pass@1": 0.25, "pass@2": 0.5, "mean_reward": 0.25}}
    assert "by_category" not in summarize(records, [1])


def test_a_resumed_eval_runs_only_the_tasks_without_all_their_records(tmp_path):
    tasks = make_tasks(5, seed=2)
    reply, served = solver(tasks)
    environment = CountdownEnvironment()
    records_file = RecordFile(tmp_path / "samples.jsonl")
    first = run(tasks[:3], ScriptedEngine(TOKENIZER, reply), environment, samples=2,
                on_task=lambda index, task, group, records: records_file.append(records))
    # A kill mid-write leaves half a line, and a task with only some of its samples recorded.
    with open(records_file.path, "ab") as handle:
        handle.write(msgspec.json.encode(first[0])[:-5])
    assert records_file.read() == first  # the torn line is dropped...
    assert records_file.path.read_bytes().endswith(b"\n")  # ...and cut off the file
    records_file.append([msgspec.structs.replace(first[0], task_id=tasks[3].task_id)])  # task 3: one of two samples
    done = completed_tasks(records_file.read(), samples=2)
    assert done == {task.task_id for task in tasks[:3]}
    served.clear()
    rest = run(tasks, ScriptedEngine(TOKENIZER, reply), environment, samples=2, skip=done)
    assert sorted(set(served)) == sorted(task.task_id for task in tasks[3:])
    assert [record.task_id for record in rest] == [tasks[3].task_id] * 2 + [tasks[4].task_id] * 2


def test_the_record_file_round_trips_and_summaries_refuse_impossible_k(tmp_path):
    record = SampleRecord(task_id="t", sample=0, seed=1, reward=0.5, passed=False, flags=["x"], tool_seconds=0.25)
    records_file = RecordFile(tmp_path / "deep" / "samples.jsonl")
    records_file.append([record, msgspec.structs.replace(record, sample=1, passed=True)])
    assert [json.loads(line)["sample"] for line in records_file.path.read_text().splitlines()] == [0, 1]
    assert records_file.read()[0] == record
    with pytest.raises(ValueError, match="at least 3 samples"):
        summarize(records_file.read(), [3])
    with pytest.raises(ValueError, match="at least 1 sample"):
        asyncio.run(evaluate([], samples=0, harness=None, proxy=None, chat=CHAT, sampling=SamplingParams(),
                             grader=None))


def test_a_real_engine_samples_the_same_tokens_at_any_concurrency(tmp_path):
    """Per-sample seeds: batch composition (which tasks share a decode step) does not change a sample."""
    from relayrl.rollout.config import ModelSection
    from relayrl.rollout.models import load_tokenizer, materialize_model

    model_dir = materialize_model(ModelSection(tokenizer="char", init={"hidden_size": 32, "num_hidden_layers": 1}),
                                  tmp_path / "model", alphabet=ALPHABET)
    tokenizer = load_tokenizer(model_dir)
    chat = RawChatFormat(tokenizer)
    tasks = make_tasks(4, seed=9)
    environment = CountdownEnvironment()

    def tokens(concurrency: int, seed: int = 7) -> dict[tuple[str, int], list[int]]:
        engine = TorchEngine.from_pretrained(str(model_dir), engine_id="e", max_batch=16, seed=concurrency)
        sampled: dict[tuple[str, int], list[int]] = {}

        def keep(index, task, group, records):
            for trajectory in group.trajectories:
                spans = [turn.generated for segment in trajectory.segments for turn in segment.turns if turn.generated]
                sampled[task.task_id, trajectory.sample_index] = [int(t) for span in spans for t in span.token_ids()]

        asyncio.run(evaluate(tasks, samples=3, harness=SingleTurn(SingleTurn.Config(max_tokens=6)),
                             proxy=TokenRecordingProxy(engine), chat=chat, sampling=SamplingParams(),
                             grader=environment, tools=environment.tools, concurrency=concurrency, seed=seed,
                             on_task=keep))
        return sampled

    one_at_a_time = tokens(1)
    assert len(one_at_a_time) == 12 and all(one_at_a_time.values())
    assert tokens(4) == one_at_a_time
    assert tokens(1, seed=8) != one_at_a_time  # the eval's seed does reach the engine


def test_held_out_prompts_never_reach_training_even_under_another_task_id():
    from relayrl.environments.countdown import CountdownConfig
    from relayrl.rollout.evaluation import split_tasks

    environment = CountdownEnvironment(CountdownConfig(tasks=3000, eval_tasks=100))
    training, held_out = split_tasks(environment)
    prompts = {task.instruction for task in held_out}
    assert len(held_out) == 100 and not prompts & {task.instruction for task in training}
    # Countdown's space of prompts is small: the two seeds do repeat prompts, and those left training.
    assert 0 < 3000 - len(training) < 3000 // 2

    from relayrl.rollout.environment import Environment

    class NoHeldOut(Environment):  # the contract's default: no held-out tasks
        def tasks(self):
            return make_tasks(5, seed=0)

    assert split_tasks(NoHeldOut()) == (make_tasks(5, seed=0), [])


class ProgressStore:
    """The bus as the evaluator reads it: the trainer's progress record (a unit-test stand-in)."""

    def __init__(self):
        self.step = 0

    def get(self, key):
        from relayrl.buffer.progress import PROGRESS_KEY, Progress
        from relayrl.core import codec

        assert key == PROGRESS_KEY
        return codec.encode(Progress(step=self.step, version=self.step + 1))


def test_the_periodic_evaluator_follows_the_trainer_and_resumes_its_schedule(tmp_path):
    from relayrl.rollout.config import EvalSection
    from relayrl.rollout.periodic_eval import PeriodicEval, read_results

    tasks = make_tasks(4, seed=11)
    reply, served = solver(tasks)
    environment = CountdownEnvironment()
    store = ProgressStore()
    section = EvalSection(every_steps=5, tasks=3, samples=2)

    def evaluator():
        return PeriodicEval(section, tasks, harness=SingleTurn(SingleTurn.Config(max_tokens=8)),
                            proxy=TokenRecordingProxy(ScriptedEngine(TOKENIZER, reply)), chat=CHAT,
                            sampling=SamplingParams(), grader=environment, tools=environment.tools, store=store,
                            results_dir=tmp_path, poll_s=0.01)

    async def follow(periodic, steps):
        runner = asyncio.create_task(periodic.run())
        for step in steps:
            store.step = step
            await asyncio.sleep(0.3)
        runner.cancel()

    first = evaluator()
    assert first.metrics() == {}
    asyncio.run(follow(first, [0, 2, 4, 6, 7]))  # due at 0 (before any step), then at 6 (>= 0 + 5)
    results = read_results(tmp_path)
    assert [result["step"] for result in results] == [0, 6] and len(set(served)) == 3  # only the first 3 tasks
    solved = sum(task.metadata["target"] % 2 == 0 for task in tasks[:3]) / 3
    assert results[0]["pass@1"] == pytest.approx(solved) and results[0]["samples"] == 6
    assert results[1]["version"] == 7 and set(results[0]) >= {"pass@2", "versions", "time", "wall_s"}
    assert first.metrics()["eval/step"] == 6.0 and first.metrics()["eval/pass@1"] == pytest.approx(solved)
    assert (tmp_path / "step-000006.jsonl").read_text().count("\n") == 6
    # A restarted rollout process picks the schedule up where the file left it.
    resumed = evaluator()
    assert resumed.metrics()["eval/step"] == 6.0 and not resumed.due(10) and resumed.due(11)


def test_a_task_file_replaces_the_generated_training_pool_but_not_the_held_out_tasks(tmp_path):
    from relayrl.environments.code_search import CodeSearchConfig, CodeSearchEnvironment
    from relayrl.environments.countdown import CountdownConfig

    chosen = make_tasks(30, seed=4)[::3]
    path = tmp_path / "filtered.jsonl"
    path.write_text("".join(msgspec.json.encode(task).decode() + "\n" for task in chosen))
    environment = CountdownEnvironment(CountdownConfig(task_file=str(path)))
    assert environment.tasks() == chosen
    assert environment.eval_tasks() == CountdownEnvironment().eval_tasks()
    search = CodeSearchEnvironment(CodeSearchConfig(tasks=3, eval_tasks=2))
    searched = tmp_path / "search.jsonl"
    searched.write_text("".join(msgspec.json.encode(task).decode() + "\n" for task in search.tasks()))
    assert CodeSearchEnvironment(CodeSearchConfig(task_file=str(searched), eval_tasks=2)).tasks() == search.tasks()
