"""Code search: a multi-turn, tool-using task sized for a model of a million parameters on a CPU.

Each task is a generated repository (a few small Python files, in a few directories or flat) and a question
naming identifiers: ``"find: qz4 mb7"`` asks for every file that mentions ``qz4`` or ``mb7``.
Nothing in the prompt says where they are, and the file names are random: the only way to the
answer is through the tools (``grep``, ``read_file``, ``list``), which run in the agent's own
sandbox. Several calls in one turn run in parallel. The agent answers with the files, e.g.
``"src/kobe.py lib/tamu.py"``; the reward is the F1 of the files it names against the truth (the
code-search evaluation of the seeds' SWE-grep), computed by a grading script in a sandbox: the
answer is untrusted model output and is never parsed on the host.

**Demonstrations.** The supervised warm-up trains on trajectories of scripted players
(:func:`expert_reply`, played by :func:`relayrl.rollout.demonstrations.play_scripted`) through the
real agent harness against real sandboxes: their tool calls get the tools' real results, and when
the harness asks them to compact they write a summary (the files seen, the identifiers still to
search) and continue from it in a new segment, exactly as a policy must. Each demonstration task
draws one of :data:`STYLES` (``demonstration_styles`` weights them): an expert that searches every
identifier at once (``parallel``) or one per turn (``sequential``), a wasteful one that first lists
the repository, which tells it nothing (file names are random), then searches like ``parallel``
(``list-first``), a verbose one that searches like ``parallel`` and names every file twice in its
answer (``verbose``: the same F1, more tokens), or a careless player that stops after its first search (``early-stop``) or
answers at once without looking (``no-search``, naming no file). The default mixes only the
experts; a mixture with careless players teaches the format of every action without the strategy,
and leaves RL to find out, from the grader's reward alone, that searching everything pays. The
wasteful player succeeds too, at a higher cost (a turn, a call, a listing in the context), and the
verbose one exactly as often, at a cost only in tokens: a length penalty is what tells them apart
from the parallel expert (the grader cannot: it scores the set of files named).

**Splits.** Training tasks come from ``seed``, held-out evaluation tasks from a different stream.
Every task draws its file names, its identifiers and their places anew (from a fixed vocabulary the
tokenizer holds as single tokens), so one task's answer says nothing about another's.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import math
import random
import re
import string
import tempfile
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from relayrl.core.config import ConfigError, Section
from relayrl.core.plugins import PluginManager
from relayrl.core.wire import TaskSpec, Trajectory
from relayrl.rollout.demonstrations import asked_to_compact, play_expert
from relayrl.rollout.environment import Environment

__all__ = ["ALPHABET", "SPECIALS", "STYLES", "CodeSearchConfig", "CodeSearchEnvironment", "expert_reply", "make_tasks",
           "score_answer"]

ALPHABET = string.ascii_lowercase + string.digits + " _.,:/{}[]()\"'=+-*<>!?#\n\t"
"""Every character of prompts, tool calls, tool results and answers (the character tokenizer's)."""

MARKUP = ("<tool_call>", "</tool_call>", '{"name": "', '", "arguments": {', '"pattern": "', '"path": "', '"}}',
          "grep", "read_file", "list", " exit=0 time=", " exit=0", "find: ", "summary:", "compact:", "seen ", " todo ", ".py")
"""Markup the tokenizer keeps whole: tool-call JSON, tool names, the result header, the file suffix."""

NO_ANSWER = "none"
"""What a ``no-search`` player answers (it names no file: reward 0). Not a made-up path: a player
that guesses paths teaches the warm-up to write paths it has not seen, which spoils copying them."""

STYLES = ("parallel", "sequential", "list-first", "verbose", "early-stop", "no-search")
"""How a demonstration plays (see the module docstring); the first three always solve the task."""

_DIRECTORIES = ("src", "lib", "app", "core", "util", "api", "web", "db", "cli", "io")
_CONSONANTS, _VOWELS = "bdfgklmnprstvz", "aeiou"
_PATTERN = re.compile(r'"pattern": "([a-z0-9]+)"')
_RESULT_LINE = re.compile(r"^\./([\w./-]+):\d+:", re.MULTILINE)


# --------------------------------------------------------------------------------------- tasks
def _vocabulary() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The file words (two syllables) and identifiers (two letters and a digit: no keyword or file
    name contains one, so a search for it finds only it) repositories are written with."""
    rng = random.Random(20261201)
    words: dict[str, None] = {}
    while len(words) < 32:
        words["".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(2))] = None
    identifiers: dict[str, None] = {}
    while len(identifiers) < 32:
        identifiers[rng.choice(string.ascii_lowercase) + rng.choice(string.ascii_lowercase) + rng.choice(string.digits)] = None
    return tuple(words), tuple(identifiers)


WORDS, IDENTIFIERS = _vocabulary()


def _word(rng: random.Random) -> str:
    return rng.choice(WORDS)


def _identifier(rng: random.Random) -> str:
    return rng.choice(IDENTIFIERS)


def _line(rng: random.Random, first: str, second: str) -> str:
    return rng.choice((f"def {first}(): return {second}()", f"{first} = {second} + 1",
                       f"from . import {first}, {second}", f"if {first}: {second}()",
                       f"for {first} in {second}(): pass", f"class {first}({second}): pass"))


def make_task(rng: random.Random, task_id: str, *, files: tuple[int, int], queries: tuple[int, int],
              styles: dict[str, float] | None = None, directories: int = 3) -> TaskSpec:
    """One task: a repository of ``files`` (min, max) files and ``queries`` (min, max) identifiers asked,
    spread over ``directories`` directories (0: every file at the top level).

    Its demonstration plays one of :data:`STYLES`, drawn with the weights ``styles`` (default: the
    two experts, equally).
    """
    count = rng.randint(*files)
    chosen = rng.sample(_DIRECTORIES, k=min(directories, len(_DIRECTORIES)))
    paths: list[str] = []
    while len(paths) < count:
        path = f"{rng.choice(chosen)}/{_word(rng)}.py" if chosen else f"{_word(rng)}.py"
        if path not in paths:
            paths.append(path)
    identifiers: list[str] = []
    while len(identifiers) < count + 3:
        name = _identifier(rng)
        if name not in identifiers:
            identifiers.append(name)
    asked = identifiers[: rng.randint(*queries)]
    filler = identifiers[len(asked):]
    # Each asked identifier lives in one or two files; every file has two lines of filler besides.
    homes = {name: rng.sample(paths, k=rng.choice((1, 1, 2))) for name in asked}
    contents: dict[str, list[str]] = {path: [] for path in paths}
    for path in paths:
        contents[path] += [_line(rng, *rng.sample(filler, 2)) for _ in range(2)]
    for name, where in homes.items():
        for path in where:
            contents[path].insert(rng.randrange(len(contents[path]) + 1), _line(rng, name, rng.choice(filler)))
    truth = sorted({path for where in homes.values() for path in where})
    weights = styles or {"parallel": 1.0, "sequential": 1.0}
    style = rng.choices(list(weights), weights=list(weights.values()))[0]
    return TaskSpec(task_id=task_id, instruction=f"find: {' '.join(asked)}", kind="code-search", answer=truth,
                    metadata={"files": {path: "\n".join(lines) + "\n" for path, lines in contents.items()},
                              "identifiers": asked, "style": style})


def make_tasks(count: int, *, seed: int, prefix: str = "cs", files: tuple[int, int] = (4, 7),
               queries: tuple[int, int] = (2, 2), styles: dict[str, float] | None = None,
               directories: int = 3) -> list[TaskSpec]:
    """``count`` tasks from a generator seeded with ``seed`` (the same seed gives the same tasks)."""
    rng = random.Random(seed)
    return [make_task(rng, f"{prefix}-{index}", files=files, queries=queries, styles=styles, directories=directories)
            for index in range(count)]


def write_repository(task: TaskSpec, directory: Path) -> Path:
    """Write ``task``'s generated repository into ``directory`` (created); return it."""
    for path, text in task.metadata["files"].items():
        target = directory / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return directory


PATHS = tuple(f"{directory}/{word}.py" for directory in _DIRECTORIES for word in WORDS)
"""Every path a repository can hold (320)."""

SPECIALS = (*MARKUP, *PATHS, *_DIRECTORIES, *WORDS, *IDENTIFIERS)
"""Strings the character tokenizer keeps whole, as a small BPE vocabulary trained on this task's
text would: the markup, the paths, and the directory names, file words and identifiers repositories
are made of (a path is one token; its parts stay tokens for text that splits it). A call is then
eight tokens instead of seventy characters; the model still writes every call and answer itself,
and the harness parses the text they decode to."""


# --------------------------------------------------------------------------------------- grading
def score_answer(answer: str, truth: list[str]) -> float:
    """F1 of the files named in ``answer`` against ``truth`` (runs in the sandbox; tests call it too).

    A file is a token with a ``.py`` suffix (``./`` removed); naming every file of the repository is
    not rewarded, and an answer naming none earns 0.
    """
    import re as _re

    tokens = [token.rstrip(".") for token in _re.findall(r"[\w./-]+", answer)]
    named = {token[2:] if token.startswith("./") else token for token in tokens if token.endswith(".py")}
    hits = len(named & set(truth))
    if not named or hits == 0:
        return 0.0
    precision, recall = hits / len(named), hits / len(truth)
    return 2 * precision * recall / (precision + recall)


# Runs inside the sandbox: reads [{"answer": "...", "truth": [...]}] on stdin, prints one reward per answer.
GRADE_SCRIPT = inspect.getsource(score_answer) + r"""
import json, sys
print(json.dumps([score_answer(item["answer"], item["truth"]) for item in json.load(sys.stdin)]))
"""


# --------------------------------------------------------------------------------------- the expert
def _call(identifier: str) -> str:
    return f"<tool_call>{json.dumps({'name': 'grep', 'arguments': {'pattern': identifier}})}</tool_call>"


def expert_reply(task: TaskSpec, context: str, *, compaction_prompt: str, summary_header: str) -> str:
    """What the expert says next in ``context`` (the current segment's text, up to its turn).

    Per the task's ``style`` (:data:`STYLES`), it lists the repository first (``list-first``), searches
    every identifier not searched yet (all at once, or the first), answers with the files the results
    named once none is left (or, when careless, after its first search, or at once with
    :data:`NO_ANSWER`), and when asked to compact, writes ``seen FILES todo IDENTIFIERS``.
    """
    asked: list[str] = task.metadata["identifiers"]
    summary = context.split(summary_header, 1)[1] if summary_header and summary_header in context else ""
    searched = set(_PATTERN.findall(context))
    seen = list(dict.fromkeys(_RESULT_LINE.findall(context)))
    if summary:
        remembered, _, todo = summary.partition(" todo ")
        seen = list(dict.fromkeys(remembered.removeprefix("\n").removeprefix("seen").split() + seen))
        searched |= set(asked) - set(todo.split())
    remaining = [identifier for identifier in asked if identifier not in searched]
    if asked_to_compact(context, compaction_prompt):
        return f"seen {' '.join(seen)}" + (f" todo {' '.join(remaining)}" if remaining else "")
    style = task.metadata["style"]
    if style == "no-search" and not searched:
        return NO_ANSWER
    if style == "list-first" and not searched and not summary and '"name": "list"' not in context:
        return f"<tool_call>{json.dumps({'name': 'list', 'arguments': {}})}</tool_call>"
    if remaining and not (style == "early-stop" and searched):
        at_once = style in ("parallel", "list-first", "verbose")
        return "".join(_call(identifier) for identifier in (remaining if at_once else remaining[:1]))
    return " ".join(seen * (2 if style == "verbose" else 1))


# --------------------------------------------------------------------------------------- environment
class CodeSearchConfig(Section, kw_only=True):
    """Options of the ``code-search`` environment (``[rollout.environment_options]``)."""

    tasks: int = 5000
    """Size of the training pool (the prompt scheduler cycles through it)."""
    task_file: str = ""
    """A task set (JSONL of TaskSpecs, e.g. written by ``relayrl data filter``) to train on instead of
    the ``tasks`` generated ones; the held-out tasks stay generated."""
    eval_tasks: int = 200
    """Held-out tasks, from a different random stream."""
    seed: int = 0
    files: list[int] = msgspec.field(default_factory=lambda: [4, 7])
    """Files per repository: [min, max]."""
    directories: int = 3
    """Directories a repository's files are spread over (0: all at the top level, so a path is one
    file word a small model copies as easily as an identifier)."""
    identifiers: list[int] = msgspec.field(default_factory=lambda: [2, 2])
    """Identifiers asked per task: [min, max]."""
    tools: list[str] = msgspec.field(default_factory=lambda: ["grep", "read_file", "list"])
    """The tools the agent gets (relayrl-sandbox's ToolBox; read-only ones)."""
    demonstrations: int = 400
    """Trajectories the supervised warm-up trains on (played through real sandboxes)."""
    demonstration_styles: dict[str, float] = msgspec.field(
        default_factory=lambda: {"parallel": 0.5, "sequential": 0.5})
    """Weights of the demonstrations' :data:`STYLES` (default: experts only, half of them parallel)."""
    grade_window_s: float = 0.02
    """Answers arriving within this window are graded by one sandbox command."""
    tool_latency_s: list[float] = []
    """``[min, max]``: each tool call also waits a log-uniform draw from this range before its result
    returns, and reports it in its wall time (a simulated remote service or slow build; the calls of
    one turn wait concurrently). For measuring what asynchrony gains under realistic tool latency
    (``benchmarks/async_vs_sync.py --workload agent``); empty: none."""

    def check(self, pm: PluginManager | None, path: str) -> None:
        latency = self.tool_latency_s
        if latency and (len(latency) != 2 or not 0 < latency[0] <= latency[1] < float("inf")):
            raise ConfigError(f"{path}.tool_latency_s: must be [min, max] seconds with 0 < min <= max, got {latency}")
        for key in ("files", "identifiers"):
            bounds = getattr(self, key)
            if len(bounds) != 2 or not 1 <= bounds[0] <= bounds[1]:
                raise ConfigError(f"{path}.{key}: must be [min, max] with 1 <= min <= max, got {bounds}")
        styles = self.demonstration_styles
        unknown_styles = sorted(set(styles) - set(STYLES))
        if unknown_styles:
            raise ConfigError(f"{path}.demonstration_styles: unknown {unknown_styles} (known: {list(STYLES)})")
        if any(weight < 0 for weight in styles.values()) or sum(styles.values()) <= 0:
            raise ConfigError(f"{path}.demonstration_styles: weights must be >= 0 with a positive sum, got {styles}")
        if not 0 <= self.directories <= len(_DIRECTORIES):
            raise ConfigError(f"{path}.directories: must be between 0 and {len(_DIRECTORIES)}")
        if self.files[1] > len(WORDS) * max(1, self.directories):
            raise ConfigError(f"{path}.files: at most {len(WORDS) * max(1, self.directories)} distinct paths "
                              f"with {self.directories} directories")
        if self.files[0] < self.identifiers[1]:
            raise ConfigError(f"{path}.files: a repository needs at least as many files as identifiers asked")
        from relayrl.sandbox.tools import TOOL_SCHEMAS

        known = {schema["function"]["name"] for schema in TOOL_SCHEMAS}
        unknown = sorted(set(self.tools) - known)
        if unknown or not self.tools:
            raise ConfigError(f"{path}.tools: unknown {unknown} (known: {sorted(known)})" if unknown
                              else f"{path}.tools: give the agent at least one tool")


class SlowTools:
    """A tool executor whose every call takes ``draw()`` seconds longer (``tool_latency_s``): the
    wait is asynchronous (no thread or core held) and included in each result's wall time."""

    def __init__(self, tools: Any, draw: Callable[[], float]) -> None:
        self.inner = tools
        self.draw = draw

    @property
    def tool_names(self) -> Sequence[str]:
        return self.inner.tool_names

    def final_answer(self) -> str:
        return str(self.inner.final_answer())

    async def execute(self, calls: Sequence[Any]) -> list[Any]:
        delays = [self.draw() for _ in calls]
        results = await self.inner.execute(calls)
        await asyncio.sleep(max(delays, default=0.0))  # the calls of a turn run concurrently
        return [msgspec.structs.replace(result, wall_time_s=result.wall_time_s + delay)
                for result, delay in zip(results, delays)]


class CodeSearchEnvironment(Environment):
    """Environment ``code-search``: generated repositories, search tools in sandboxes, sandboxed F1."""

    Config = CodeSearchConfig
    alphabet = ALPHABET
    specials = SPECIALS

    def __init__(self, config: CodeSearchConfig | None = None, *, sandbox: Any = None, pm: PluginManager | None = None) -> None:
        from relayrl.environments.batch_grading import BatchedSandboxGrader

        self.config = config or CodeSearchConfig()
        self._sandbox_section = sandbox
        self._latency = random.Random(self.config.seed)  # draws of the simulated tool latency
        self.grader = BatchedSandboxGrader(GRADE_SCRIPT, name="code-search", sandbox=sandbox, pm=pm,
                                           window_s=self.config.grade_window_s)

    def _generate(self, count: int, seed: int, prefix: str) -> list[TaskSpec]:
        return make_tasks(count, seed=seed, prefix=prefix, files=tuple(self.config.files),  # type: ignore[arg-type]
                          queries=tuple(self.config.identifiers),  # type: ignore[arg-type]
                          styles=self.config.demonstration_styles, directories=self.config.directories)

    def tasks(self) -> list[TaskSpec]:
        if self.config.task_file:
            from relayrl.sandbox import load_tasks

            return list(load_tasks(self.config.task_file))
        return self._generate(self.config.tasks, self.config.seed, "cs")

    def eval_tasks(self) -> list[TaskSpec]:
        return self._generate(self.config.eval_tasks, self.config.seed + 1_000_003, "cs-eval")

    def demonstration_tasks(self) -> list[TaskSpec]:
        """Tasks of the warm-up's demonstrations: a stream of their own (neither training nor eval)."""
        return self._generate(self.config.demonstrations, self.config.seed + 2_000_003, "cs-demo")

    # ------------------------------------------------------------------ tools
    @contextlib.asynccontextmanager
    async def tools(self, task: TaskSpec) -> AsyncIterator[Any]:
        """The agent's tools in a sandbox of its own holding the task's repository."""
        from relayrl.sandbox import SandboxSection, ToolBox

        backend = await asyncio.to_thread(self.grader.backend)  # one backend for tools and grading
        with tempfile.TemporaryDirectory(prefix="relayrl-search-") as temp:
            repository = write_repository(task, Path(temp) / "repo")
            sandbox = await asyncio.to_thread(backend.create, repository)
            try:
                toolbox = ToolBox.from_section(sandbox, self._sandbox_section or SandboxSection())
                toolbox.tools = {name: tool for name, tool in toolbox.tools.items() if name in self.config.tools}
                if self.config.tool_latency_s:
                    low, high = self.config.tool_latency_s
                    yield SlowTools(toolbox, lambda: math.exp(self._latency.uniform(math.log(low), math.log(high))))
                else:
                    yield toolbox
            finally:
                await asyncio.to_thread(sandbox.close)

    # ------------------------------------------------------------------ grading
    async def grade(self, task: TaskSpec, trajectories: Sequence[Trajectory], answers: Sequence[str]) -> list[Trajectory]:
        from relayrl.rollout.environment import with_rewards

        items = [{"answer": final_answer(trajectory)[:2000], "truth": list(task.answer)} for trajectory in trajectories]
        rewards = await self.grader.grade(items)
        return [with_rewards(trajectory, reward, f1=reward, success=float(reward >= 0.999))
                for trajectory, reward in zip(trajectories, rewards)]

    def metrics(self) -> dict[str, float]:
        return self.grader.metrics()

    def close(self) -> None:
        self.grader.close()

    # ------------------------------------------------------------------ demonstrations
    async def demonstrate(self, *, harness: Any, chat: Any, tokenizer: Any) -> list[Trajectory]:
        """:func:`expert_reply` on :meth:`demonstration_tasks`, through ``harness`` and real tools."""
        return await play_expert(self.demonstration_tasks(), expert_reply, tools=self.tools, harness=harness,
                                 chat=chat, tokenizer=tokenizer)


def final_answer(trajectory: Trajectory) -> str:
    """The agent's answer: its last assistant message, when that message calls no tool (else none)."""
    for segment in reversed(trajectory.segments):
        for turn in reversed(segment.turns):
            if turn.role == "assistant":
                return "" if turn.tool_calls or "<tool_call>" in (turn.text or "") else (turn.text or "")
    return ""
