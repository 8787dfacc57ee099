"""The rollout manager: prompts in, scored groups committed to the bus out.

For each task the prompt scheduler picks, the manager runs ``group_size`` agent loops concurrently
(each with its own tool sandbox), grades the trajectories, applies the reward shapers, tells the
scheduler the outcome (pass-rate curriculum), and commits the group through the buffer's
:class:`~relayrl.buffer.SegmentWriter`. Groups run concurrently up to ``max_concurrent_groups``.

**Back-pressure.** The trainer writes ``progress`` on the bus after each step (the groups it has
consumed from each producer). The manager starts no new group while it is more than
``max_ahead_groups`` groups ahead of the trainer, so a stalled trainer does not let the fleet fill
the bus with rollouts that will be too stale to train on. While it waits it commits its open
segment (a partial one), so that every group it counts as ahead is visible to the trainer.

**Synchronous mode** (``synchronous_batch``, ``[rollout] synchronous``): the baseline against
which asynchrony is measured. The fleet generates exactly one batch with the weights the trainer
holds, then waits until the trainer has trained on it and every engine serves the weights it
published, and only then starts the next batch: generation and training alternate, every group is
sampled by the trainer's current policy (staleness 0). It is the baseline a careful engineer would
write with these parts, not a handicapped one: the whole batch is in flight at once, over-provisioned
for the groups that will not be committed (zero-variance ones, at the share seen so far in the run):
enough that the batch fills in one round nine times in ten (:func:`groups_for_one_round`), up to
``max_concurrent_groups``, so a batch is one round of generation, not several. Once the
batch is full, no more groups are committed: the ones still running are cancelled and the ones that
finish later are dropped (``fleet/sync_surplus_groups``), since they would be trained a version
late. ``relayrl run`` polls every hand-over (the batch to the trainer, its weights to the engines,
its progress to the fleet) every 10 ms in this mode.

**Zero-variance groups.** A group whose samples all earned the same reward has zero advantage
everywhere: no learning signal. With ``skip_zero_variance`` the manager does not commit it (early in
a run that is most groups, and committing them would also count against ``max_ahead_groups``);
it still feeds the prompt scheduler and the fleet's reward counters (``fleet_counters``), so
nothing is silent. The buffer's ``zero-variance`` admission policy does the same on the trainer
side for producers that commit everything.

**Shutdown.** :meth:`RolloutManager.stop` (wired to SIGTERM by the runner) stops starting groups,
cancels those in flight (their trajectories are discarded, never half-committed) and commits the
complete groups still queued. Segments are atomic, so a kill at any moment loses at most the groups
not yet committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import signal
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from relayrl.buffer.progress import FleetCounters, Progress, read_progress
from relayrl.core.errors import StoreError
from relayrl.core.store import Store
from relayrl.core.wire import Group, TaskSpec, Trajectory
from relayrl.rollout.agent import ToolExecutor
from relayrl.rollout.chat import ChatFormat
from relayrl.rollout.costs import trajectory_costs
from relayrl.rollout.environment import Environment, no_tools
from relayrl.rollout.hookspecs import Harness
from relayrl.rollout.protocol import SamplingParams
from relayrl.rollout.routing import TokenRecordingProxy

__all__ = ["RolloutManager", "ToolsFactory"]

ToolsFactory = Callable[[TaskSpec], contextlib.AbstractAsyncContextManager[ToolExecutor | None]]


ONE_ROUND_CONFIDENCE = 0.9
"""The synchronous mode starts enough groups to fill its batch in one round with this probability."""


def groups_for_one_round(room: int, share: float, most: int) -> int:
    """:func:`fewest_for_one_round` at ``share`` rounded to a hundredth (each distinct question computed once)."""
    return fewest_for_one_round(room, round(share, 2), most)


@functools.lru_cache(maxsize=4096)
def fewest_for_one_round(room: int, share: float, most: int) -> int:
    """The fewest groups to start (at most ``most``) so that at least ``room`` of them are committed with
    probability ``ONE_ROUND_CONFIDENCE``, each committed independently with probability ``share``
    (a binomial tail); ``most`` when no number up to it is enough, 0 when ``room`` is."""
    if room <= 0:
        return 0
    if share >= 1.0:
        return min(room, most)
    share = max(share, 1e-6)
    log_share, log_rest = math.log(share), math.log1p(-share)

    def fewer_than_room(count: int) -> float:  # P(Binomial(count, share) < room), in logs: no underflow
        return sum(math.exp(math.lgamma(count + 1) - math.lgamma(k + 1) - math.lgamma(count - k + 1)
                            + k * log_share + (count - k) * log_rest) for k in range(room))

    # Below room / share the expected number committed is under room: the probability is under a half.
    for count in range(max(room, int(room / share)), most + 1):
        if 1.0 - fewer_than_room(count) >= ONE_ROUND_CONFIDENCE:
            return count
    return most


class RolloutManager:
    """Runs groups of agent loops and commits them; see the module docstring."""

    def __init__(self, *, scheduler: Any, harness: Harness, proxy: TokenRecordingProxy, chat: ChatFormat,
                 sampling: SamplingParams, grader: Environment, writer: Any, store: Store | None = None,
                 tools: ToolsFactory = no_tools, shapers: Sequence[Any] = (), group_size: int = 8,
                 max_concurrent_groups: int = 4, max_ahead_groups: int = 64, progress_poll_s: float = 0.5,
                 skip_zero_variance: bool = False, zero_variance_tolerance: float = 1e-6,
                 synchronous_batch: int = 0, served_version: Callable[[], Awaitable[int]] | None = None) -> None:
        self.scheduler = scheduler
        self.harness = harness
        self.proxy = proxy
        self.chat = chat
        self.sampling = sampling
        self.grader = grader
        self.writer = writer
        self.store = store
        self.tools = tools
        self.shapers = list(shapers)
        self.group_size = group_size
        self.max_concurrent_groups = max_concurrent_groups
        self.max_ahead_groups = max_ahead_groups
        self.progress_poll_s = progress_poll_s
        self.skip_zero_variance = skip_zero_variance
        self.zero_variance_tolerance = zero_variance_tolerance
        self.synchronous_batch = synchronous_batch
        """Groups per batch of the synchronous mode (0: asynchronous; see the module docstring)."""
        self.served_version = served_version
        """The oldest weight version the engines serve (the synchronous mode waits for the trainer's)."""
        self.committed_groups = 0
        self._consumed_at_start: int | None = None  # see _ahead
        self.graded_groups = 0
        self.skipped_groups = 0
        self.failed_groups = 0
        """Groups lost to an error (an engine, a tool, the grader): each is replaced by another."""
        self.surplus_groups = 0
        """Synchronous mode: groups graded after their batch was full (dropped) or cancelled running."""
        self._batch_room: int | None = None
        """Synchronous mode: groups the current batch may still commit (None: no limit)."""
        self._failure_reported_at = -float("inf")
        self.reward_sum = 0.0
        self.reward_count = 0
        self.generated_tokens = 0
        self.behaviour: Counter[str] = Counter()
        """Cumulative behaviour of every graded trajectory: grader's reward, tokens, turns, tool calls,
        compactions, and what the shapers added to the reward (``shaping_sum``, <= 0 for a penalty)."""
        self.started = time.monotonic()
        self._stopping = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._commit_lock = asyncio.Lock()
        self._flush_failing = False  # the last flush of the open segment failed (said once)
        self._last_progress = Progress()  # the trainer's progress as last read (:meth:`_ahead`)

    # ------------------------------------------------------------------ one group
    async def run_group(self, task: TaskSpec) -> Group:
        """Run, grade, shape and commit one group for ``task``; return it."""
        group_id = f"{task.task_id}/{uuid.uuid4().hex[:12]}"

        async def sample(index: int, tools: ToolExecutor | None) -> tuple[Trajectory, str]:
            trajectory = await self.harness.run(task, proxy=self.proxy, tools=tools, chat=self.chat,
                                                sampling=self.sampling, group_id=group_id, sample_index=index)
            answer = await asyncio.to_thread(tools.final_answer) if tools is not None else ""
            return trajectory, answer

        async with contextlib.AsyncExitStack() as opened:
            # Every sample's tools (its sandbox) open first, concurrently, so that the samples start
            # together: their first turns, one prompt, reach the proxy in one turn of the event loop
            # and go to the engine as one group call (the prompt prefilled once).
            entered = await asyncio.gather(*(opened.enter_async_context(self.tools(task))
                                             for _ in range(self.group_size)), return_exceptions=True)
            failed = next((item for item in entered if isinstance(item, BaseException)), None)
            if failed is not None:  # the ones that opened are closed by the stack
                raise failed
            results = await asyncio.gather(*(sample(index, tools) for index, tools in enumerate(entered)))
        graded = await self.grader.grade(task, [trajectory for trajectory, _ in results],
                                         [answer for _, answer in results])
        group = Group(group_id=group_id, task_id=task.task_id, trajectories=list(graded), created_at=time.time())
        self._count_behaviour(group)
        step = self.trainer_step()
        graded_sum = sum(float(trajectory.reward) for trajectory in group.trajectories)
        for shaper in self.shapers:
            group = shaper(group, step=step)
        self.behaviour["shaping_sum"] += sum(float(trajectory.reward) for trajectory in group.trajectories) - graded_sum
        self.scheduler.observe(group)
        rewards = [float(trajectory.reward) for trajectory in group.trajectories]
        self.graded_groups += 1
        self.reward_sum += sum(rewards)
        self.reward_count += len(rewards)
        if self.skip_zero_variance and rewards and max(rewards) - min(rewards) <= self.zero_variance_tolerance:
            self.skipped_groups += 1
            self.generated_tokens += sum(trajectory.num_generated_tokens for trajectory in group.trajectories)
            return group
        if self._batch_room is not None:  # synchronous: the batch is full; this group would be a version late
            if self._batch_room <= 0:
                self.surplus_groups += 1
                return group
            self._batch_room -= 1
        try:
            async with self._commit_lock:
                await asyncio.get_running_loop().run_in_executor(None, self.writer.add, group)
                self.committed_groups += 1
                self.generated_tokens += sum(trajectory.num_generated_tokens for trajectory in group.trajectories)
        except BaseException:
            if self._batch_room is not None:  # not committed: its place in the batch is free again
                self._batch_room += 1
            raise
        return group

    def _count_behaviour(self, group: Group) -> None:
        """Add a graded group (before any shaper) to the behaviour counters of :meth:`fleet_counters`."""
        counts = self.behaviour
        for trajectory in group.trajectories:
            costs = trajectory_costs(trajectory)
            counts["graded_reward_sum"] += float(trajectory.reward)
            counts["trajectories"] += 1
            counts["generated_tokens"] += costs.generated_tokens
            compactions = float(trajectory.metrics.get("compactions", 0.0))
            counts["compactions"] += compactions
            counts["compacted_trajectories"] += float(compactions > 0)
            counts["turns"] += costs.turns
            counts["tool_calls"] += costs.tool_calls
            counts["parallel_turns"] += costs.parallel_turns
            counts["tool_results"] += costs.tool_results
            counts["tool_seconds"] += costs.tool_seconds

    def trainer_step(self) -> int:
        return read_progress(self.store).step if self.store is not None else 0

    def _ahead(self, progress: Progress | None = None) -> int:
        """Groups handed to the writer (committed or still in its open segment) the trainer has not consumed.

        A restarted producer's count starts from zero while the trainer's count of its groups does not:
        the groups the trainer had consumed when this process started are its baseline. (Groups a
        previous process committed that are not consumed yet are not counted: at most one lead's worth.)
        """
        if self.store is None:
            return 0
        if progress is None:
            try:
                progress = self._last_progress = read_progress(self.store)
            except StoreError:  # an outage: the last record read stands until the store answers again
                progress = self._last_progress
        consumed = progress.consumed.get(self.writer.producer_id, 0)
        if self._consumed_at_start is None:
            self._consumed_at_start = consumed
        return self._consumed_at_start + self.committed_groups - consumed

    async def _flush_open_segment(self) -> None:
        """Commit the writer's open segment now: groups in it are invisible to the trainer. A store that
        refuses it (an outage) keeps the groups queued: said once, tried again at the next call."""
        async with self._commit_lock:
            if self.writer.pending_groups:
                try:
                    await asyncio.get_running_loop().run_in_executor(None, self.writer.flush)
                    self._flush_failing = False
                except StoreError as exc:
                    if not self._flush_failing:
                        print(f"rollout: could not commit a segment of {self.writer.pending_groups} group(s) "
                              f"({exc}); retrying", flush=True)
                    self._flush_failing = True

    # ------------------------------------------------------------------ the loop
    async def run(self, *, max_groups: int | None = None, handle_signals: bool = False) -> None:
        """Start groups until :meth:`stop` (or ``max_groups`` have been started), then drain.

        With ``handle_signals``, SIGTERM and SIGINT call :meth:`stop` (the main thread's loop only).
        """
        if handle_signals:
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, self.stop)
        if self.synchronous_batch:
            await self._run_synchronously(max_groups)
            return
        slots = asyncio.Semaphore(self.max_concurrent_groups)
        started = 0
        try:
            while not self._stopping.is_set() and (max_groups is None or started < max_groups):
                await slots.acquire()
                while self._ahead() > self.max_ahead_groups and not self._stopping.is_set():
                    # Waiting for the trainer: it must be able to see every group we hold, or with a
                    # lead limit smaller than a segment both sides would wait for each other.
                    await self._flush_open_segment()
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self._stopping.wait(), self.progress_poll_s)
                if self._stopping.is_set():
                    slots.release()
                    break
                task = self.scheduler.next().task
                job = asyncio.create_task(self.run_group(task))
                self._tasks.add(job)
                job.add_done_callback(lambda done: (self._tasks.discard(done), slots.release(), self._group_ended(done)))
                started += 1
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=self._stopping.is_set())
        finally:
            for job in self._tasks:
                job.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await asyncio.get_running_loop().run_in_executor(None, self.writer.flush)

    async def _run_synchronously(self, max_groups: int | None) -> None:
        """One batch at a time, each with the trainer's current weights (see the module docstring)."""
        started = 0
        in_flight: set[asyncio.Task[Any]] = self._tasks
        try:
            while not self._stopping.is_set() and (max_groups is None or started < max_groups):
                missing = self._batch_room = await self._wait_for_the_trainer()
                full_at = self.committed_groups + missing
                while not self._stopping.is_set() and self.committed_groups < full_at:
                    # Enough in flight to fill the batch in one round at the share of groups committed so
                    # far (zero-variance ones are not), within the fleet's concurrency: a second round for
                    # the last group or two costs a whole generation's latency. Room 0 with the batch not
                    # full: the last groups are being committed.
                    wanted = groups_for_one_round(self._batch_room, self._commit_share(), self.max_concurrent_groups)
                    while len(in_flight) < wanted and (max_groups is None or started < max_groups):
                        in_flight.add(asyncio.create_task(self.run_group(self.scheduler.next().task)))
                        started += 1
                    if not in_flight:
                        break
                    done, _ = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                    for job in done:
                        in_flight.discard(job)
                        self._group_ended(job)
                if not self._stopping.is_set():
                    self.surplus_groups += len(in_flight)
                await self._cancel(in_flight)  # the batch is full: they would be trained a version late
                await self._flush_open_segment()  # the whole batch, visible to the trainer at once
        finally:
            self._batch_room = None
            await self._cancel(in_flight)
            await asyncio.get_running_loop().run_in_executor(None, self.writer.flush)

    def _commit_share(self) -> float:
        """The share of graded groups committed so far (zero-variance ones are not), smoothed towards 1."""
        return (self.committed_groups + 1) / (self.graded_groups + 1)

    @staticmethod
    async def _cancel(jobs: set[asyncio.Task[Any]]) -> None:
        for job in jobs:
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
        jobs.clear()

    def _group_ended(self, job: asyncio.Task[Any]) -> None:
        """A group's task is done. One that failed is lost (another task replaces it): count it and say
        why on stderr, at most every 10 s (a broken grader fails every group)."""
        if job.cancelled() or job.exception() is None:   # cancelled: stop() was called
            return
        error = job.exception()
        self.failed_groups += 1
        now = time.monotonic()
        if now - self._failure_reported_at >= 10.0:
            self._failure_reported_at = now
            print(f"rollout: a group failed ({self.failed_groups} so far; each is replaced by another): "
                  f"{type(error).__name__}: {error}", file=sys.stderr, flush=True)

    async def _wait_for_the_trainer(self) -> int:
        """Wait until the engines serve the trainer's newest weights and the trainer lacks groups for its
        next batch; return how many it lacks (a whole batch, unless it dropped some of the last one)."""
        while not self._stopping.is_set():
            # One read: the trainer writes its consumption and its new version together.
            progress = read_progress(self.store) if self.store is not None else Progress()
            missing = self.synchronous_batch - max(self._ahead(progress), 0)
            if missing > 0 and (self.served_version is None or await self.served_version() >= progress.version):
                return missing
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.progress_poll_s)
        return 0

    def stop(self) -> None:
        """Stop starting groups; in-flight ones are cancelled, complete ones committed."""
        self._stopping.set()
        for job in self._tasks:
            job.cancel()

    def metrics(self) -> dict[str, float]:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        return {"fleet/groups": float(self.committed_groups), "fleet/groups_graded": float(self.graded_groups),
                "fleet/zero_variance_skipped": float(self.skipped_groups), "fleet/groups_failed": float(self.failed_groups),
                **({"fleet/sync_surplus_groups": float(self.surplus_groups)} if self.synchronous_batch else {}),
                "fleet/tokens_per_s": self.generated_tokens / elapsed, **self.scheduler.metrics()}

    def fleet_counters(self) -> FleetCounters:
        """Cumulative counters of this producer (the trainer reads every producer's: see
        :mod:`relayrl.buffer.progress`)."""
        return FleetCounters(graded_groups=float(self.graded_groups), committed_groups=float(self.committed_groups),
                             skipped_groups=float(self.skipped_groups), reward_sum=self.reward_sum,
                             reward_count=float(self.reward_count), generated_tokens=float(self.generated_tokens),
                             behaviour={name: float(value) for name, value in self.behaviour.items()})

