"""Wire-format benchmark: a realistic 32k-token agent trajectory with kept-sets.

Encodes and decodes one long agentic trajectory (40 assistant turns, 32,768 generated tokens,
each with its logprob, policy version and top-p kept-set; tool calls and outputs in between) in
relayrl's wire format, and, in the same run, the same content as plain Python lists through
pickle and JSON (what a first implementation would do). Prints size, encode and decode time,
and ratios against relayrl.

    python benchmarks/wire.py            # full run (a few seconds)
    python benchmarks/wire.py --quick    # a smoke run for CI: fewer repeats, same checks

Machines here are noisy: compare the ratios, not the absolute times.
"""

from __future__ import annotations

import argparse
import json
import pickle
import platform
import random
from collections.abc import Callable
from typing import Any

from results import command_line, commit, write_results
from timing import best_time  # benchmarks/timing.py (this script's folder is on sys.path)

from relayrl.core import codec, wire
from relayrl.core.arrays import pack_u32

VOCAB = 151_936  # a Qwen-sized vocabulary
GENERATED_TOKENS = 32_768
TURNS = 40


def kept_set_size(rng: random.Random) -> int:
    """Top-p (0.95) kept-set sizes are heavy-tailed: most tokens are near-certain."""
    roll = rng.random()
    if roll < 0.60:
        return 1
    if roll < 0.85:
        return rng.randint(2, 4)
    if roll < 0.97:
        return rng.randint(5, 20)
    return rng.randint(21, 200)


def make_trajectory(seed: int = 0) -> tuple[wire.Trajectory, dict[str, Any]]:
    """The trajectory as relayrl wire structs, and the same content as plain lists and dicts."""
    rng = random.Random(seed)
    per_turn = GENERATED_TOKENS // TURNS
    turns: list[wire.Turn] = []
    plain_turns: list[dict[str, Any]] = []
    system = [rng.randrange(VOCAB) for _ in range(600)]
    turns.append(wire.Turn(role="system", tokens=pack_u32(system), text="You are a coding agent."))
    plain_turns.append({"role": "system", "tokens": system, "text": "You are a coding agent."})
    version = 1000
    for turn_index in range(TURNS):
        count = per_turn + (GENERATED_TOKENS - per_turn * TURNS if turn_index == TURNS - 1 else 0)
        tokens, logprobs, versions, kept = [], [], [], []
        for _ in range(count):
            size = kept_set_size(rng)
            row = rng.sample(range(VOCAB), size)
            tokens.append(row[0])
            kept.append(row)
            logprobs.append(0.0 if size == 1 else -rng.expovariate(2.0))
            if rng.random() < 0.0005:  # an in-flight weight update lands mid-turn now and then
                version += 1
            versions.append(version)
        calls = [wire.ToolCall(id=f"call-{turn_index}-{k}", name=rng.choice(["bash", "read_file", "edit"]),
                               arguments={"command": f"pytest tests/test_{k}.py -x", "timeout": 60})
                 for k in range(rng.randint(1, 4))]
        span = wire.GeneratedSpan.build(tokens, logprobs, versions, kept=kept, engine_id="engine-3",
                                        finish_reason="tool_call")
        turns.append(wire.Turn(role="assistant", tokens=pack_u32([1, 2, 3]), generated=span, tool_calls=calls))
        outputs = [wire.ToolResult(call_id=call.id, output="ok\n" * rng.randint(5, 200), exit_status=0,
                                   wall_time_s=rng.uniform(0.01, 5.0)) for call in calls]
        output_tokens = [rng.randrange(VOCAB) for _ in range(rng.randint(50, 400))]
        turns.append(wire.Turn(role="tool", tokens=pack_u32(output_tokens), tool_results=outputs))
        plain_turns.append({"role": "assistant", "tokens": [1, 2, 3], "generated": {
            "tokens": tokens, "logprobs": logprobs, "versions": versions, "kept": kept,
            "engine_id": "engine-3", "finish_reason": "tool_call"},
            "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls]})
        plain_turns.append({"role": "tool", "tokens": output_tokens, "tool_results": [
            {"call_id": r.call_id, "output": r.output, "exit_status": r.exit_status, "wall_time_s": r.wall_time_s}
            for r in outputs]})
    trajectory = wire.Trajectory(trajectory_id="traj-0", task_id="swe-task-17", group_id="group-5", sample_index=3,
                                 segments=[wire.TrajectorySegment(turns=turns)], reward=1.0,
                                 reward_components={"success": 1.0, "length_penalty": 0.0}, engine_ids=["engine-3"])
    plain = {"trajectory_id": "traj-0", "task_id": "swe-task-17", "group_id": "group-5", "sample_index": 3,
             "segments": [{"turns": plain_turns}], "reward": 1.0,
             "reward_components": {"success": 1.0, "length_penalty": 0.0}, "engine_ids": ["engine-3"]}
    return trajectory, plain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few repeats (a CI smoke run)")
    args = parser.parse_args()
    repeats = 2 if args.quick else 7
    revision = commit()

    trajectory, plain = make_trajectory()
    kept_total = sum(len(span.kept_ids) // 4 for span in trajectory.generated_spans())
    setup = (f"One trajectory: {trajectory.num_generated_tokens:,} generated tokens, {trajectory.num_turns} assistant "
             f"turns, {kept_total:,} kept ids (mean kept-set {kept_total / trajectory.num_generated_tokens:.2f}); "
             f"python {platform.python_version()} on {platform.machine()}; best of {repeats}")
    print(setup)

    formats: list[tuple[str, Callable[[], bytes], Callable[[bytes], Any]]] = [
        ("relayrl msgpack", lambda: codec.encode(trajectory), lambda b: codec.decode(b, wire.Trajectory)),
        ("relayrl msgpack+zstd", lambda: codec.encode_compressed(trajectory),
         lambda b: codec.decode_compressed(b, wire.Trajectory)),
        ("pickle (plain lists)", lambda: pickle.dumps(plain, protocol=5), pickle.loads),
        ("json (plain lists)", lambda: json.dumps(plain).encode(), json.loads),
        ("pickle (relayrl structs)", lambda: pickle.dumps(trajectory, protocol=5), pickle.loads),
    ]
    rows = []
    for name, encode, decode in formats:
        encode_s, blob = best_time(encode, repeats)
        decode_s, decoded = best_time(lambda blob=blob, decode=decode: decode(blob), repeats)
        if isinstance(decoded, wire.Trajectory):
            assert decoded == trajectory, f"{name}: round trip changed the trajectory"
        else:
            assert decoded == plain or decoded == json.loads(json.dumps(plain)), f"{name}: round trip differs"
        rows.append((name, len(blob), encode_s, decode_s))

    base_size, base_encode, base_decode = rows[1][1], rows[1][2], rows[1][3]
    tokens = trajectory.num_generated_tokens
    lines = [setup + ":", "", "| format | size MB | encode ms | decode ms | encode Mtok/s | decode Mtok/s | size x "
             "| encode x | decode x |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, size, encode_s, decode_s in rows:
        lines.append(f"| {name} | {size / 1e6:.2f} | {encode_s * 1e3:.2f} | {decode_s * 1e3:.2f} | "
                     f"{tokens / encode_s / 1e6:.1f} | {tokens / decode_s / 1e6:.1f} | {size / base_size:.1f} | "
                     f"{encode_s / base_encode:.2f} | {decode_s / base_decode:.2f} |")
    lines += ["", "x columns: relative to `relayrl msgpack+zstd` (the stored format); higher means bigger or slower."]
    markdown = "\n".join(lines)
    print(markdown)
    if not args.quick:
        path = write_results("wire", command=command_line(), markdown=markdown, revision=revision,
                             data={"rows": [dict(zip(("format", "bytes", "encode_s", "decode_s"), row)) for row in rows]})
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
