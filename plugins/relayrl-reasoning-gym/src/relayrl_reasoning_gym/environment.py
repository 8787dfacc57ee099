"""reasoning-gym datasets as a relayrl environment (``environment = "reasoning-gym"``).

A task is one entry of a reasoning-gym dataset (a dataset by name with its difficulty knobs, or a
weighted mix of several), its question put into :attr:`ReasoningGymConfig.prompt`, which says how
to answer: by default the final answer between ``<answer>`` and ``</answer>`` tags, and nothing
else (``answer_format`` offers the whole reply, its last line or its last number instead). The reward
is the dataset's own ``score_answer`` (0 to 1) on the answer found in the episode's final message,
computed in a sandbox (:mod:`relayrl_reasoning_gym.scorer`): no answer found, no reward. Training tasks and held-out tasks come from disjoint seeds (entry ``i`` of a
dataset seeded ``s`` is generated from ``Random(s + i)``, so the two seed ranges never overlap), and
a training task whose question is also a held-out one is dropped (``split_tasks``).

    [rollout]
    environment = "reasoning-gym"
    environment_options = { dataset = "chain_sum", config = { min_terms = 2, max_terms = 2 } }
    # or a mix, each dataset with its weight and knobs:
    # environment_options = { mix = [{ name = "chain_sum", weight = 2 }, { name = "leg_counting" }] }

Each task's metadata names its dataset (``category``), so ``relayrl eval`` reports pass@k per dataset
of a mix.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Sequence
from typing import Any, Literal

import msgspec

from relayrl.core.config import Section
from relayrl.core.errors import ConfigError, RelayrlError
from relayrl.core.plugins import PluginManager
from relayrl.core.wire import CheatingFlag, TaskSpec, Trajectory
from relayrl.rollout.environment import Environment

__all__ = ["DEFAULT_PROMPT", "MixEntry", "ReasoningGymConfig", "ReasoningGymEnvironment"]

DEFAULT_PROMPT = "{question}\n\nGive only the final answer, between <answer> and </answer> tags."
"""The user message of a task: the dataset's question, then the answer format."""

EVAL_SEED_OFFSET = 1_000_000_007
"""Held-out tasks are seeded ``seed + EVAL_SEED_OFFSET`` unless ``eval_seed`` says otherwise."""

MAX_ANSWER_CHARS = 4000
"""Of an episode's final message, the scorer sees at most the last this many characters."""


class MixEntry(Section, kw_only=True):
    """One dataset of a mix: its reasoning-gym name, its sampling weight and its config (knobs)."""

    name: str
    weight: float = 1.0
    config: dict[str, Any] = {}


class ReasoningGymConfig(Section, kw_only=True):
    """Options of the ``reasoning-gym`` environment (``[rollout.environment_options]``)."""

    dataset: str = ""
    """A reasoning-gym dataset by name (``chain_sum``, ``leg_counting`` ...); or use ``mix``."""
    config: dict[str, Any] = {}
    """The dataset's config: its difficulty knobs (``min_terms``, ``max_digits`` ...)."""
    mix: list[MixEntry] = []
    """Several datasets, each drawn with probability proportional to its weight."""
    tasks: int = 10000
    """Training tasks (the prompt scheduler cycles through them)."""
    eval_tasks: int = 200
    """Held-out tasks for ``relayrl eval`` and ``[eval]``."""
    seed: int = 0
    """Seed of the training tasks."""
    eval_seed: int | None = None
    """Seed of the held-out tasks (default ``seed + 1000000007``); its range must not meet the training one."""
    prompt: str = DEFAULT_PROMPT
    """The user message; ``{question}`` is replaced by the dataset's question."""
    answer_format: Literal["tag", "whole", "last-line", "last-number"] = "tag"
    """Where the answer is in the final message: between the last ``<answer_tag>`` ... ``</answer_tag>``
    (``tag``), the whole message (``whole``), its last non-empty line (``last-line``) or its last number
    (``last-number``, for numeric datasets). ``prompt`` must ask for the same."""
    answer_tag: str = "answer"
    """The tag of ``answer_format = "tag"``."""
    task_file: str = ""
    """Train on a task set written by ``relayrl data filter`` (JSONL of TaskSpecs) instead of ``tasks``."""
    python: str = "auto"
    """The interpreter the sandboxed scorer runs (``auto``: see :mod:`relayrl_reasoning_gym.interpreter`)."""
    grade_window_s: float = 0.05
    """Answers arriving within this window are scored by one sandbox command."""
    answer_timeout_s: float = 10.0
    """Scoring one answer may take this long; past it the answer earns 0 (flag ``scorer-timeout``)."""

    def check(self, pm: PluginManager | None, path: str) -> None:
        if bool(self.dataset) == bool(self.mix):
            raise ConfigError(f"{path}: set exactly one of dataset (one reasoning-gym dataset) or mix (several)")
        if self.dataset:
            _check_dataset(self.dataset, self.config, f"{path}.dataset", f"{path}.config")
        names = [entry.name for entry in self.mix]
        for index, entry in enumerate(self.mix):
            where = f"{path}.mix[{index}]"
            _check_dataset(entry.name, entry.config, f"{where}.name", f"{where}.config")
            if not entry.weight > 0 or entry.weight == float("inf"):
                raise ConfigError(f"{where}.weight: must be a finite number > 0, got {entry.weight}")
            if names.count(entry.name) > 1:
                raise ConfigError(f"{where}.name: {entry.name!r} appears twice in the mix (give it one weight)")
        for key in ("tasks", "eval_tasks"):
            if getattr(self, key) < (1 if key == "tasks" else 0):
                raise ConfigError(f"{path}.{key}: must be >= {1 if key == 'tasks' else 0}, got {getattr(self, key)}")
        if "{question}" not in self.prompt:
            raise ConfigError(f"{path}.prompt: must contain {{question}} (where the dataset's question goes)")
        try:
            self.prompt.format(question="")
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(f"{path}.prompt: not a format string with only {{question}} ({exc}); "
                              "write literal braces as {{ and }}") from None
        if not self.answer_tag or not self.answer_tag.replace("_", "").replace("-", "").isalnum():
            raise ConfigError(f"{path}.answer_tag: {self.answer_tag!r} is not a tag name (letters, digits, - and _)")
        train, held = self.seed_ranges()
        if held[1] > 0 and train[0] < held[1] and held[0] < train[1]:
            raise ConfigError(f"{path}.eval_seed: held-out seeds {held[0]}..{held[1] - 1} overlap the training seeds "
                              f"{train[0]}..{train[1] - 1}; pick one at least {train[1]}")
        for key in ("grade_window_s", "answer_timeout_s"):
            value = getattr(self, key)
            if not 0 <= value < float("inf") or (key == "answer_timeout_s" and value == 0):
                raise ConfigError(f"{path}.{key}: must be a finite number of seconds{' > 0' if value == 0 else ' >= 0'}, "
                                  f"got {value}")

    def seed_ranges(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """The ``Random`` seeds the training and the held-out entries use, as half-open ranges.

        Entry ``i`` of a dataset seeded ``s`` uses ``s + i``; in a mix, dataset ``j`` is seeded
        ``s + j + 1`` and entry ``i`` picks its dataset with ``Random(s + i)``.
        """
        spread = len(self.mix) + 1
        eval_seed = self.held_out_seed()
        return (self.seed, self.seed + self.tasks + spread), (eval_seed, eval_seed + self.eval_tasks + spread)

    def held_out_seed(self) -> int:
        return self.seed + EVAL_SEED_OFFSET if self.eval_seed is None else self.eval_seed


def _check_dataset(name: str, config: dict[str, Any], name_path: str, config_path: str) -> None:
    """A ConfigError naming the key when ``name`` is no reasoning-gym dataset or ``config`` does not fit it."""
    from reasoning_gym.factory import DATASETS

    if name == "composite":
        raise ConfigError(f"{name_path}: use mix = [...] for several datasets, not 'composite'")
    if name not in DATASETS:
        close = difflib.get_close_matches(name, sorted(DATASETS), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else f" ({len(DATASETS)} datasets: see reasoning_gym.factory.DATASETS)"
        raise ConfigError(f"{name_path}: unknown reasoning-gym dataset {name!r}{hint}")
    _, config_class = DATASETS[name]
    fields = {field.name for field in dataclasses.fields(config_class)} - {"size", "seed"}
    for key in config:
        if key not in fields:
            close = difflib.get_close_matches(key, sorted(fields), n=1)
            hint = f"; did you mean {close[0]}?" if close else f" ({name} takes: {', '.join(sorted(fields))})"
            raise ConfigError(f"{config_path}.{key}: unknown key for {name}{hint}")
    try:
        _create(name, config, size=1, seed=0)[0]
    except Exception as exc:  # reasoning-gym validates with asserts and ValueErrors
        raise ConfigError(f"{config_path}: {name} refuses this config: {type(exc).__name__}: {exc}".rstrip(": ")) from None


def _create(name: str, config: dict[str, Any], *, size: int, seed: int) -> Any:
    """The dataset in this process (to validate a config; tasks are made by ``generate_entries``)."""
    import reasoning_gym

    return reasoning_gym.create_dataset(name, size=size, seed=seed, **config)


class ReasoningGymEnvironment(Environment):
    """Tasks from reasoning-gym, scored by each dataset's own ``score_answer`` in a sandbox."""

    Config = ReasoningGymConfig

    def __init__(self, config: ReasoningGymConfig | None = None, *, sandbox: Any = None, pm: PluginManager | None = None) -> None:
        from relayrl_reasoning_gym.grading import ScorerGrader
        from relayrl_reasoning_gym.interpreter import resolve_python

        self.config = config or ReasoningGymConfig(dataset="chain_sum")
        self.config.check(pm, "rollout.environment_options")
        self.grader = ScorerGrader(python=lambda backend: resolve_python(backend, self.config.python),
                                   answer_format=self.config.answer_format, tag=self.config.answer_tag,
                                   timeout_s=self.config.answer_timeout_s,
                                   sandbox=sandbox, pm=pm, window_s=self.config.grade_window_s)
        self.counts = {"answered": 0, "unanswered": 0, "flagged": 0, "correct": 0}
        self._made: dict[str, list[TaskSpec]] = {}

    # ------------------------------------------------------------------ tasks
    def _source(self, split: str) -> dict[str, Any]:
        """What the scorer regenerates a split's entries from (dataset, knobs, size, seed)."""
        config = self.config
        size, seed = (config.tasks, config.seed) if split == "train" else (config.eval_tasks, config.held_out_seed())
        if config.mix:
            return {"name": "composite", "config": {}, "size": size, "seed": seed,
                    "datasets": [{"name": entry.name, "weight": entry.weight, "config": dict(entry.config)}
                                 for entry in config.mix]}
        return {"name": config.dataset, "config": dict(config.config), "size": size, "seed": seed}

    def _make(self, split: str) -> list[TaskSpec]:
        """The split's tasks, generated once per environment (some datasets take a while per entry)."""
        if split not in self._made:
            self._made[split] = self._generate(split)
        return list(self._made[split])

    def _generate(self, split: str) -> list[TaskSpec]:
        from relayrl_reasoning_gym.grading import generate_entries

        source = self._source(split)
        if source["size"] == 0:
            return []
        prefix = "rg" if split == "train" else "rg-eval"
        return [TaskSpec(task_id=f"{prefix}-{source['seed']}-{index}",
                         instruction=self.config.prompt.format(question=entry["question"]), kind="answer",
                         answer=entry["answer"], metadata={"category": entry["category"], "source": source,
                                                           "index": index, "difficulty": entry["difficulty"]})
                for index, entry in enumerate(generate_entries(source))]

    def tasks(self) -> list[TaskSpec]:
        if self.config.task_file:
            from relayrl.sandbox import load_tasks

            return list(load_tasks(self.config.task_file))
        return self._make("train")

    def eval_tasks(self) -> list[TaskSpec]:
        return self._make("eval")

    def demonstration(self, task: TaskSpec) -> str | None:
        """The dataset's reference answer in the asked format (for a supervised warm-up, if one is wanted)."""
        if task.answer is None:
            return None
        tag = self.config.answer_tag
        return f"<{tag}>{task.answer}</{tag}>" if self.config.answer_format == "tag" else str(task.answer)

    def tools(self, task: TaskSpec) -> Any:
        from relayrl.rollout.environment import no_tools

        return no_tools(task)

    # ------------------------------------------------------------------ grading
    async def grade(self, task: TaskSpec, trajectories: Sequence[Trajectory], answers: Sequence[str]) -> list[Trajectory]:
        from relayrl.rollout.environment import final_text, with_rewards
        from relayrl_reasoning_gym.detectors import code_in_answer
        from relayrl_reasoning_gym.scorer import extract_answer

        if "source" not in task.metadata or "index" not in task.metadata:
            raise RelayrlError(f"reasoning-gym: task {task.task_id!r} has no source/index metadata (not a reasoning-gym task)")
        texts = []
        for position, (trajectory, answer) in enumerate(zip(trajectories, answers)):
            if not isinstance(answer, str):
                raise RelayrlError(f"reasoning-gym: answer {position} of task {task.task_id!r} is "
                                   f"{type(answer).__name__}, not text")
            text = answer or final_text(trajectory)
            texts.append(text[-MAX_ANSWER_CHARS:])
        items = [{"source": task.metadata["source"], "index": task.metadata["index"], "text": text} for text in texts]
        results: list[Any] = await self.grader.grade(items)
        graded = []
        for trajectory, text, result in zip(trajectories, texts, results):
            extracted = extract_answer(text, self.config.answer_format, self.config.answer_tag)
            evidence = code_in_answer(extracted) if extracted is not None else ""
            flags = [CheatingFlag(detector="code-in-answer", evidence=evidence)] if evidence else []
            if result.flag:
                flags.append(CheatingFlag(detector=result.flag, evidence=(extracted or "")[:500]))
            reward = 0.0 if flags else float(result.reward)
            self.counts["answered" if result.answered else "unanswered"] += 1
            self.counts["flagged"] += bool(flags)
            self.counts["correct"] += reward >= 1.0
            graded.append(msgspec.structs.replace(
                with_rewards(trajectory, reward, correct=float(reward >= 1.0), answered=float(result.answered)),
                cheating=[*trajectory.cheating, *flags]))
        return graded

    def metrics(self) -> dict[str, float]:
        return {**self.grader.metrics(), **{f"reasoning_gym/{key}": float(value) for key, value in self.counts.items()}}

    def close(self) -> None:
        self.grader.close()
