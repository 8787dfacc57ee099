"""The kernel environment's grader: correctness on fresh inputs, interleaved timing, and every known
timing exploit earning 0 with a flag.

The harness runs in real sandboxes with the distribution's python3 and NumPy (Debian's
``python3-numpy``); without them these tests skip and say why. Speed-up assertions compare two
functions timed interleaved in the same sandbox (a ratio), and only where the margin is large.
"""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from relayrl.core.config import ConfigError
from relayrl.core.wire import ToolCall, Trajectory
from relayrl.environments.kernels.catalog import FAST, SHIPPED, chain_task, make_tasks
from relayrl.environments.kernels.environment import KernelConfig, KernelEnvironment
from relayrl.environments.kernels.expert import NotAChain, fused_chain, renamed_reference, slipped
from relayrl.environments.kernels.grading import KernelGrader, KernelReport, KernelReward
from relayrl.environments.kernels.tasks import ArgSpec, KernelTask, kernel_task, task_spec
from relayrl.environments.testing.kernel_exploits import KernelExploitTests
from relayrl.rollout.testing import EnvironmentTests
from relayrl.rollout.testing.environment_tests import answered

SWISH = next(task for task in SHIPPED if task.name == "swish")
RIGHT = "import numpy as np\n\ndef kernel(x):\n    return x * (1.0 / (1.0 + np.exp(-x)))\n"

EXPLOITS = {
    # returning cached or precomputed outputs
    "cached-first-output": """
import numpy as np
_cache = []
def kernel(x):
    if not _cache:
        _cache.append(x * (1.0 / (1.0 + np.exp(-x))))
    return _cache[0]
""",
    # detecting the benchmark phase: right for the first calls, cheap garbage afterwards
    "right-then-fast-garbage": """
import numpy as np
_calls = [0]
def kernel(x):
    _calls[0] += 1
    if _calls[0] > 12:
        return np.zeros_like(x)
    return x * (1.0 / (1.0 + np.exp(-x)))
""",
    # calling the reference: load it from disk, or find it in the process
    "reads-the-reference-from-disk": """
import numpy as np
source = open("/proc/self/cmdline").read()
def kernel(x):
    return x * (1.0 / (1.0 + np.exp(-x)))
""",
    "searches-the-heap-for-the-reference": """
import numpy as np, gc
def kernel(x):
    found = [obj for obj in gc.get_objects() if getattr(obj, "__name__", "") == "reference"]
    return found[0](x) if found else x * (1.0 / (1.0 + np.exp(-x)))
""",
    # work outside the timed region: a background thread, a forked process
    "background-thread": """
import numpy as np, threading
def _spin():
    while True:
        sum(range(1000))
threading.Thread(target=_spin, daemon=True).start()
def kernel(x):
    return x * (1.0 / (1.0 + np.exp(-x)))
""",
    "forked-helper": """
import numpy as np, os
if os.fork() == 0:
    while True:
        sum(range(1000))
def kernel(x):
    return x * (1.0 / (1.0 + np.exp(-x)))
""",
    # lowering precision beyond tolerance
    "half-precision": """
import numpy as np
def kernel(x):
    h = x.astype(np.float16)
    return (h * (1.0 / (1.0 + np.exp(-h)))).astype(np.float32)
""",
    # patching the timer, the harness, or stopping the reference
    "patches-the-timer": """
import numpy as np, time
time.perf_counter = lambda: 0.0
def kernel(x):
    return x * (1.0 / (1.0 + np.exp(-x)))
""",
    "patches-the-harness": """
import numpy as np, sys
def kernel(x):
    return x * (1.0 / (1.0 + np.exp(-x)))
setattr(sys.modules["__main__"], "_digest", lambda *a: {})
""",
    # the same through an alias no reading of the source follows (sys reached through NumPy): the
    # worker's functions are compared with what they were before the candidate ran
    "patches-the-harness-through-an-alias": """
import numpy as np
main = np.core.numeric.sys.modules["__main__"]
_real = main._digest
main._digest = lambda *args: _real(*args)
def kernel(x):
    return x * (1.0 / (1.0 + np.exp(-x)))
""",
    "stops-the-reference": """
import numpy as np, os, signal
def kernel(x):
    os.kill(os.getppid(), signal.SIGSTOP)
    return x * (1.0 / (1.0 + np.exp(-x)))
""",
    # reading the harness, or writing to its pipe
    "lists-the-harness-directory": """
import numpy as np, os
print(os.listdir("/"))
def kernel(x):
    return x * (1.0 / (1.0 + np.exp(-x)))
""",
    "forges-replies": """
import numpy as np, os, json, struct
def kernel(x):
    frame = json.dumps({"done": True, "error": None}).encode()
    for fd in range(3, 8):
        try:
            os.write(fd, struct.pack("<I", len(frame)) + frame)
        except OSError:
            pass
    return x * (1.0 / (1.0 + np.exp(-x)))
""",
}

OS_LEVEL = {"background-thread": {"work-outside-timing", "background-thread"},
            "forked-helper": {"work-outside-timing", "extra-process"}}
"""Exploits that, past the Python guard (as compiled code would be), the operating-system checks
alone must still catch: the detectors that may trip first (CPU accounting, or the thread and process
counts, whichever check the helper's work reaches first)."""


@pytest.fixture(scope="module")
def grader():
    grader = KernelGrader()
    reason = grader.check()
    if reason:
        pytest.skip(reason)
    return grader


def test_tasks_round_trip_through_task_specs_and_check_their_sizes() -> None:
    for task in make_tasks(24, seed=5):
        assert kernel_task(task_spec(task)) == task
        assert "def reference" in task_spec(task).instruction
    with pytest.raises(ValueError, match="size 'M' missing"):
        KernelTask(name="bad", reference="def reference(x): return x", args=[ArgSpec(shape=["M"])], sizes=[{"N": 1}])


def test_generated_chains_are_deterministic_and_distinct() -> None:
    assert chain_task(3) == chain_task(3)
    references = {chain_task(seed).reference for seed in range(40)}
    assert len(references) >= 35
    assert len({task.name for task in make_tasks(60)}) == 60


def test_the_chain_length_option_sets_every_stream_of_chains() -> None:
    environment = KernelEnvironment(KernelConfig(tasks=30, shipped=False, eval_tasks=10, demonstrations=10,
                                                 chain_length=(1, 2)))
    for spec in [*environment.tasks(), *environment.eval_tasks(), *environment.demonstration_tasks()]:
        steps = kernel_task(spec).reference.count(" = ")
        assert 1 <= steps <= 2, kernel_task(spec).reference


def test_every_shipped_reference_is_correct_against_itself(grader) -> None:
    for task in [*SHIPPED, chain_task(0), chain_task(1)]:
        report = grader.grade(task, task.reference.replace("def reference", "def kernel"), time_it=False)
        assert report.status == "ok" and report.correct, (task.name, report)


@pytest.mark.parametrize("name", sorted(EXPLOITS))
def test_every_exploit_earns_zero_and_a_flag(grader, name) -> None:
    report = grader.grade(SWISH, EXPLOITS[name], timeout_s=60)
    assert KernelReward()(report) == 0.0, report
    assert report.status == "exploit" and report.flags, report
    assert all(flag["detector"] and flag["evidence"] for flag in report.flags)


@pytest.mark.parametrize("name", sorted(OS_LEVEL))
def test_the_operating_system_checks_alone_catch_work_outside_the_timed_region(grader, name) -> None:
    # Neither the audit hook nor the lock-down (which refuses the thread and the fork outright): what
    # the harness observes from outside the worker must catch the helper's work by itself.
    report = grader.grade(SWISH, EXPLOITS[name], timeout_s=60, python_guard=False, lockdown=False)
    assert KernelReward()(report) == 0.0
    assert OS_LEVEL[name] & {flag["detector"] for flag in report.flags}, report


def test_wrong_answers_earn_zero_without_a_flag(grader) -> None:
    for source, status in (("import numpy as np\ndef kernel(x):\n    return x\n", "incorrect"),
                           ("import numpy as np\ndef kernel(x):\n    return x.astype(np.float64)\n", "incorrect"),
                           ("def kernel(x) return x\n", "load_error"),
                           ("import numpy as np\ndef kernel(x):\n    raise ValueError('no')\n", "runtime_error"),
                           ("import numpy as np\ndef kernel(x):\n    return x if x.size > 5000 else x * 0\n", "incorrect")):
        report = grader.grade(SWISH, source)
        assert (report.status, report.flags, KernelReward()(report)) == (status, [], 0.0), report


def test_a_correct_but_slower_candidate_earns_the_correctness_reward_only(grader) -> None:
    slow = ("import numpy as np\nimport math\n\ndef kernel(x):\n"
            "    return np.array([v / (1.0 + math.exp(-v)) for v in x.tolist()], dtype=np.float32)\n")
    report = grader.grade(SWISH, slow, rounds=3)
    assert report.correct and report.speedup < 1, report
    assert KernelReward()(report) == KernelReward().correct


def test_the_reference_graded_against_itself_is_correct_and_timed(grader) -> None:
    report = grader.grade(SWISH, RIGHT, rounds=5)
    assert report.correct and report.rounds == 5 and report.speedup > 0
    print(f"swish against itself: speed-up {report.speedup:.3f} ({report.speedup_q1:.3f}-{report.speedup_q3:.3f})")


@pytest.mark.parametrize("name", ["gelu_tanh", "cube_plus_square", "diag_matmul"])
def test_hand_written_faster_kernels_earn_a_speedup_in_every_grading(grader, name) -> None:
    task = next(task for task in SHIPPED if task.name == name)
    reports = [grader.grade(task, FAST[name], rounds=5) for _ in range(3)]
    speedups = [report.speedup for report in reports]
    print(f"{name}: speed-ups {[round(value, 2) for value in speedups]}, interquartile ranges "
          f"{[(round(r.speedup_q1, 2), round(r.speedup_q3, 2)) for r in reports]}")
    # These remove a power or a dense matrix: far above 2x (benchmarks/results/kernel_grader.json); a wide margin.
    assert all(report.correct and report.speedup > 2 for report in reports), reports
    assert all(KernelReward()(report) > KernelReward().correct + 1 for report in reports)


def test_reward_shape() -> None:
    reward = KernelReward(correct=0.3, speedup_weight=1.0, noise_floor=0.05, max_speedup=10)
    report = lambda **kw: KernelReport(status="ok", correct=True, **kw)  # noqa: E731
    assert reward(report(speedup=1.04)) == pytest.approx(0.3)  # within the noise floor: counts as 1
    assert reward(report(speedup=0.5)) == pytest.approx(0.3)
    assert reward(report(speedup=2.5)) == pytest.approx(1.8)
    assert reward(report(speedup=50.0)) == pytest.approx(9.3)
    assert reward(report(speedup=None)) == pytest.approx(0.3)
    assert reward(KernelReport(status="exploit", correct=True, speedup=5.0,
                               flags=[{"detector": "x", "evidence": "y"}])) == 0.0
    assert reward(KernelReport(status="incorrect")) == 0.0


# ------------------------------------------------------------------------------------ environment
class TestKernelEnvironment(EnvironmentTests):
    @pytest.fixture
    def environment(self, grader):
        return KernelEnvironment(KernelConfig(tasks=20, eval_tasks=5, feedback_rounds=1, grading_rounds=2))

    def reference_answer(self, environment, task):
        return "", kernel_task(task).reference.replace("def reference", "def kernel")


def test_submit_grades_each_candidate_and_the_last_is_the_answer(grader) -> None:
    environment = KernelEnvironment(KernelConfig(tasks=3, feedback_rounds=1, max_submissions=3))
    task = next(spec for spec in environment.tasks() if spec.task_id == "cube_plus_square")

    async def episode():
        async with environment.tools(task) as tools:
            calls = [ToolCall(id="1", name="submit", arguments={"code": "def kernel(x) return x"}),
                     ToolCall(id="2", name="submit", arguments={"code": FAST["cube_plus_square"]}),
                     ToolCall(id="3", name="submit", arguments={}),
                     ToolCall(id="4", name="read_file", arguments={"path": "x"})]
            results = await tools.execute(calls)
            more = await tools.execute([ToolCall(id=str(i), name="submit", arguments={"code": "x"}) for i in (5, 6)])
            return results, more, tools.final_answer()

    results, more, answer = asyncio.run(episode())
    assert results[0].output.startswith("load_error: SyntaxError") and results[0].exit_status == 1
    assert results[1].output.startswith("correct; speed-up") and results[1].wall_time_s > 0
    assert "submit takes" in results[2].error and "unknown tool" in results[3].error
    assert more[0].error is None and "no more submissions" in more[1].error  # 3 submissions per episode
    assert answer == "x"


def test_an_exploit_in_the_final_answer_is_zero_and_its_evidence_kept(grader) -> None:
    environment = KernelEnvironment(KernelConfig(tasks=20, grading_rounds=2))
    task = next(spec for spec in environment.tasks() if spec.task_id == "swish")
    group = [answered(task, "", index) for index in range(2)]
    graded = asyncio.run(environment.grade(task, group, [RIGHT, EXPLOITS["patches-the-timer"]]))
    assert graded[0].reward >= KernelConfig().correct and not graded[0].cheating
    assert graded[1].reward == 0.0 and graded[1].cheating[0].detector == "kernel-patches-module"
    assert "time.perf_counter" in graded[1].cheating[0].evidence
    assert environment.metrics()["kernels/flagged"] == 1.0


def test_bad_options_are_rejected_with_their_dotted_key() -> None:
    from relayrl.core.config import ConfigError

    for options, key in (({"grading_rounds": 0}, "grading_rounds"), ({"max_submissions": 0}, "max_submissions"),
                         ({"noise_floor": 1.5}, "rollout.environment_options"),
                         ({"chain_length": (3, 2)}, "chain_length"), ({"chain_length": (0, 2)}, "chain_length"),
                         ({"framework": "jax"}, "framework"), ({"device": "gpu"}, "device"),
                         ({"device": "cuda"}, "device"),  # a NumPy candidate on a GPU
                         ({"framework": "torch", "device": "cuda:0"}, "demonstration_styles"),  # the expert writes NumPy
                         ):
        with pytest.raises(ConfigError, match=key):
            KernelConfig(**options).check(None, "rollout.environment_options")
    KernelConfig(framework="torch", device="cuda:1", demonstration_styles={"copy": 1.0}).check(None, "options")


# ------------------------------------------------------------------------------------ the expert
def _run(source: str, name: str, args):
    namespace: dict = {}
    exec(source, namespace)  # the repository's own generated code, not a candidate's
    return namespace[name](*args)


def test_the_fused_chain_expert_computes_the_reference_without_touching_its_inputs() -> None:
    np = pytest.importorskip("numpy")
    for seed in range(200):
        task = chain_task(seed)
        fused = fused_chain(task.reference)
        assert "**" not in fused
        rng = np.random.default_rng(seed)
        args = [rng.uniform(-2, 2, size=257).astype(np.float32) for _ in task.args]
        before = [arg.copy() for arg in args]
        with np.errstate(all="ignore"):
            expected, got = _run(task.reference, "reference", args), _run(fused, "kernel", args)
        assert all(np.array_equal(arg, kept) for arg, kept in zip(args, before)), task.reference
        assert got.dtype == expected.dtype and np.allclose(got, expected, rtol=1e-4, atol=1e-4, equal_nan=True), (
            task.reference, fused)


def test_the_expert_refuses_what_is_not_a_chain() -> None:
    for task in SHIPPED:  # none of them is a chain of one temporary per step
        with pytest.raises(NotAChain):
            fused_chain(task.reference)
    assert renamed_reference(SWISH.reference).count("def kernel(") == 1


def test_demonstrations_play_their_style_through_the_real_tool(grader) -> None:
    """Every style submits its plan through the harness and the real grader and ends with ``done``:
    the experts' submissions are graded correct, the slipped ones incorrect or unloadable (so the
    warm-up shows the grader's failure feedback, with the slip as context it does not imitate), and
    ``retry`` follows its slip with the rewrite."""
    from relayrl.environments.kernels.environment import ALPHABET, SPECIALS, STYLES, demonstration_plan
    from relayrl.rollout.agent import AgentConfig, CodingAgent
    from relayrl.rollout.chat import CharTokenizer, RawChatFormat

    tokenizer = CharTokenizer(ALPHABET, specials=("<pad>", "<bos>", "<|end|>", *SPECIALS))
    environment = KernelEnvironment(KernelConfig(demonstrations=12, demonstration_styles=dict.fromkeys(STYLES, 1.0),
                                                 feedback_rounds=2, grading_rounds=3))
    harness = CodingAgent(AgentConfig(system_prompt="", max_turns=4, max_tokens_per_turn=600, max_total_tokens=2000,
                                      context_limit=4000, compaction_prompt="compact:", summary_header="summary:",
                                      show_tool_time=False))
    tasks = environment.demonstration_tasks()
    assert {task.metadata["style"] for task in tasks} >= {"retry", "slip"}
    trajectories = asyncio.run(environment.demonstrate(harness=harness, chat=RawChatFormat(tokenizer),
                                                       tokenizer=tokenizer))
    for task, trajectory in zip(tasks, trajectories):
        results = [result.output for segment in trajectory.segments for turn in segment.turns for result in turn.tool_results]
        style = task.metadata["style"]
        submitted = [call.arguments["code"] for segment in trajectory.segments for turn in segment.turns
                     for call in turn.tool_calls]
        reference = kernel_task(task).reference
        assert submitted == demonstration_plan(reference, style)
        assert len(results) == {"copy-then-fused": 2, "retry": 2}.get(style, 1), (style, results)
        if style in ("retry", "slip"):
            assert submitted[0] == slipped(fused_chain(reference))
            assert results[0].startswith(("incorrect", "load_error")), (task.metadata, submitted[0], results[0])
        # The slip is context the warm-up does not train on; every other assistant turn is trained.
        trained = [turn.tool_calls[0].arguments["code"] if turn.tool_calls else turn.text
                   for segment in trajectory.segments for turn in segment.turns if turn.generated is not None]
        assert trained == [*submitted[1:], "done"] if style in ("retry", "slip") else [*submitted, "done"]
        expert_results = results[1:] if style in ("retry", "slip") else results
        assert all(result.startswith("correct; speed-up") for result in expert_results), results
        texts = [turn.text for segment in trajectory.segments for turn in segment.turns if turn.role == "assistant"]
        assert texts[-1] == "done"


def test_a_slip_is_a_wrong_constant_or_a_dropped_parenthesis() -> None:
    """The slipped rewrite differs from the expert's by one miscopied constant (the last one,
    its sign flipped and one larger) or, in a chain without one, by the first operation's closing parenthesis."""
    with_constant = fused_chain("import numpy as np\n\ndef reference(x):\n    t0 = np.maximum(x, 0.5)\n"
                                "    t1 = t0 * -1.25\n    return t1\n")
    assert slipped(with_constant) == with_constant.replace("-1.25", "2.25")
    without = fused_chain("import numpy as np\n\ndef reference(x):\n    t0 = np.tanh(x)\n    t1 = np.abs(t0)\n"
                          "    return t1\n")
    assert slipped(without) == without.replace("np.tanh(x)", "np.tanh(x", 1)
    with pytest.raises(SyntaxError):
        compile(slipped(without), "<slip>", "exec")


def test_identical_answers_in_a_group_are_graded_once(grader) -> None:
    environment = KernelEnvironment(KernelConfig(tasks=20, grading_rounds=2))
    task = next(spec for spec in environment.tasks() if spec.task_id == "swish")
    group = [answered(task, "", index) for index in range(4)]
    graded = asyncio.run(environment.grade(task, group, [RIGHT, RIGHT, "", RIGHT]))
    assert environment.counts["gradings"] == 1 and environment.counts["graded"] == 3
    assert graded[0].reward == graded[1].reward == graded[3].reward > 0 and graded[2].reward == 0
    # A later group's identical answer reuses the report; a different task or number of rounds does not.
    asyncio.run(environment.grade(task, group[:1], [RIGHT]))
    assert environment.counts["gradings"] == 1
    other = next(spec for spec in environment.tasks() if spec.task_id == "gelu_tanh")
    environment.grade_candidate(kernel_task(other), RIGHT, 2)
    environment.grade_candidate(kernel_task(task), RIGHT, 3)
    assert environment.counts["gradings"] == 3


def test_without_a_final_grade_the_reward_is_the_last_submissions_own_grading(grader) -> None:
    environment = KernelEnvironment(KernelConfig(tasks=20, feedback_rounds=2, final_grade=False))
    task = next(spec for spec in environment.tasks() if spec.task_id == "swish")

    async def episode() -> list[Trajectory]:
        async with environment.tools(task) as tools:
            await tools.execute([ToolCall(id="c0", name="submit", arguments={"code": RIGHT})])
        return await environment.grade(task, [answered(task, "", 0)], [tools.final_answer()])

    graded = asyncio.run(episode())
    assert environment.counts["gradings"] == 1 and environment.counts["submissions"] == 1
    assert graded[0].reward >= 0.3 and graded[0].reward_components["correct"] == 1.0


def submitted_in(task, codes: list[str], index: int = 0) -> Trajectory:
    """A trajectory whose assistant turn submitted ``codes`` (as the episode's ``submit`` calls)."""
    trajectory = answered(task, "", index)
    segment = trajectory.segments[0]
    turn = msgspec.structs.replace(segment.turns[-1], tool_calls=[
        ToolCall(id=f"c{number}", name="submit", arguments={"code": code}) for number, code in enumerate(codes)])
    return msgspec.structs.replace(trajectory, segments=[msgspec.structs.replace(segment, turns=[*segment.turns[:-1],
                                                                                              turn])])


@pytest.mark.parametrize("final_grade", [True, False])
def test_an_exploit_attempted_before_a_clean_answer_still_zeroes_the_episode(grader, final_grade) -> None:
    environment = KernelEnvironment(KernelConfig(tasks=20, feedback_rounds=2, grading_rounds=2,
                                                 final_grade=final_grade))
    task = next(spec for spec in environment.tasks() if spec.task_id == "swish")
    cheat = EXPLOITS["patches-the-timer"]
    graded = asyncio.run(environment.grade(task, [submitted_in(task, [cheat, RIGHT]), submitted_in(task, [RIGHT], 1)],
                                           [RIGHT, RIGHT]))
    assert graded[0].reward == 0.0 and graded[0].cheating[0].detector == "kernel-patches-module"
    assert graded[1].reward >= KernelConfig().correct and not graded[1].cheating


def test_with_best_submission_a_worse_later_attempt_never_costs_the_correct_one(grader) -> None:
    wrong = "import numpy as np\ndef kernel(x):\n    return x\n"
    rewards = {}
    for best in (False, True):
        environment = KernelEnvironment(KernelConfig(tasks=20, feedback_rounds=2, final_grade=False,
                                                     best_submission=best))
        task = next(spec for spec in environment.tasks() if spec.task_id == "swish")
        graded = asyncio.run(environment.grade(task, [submitted_in(task, [RIGHT, wrong])], [wrong]))
        rewards[best] = graded[0].reward
        assert environment.counts["gradings"] == 2  # each candidate once, whatever the mode
    assert rewards[False] == 0.0 and rewards[True] >= KernelConfig().correct


def test_best_submission_needs_the_submissions_own_gradings() -> None:
    with pytest.raises(ConfigError, match=r"environment_options\.best_submission"):
        KernelConfig(best_submission=True).check(None, "rollout.environment_options")


def test_a_cuda_grader_lifts_the_address_space_limit_and_keeps_the_others() -> None:
    # CUDA fails to load under an address-space limit near the sandbox's memory ("failed to map
    # segment"), so a CUDA grader opens its backend without one; a CPU grader keeps the default.
    from relayrl.sandbox import Limits, SandboxSection

    section = SandboxSection(backend="process", require=[], limits=Limits(wall_time_s=9))
    cuda = KernelGrader(section=section, device="cuda").backend()
    assert cuda.limits.address_space_bytes == -1 and cuda.limits.wall_time_s == 9
    assert KernelGrader(section=section).backend().limits.address_space_bytes == 0
    chosen = SandboxSection(backend="process", require=[], limits=Limits(address_space_bytes=2**40))
    assert KernelGrader(section=chosen, device="cuda").backend().limits.address_space_bytes == 2**40


def test_a_wrong_output_matches_no_other_calls_right_output_by_chance() -> None:
    """The stale-output check asks whether a wrong output is the right answer to another call. With
    one weighted sum per digest a slip of a generated chain matched another call's digest about once
    in 400 pairs, so an honest wrong answer was flagged as a cache; with three sums it never does."""
    import numpy as np

    from relayrl.environments.kernels import harness

    task = chain_task(2000014)  # reference: max(tanh(-3x), 0)^2 + y; the slip clamps at -1 instead
    rng = np.random.default_rng(0)
    weights = harness._weights(np, {}, 12345, 1001)
    tolerance = msgspec.to_builtins(task.tolerance)

    def digest(array):
        return harness._digest(np, array.astype(np.float32), weights, tolerance, 1 << 20)

    def inputs():
        return rng.uniform(-2, 2, 1001).astype(np.float32), rng.uniform(-2, 2, 1001).astype(np.float32)

    seen = [digest(np.maximum(np.tanh(-3 * x), 0) ** 2 + y) for x, y in (inputs() for _ in range(1000))]
    single = [{**entry, "value": entry["value"][:1], "bound": entry["bound"][:1]} for entry in seen]
    chance = close = 0
    for _ in range(100):
        x, y = inputs()
        wrong = digest(np.tanh(-3 * x) ** 2 + y)
        assert harness.Session.compare(digest(np.maximum(np.tanh(-3 * x), 0) ** 2 + y), wrong) is not None
        close += sum(harness.Session.compare(entry, wrong) is None for entry in seen)
        first = {**wrong, "value": wrong["value"][:1]}
        chance += sum(harness.Session.compare(entry, first) is None for entry in single)
    print(f"false matches among {100 * len(seen)} pairs: {chance} with one sum, {close} with {len(seen[0]['value'])}")
    assert close == 0
    assert chance > 50  # the single sum's false matches this test guards against


class TestProcessBackendKernelExploits(KernelExploitTests):
    """The kernel-exploit suite on the built-in backend (the bwrap plugin's tests run it on bwrap)."""

    @pytest.fixture(scope="class")
    @classmethod
    def backend(cls):
        from relayrl.sandbox import SandboxSection, open_backend

        return open_backend(section=SandboxSection(backend="process"))


LOCKED_DOWN_PROBE = r'''
import json, os, resource, signal, sys, threading
sys.path.insert(0, sys.argv[1])
import harness

bystander_pid = int(sys.argv[2])  # a process of the same user, started by the test
why = harness.lock_down(on_device=False)
results = {"locked": why}

def attempt(name, call):
    try:
        call()
        results[name] = "allowed"
    except Exception as exc:
        results[name] = type(exc).__name__

attempt("signal another", lambda: os.kill(bystander_pid, 0))
attempt("signal the group", lambda: os.killpg(0, 0))
attempt("signal itself", lambda: os.kill(os.getpid(), 0))
attempt("pidfd", lambda: os.pidfd_open(bystander_pid))
attempt("its own limits", lambda: resource.prlimit(os.getpid(), resource.RLIMIT_NOFILE))
attempt("another's limits", lambda: resource.prlimit(bystander_pid, resource.RLIMIT_NOFILE))
attempt("priority", lambda: os.setpriority(os.PRIO_PROCESS, bystander_pid, 19))
attempt("affinity", lambda: os.sched_setaffinity(0, os.sched_getaffinity(0)))
attempt("fork", lambda: os.fork())
attempt("thread", lambda: threading.Thread(target=len, args=((),)).start())
attempt("timer", lambda: signal.setitimer(signal.ITIMER_REAL, 5))
attempt("open", lambda: open("/proc/self/status").close())
attempt("another's memory", lambda: open(f"/proc/{bystander_pid}/mem", "rb").close())
attempt("pipe", lambda: [os.close(fd) for fd in os.pipe()])
print(json.dumps(results))
'''


def test_the_lock_down_refuses_every_reach_beyond_the_worker_and_keeps_what_it_needs(tmp_path) -> None:
    """The kernel enforces it (no audit hook here): a direct check of ``harness.lock_down``."""
    import json
    import platform
    import subprocess
    import sys
    from pathlib import Path

    import relayrl.environments.kernels.harness as harness

    if sys.platform != "linux" or platform.machine() != "x86_64":
        pytest.skip(f"the lock-down is built for Linux on x86-64, not {sys.platform} on {platform.machine()}")
    script = tmp_path / "probe.py"
    script.write_text(LOCKED_DOWN_PROBE)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        result = subprocess.run([sys.executable, str(script), str(Path(harness.__file__).parent), str(bystander.pid)],
                                capture_output=True, text=True, timeout=60)
    finally:
        bystander.kill()
        bystander.wait()
    found = json.loads(result.stdout.splitlines()[-1])
    assert found.pop("locked") is None, found
    allowed = {"signal itself", "its own limits", "pipe"}
    assert {name for name, outcome in found.items() if outcome == "allowed"} == allowed, found
    assert all(outcome in ("PermissionError", "RuntimeError", "itimer_error") for name, outcome in found.items()
               if name not in allowed), found
