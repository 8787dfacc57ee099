"""Benchmarks keep running: each one executes in its quick mode (results are printed, never asserted on time)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_quick(script: str, *args: str) -> str:
    """Run ``benchmarks/<script> --quick ARGS``; fail with its stderr unless it exits 0; return stdout."""
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--quick", *args], capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_wire_benchmark_quick_mode_runs_and_checks_round_trips():
    out = run_quick("wire.py")
    assert "relayrl msgpack+zstd" in out and "pickle" in out and "json" in out


def test_replay_benchmark_quick_mode_runs_and_agrees_with_the_dense_reference():
    out = run_quick("replay.py")
    assert "dense mask (baseline)" in out and "gradients agree" in out


def test_engine_benchmark_quick_mode_runs():
    out = run_quick("engine.py")
    assert "relayrl / generate" in out and "recording routing tok/s" in out


def test_engine_batching_benchmark_quick_mode_runs_both_levers():
    out = run_quick("engine_batching.py")
    assert "Continuous / static" in out and "Prefill tokens per generated token cut" in out


def test_agent_prefill_benchmark_quick_mode_runs_the_agent_example_with_and_without_the_levers():
    out = run_quick("agent_prefill.py")
    assert "as shipped" in out and "neither" in out and "neither / as shipped" in out


def test_buffer_benchmark_quick_mode_runs_on_local_files_and_s3():
    out = run_quick("buffer.py")
    assert "local files" in out and "S3 (moto, loopback)" in out and "ingest / read" in out


def _run_weight_sync_benchmark(name: str) -> str:
    return run_quick(f"weight_sync/{name}")


def test_weight_sync_compression_benchmark_quick_mode_covers_every_codec_and_lr():
    out = _run_weight_sync_benchmark("compression.py")
    for text in ("xor-zstd", "xor-planes-zstd", "xor-sparse-zstd", "planes-zstd", "1e-07", "1e-06", "1e-05"):
        assert text in out, text


def test_weight_sync_throughput_benchmark_quick_mode_compares_with_bare_zstd_and_memcpy():
    out = _run_weight_sync_benchmark("throughput.py")
    assert "bare zstd-1 compress" in out and "memcpy" in out and "xor-sparse-zstd decode+apply" in out


def test_weight_sync_end_to_end_benchmark_quick_mode_runs_file_and_s3():
    out = _run_weight_sync_benchmark("end_to_end.py")
    assert "|  file |" in out and "|    s3 |" in out and "speed-up" in out


def test_weight_sync_real_deltas_benchmark_quick_mode_trains_publishes_and_applies_real_updates():
    out = _run_weight_sync_benchmark("real_deltas.py")
    rows = [line for line in out.splitlines() if line.startswith(("| adamw |", "| muon |"))]
    assert len(rows) == 2 + 4, out  # a summary row per optimizer, two extrapolated sizes each
    # The trainer really moved the published weights (the engine's bits are checked equal inside).
    assert all(float(row.split(" | ")[1].rstrip("%")) > 0 for row in rows[:2]), rows


def test_weight_sync_bootstrap_benchmark_quick_mode_compares_replay_with_a_snapshot():
    out = _run_weight_sync_benchmark("bootstrap.py")
    assert "snapshot + 24 deltas" in out and "one full snapshot" in out


def test_checkpoint_benchmark_quick_mode_runs():
    out = run_quick("checkpoint.py")
    assert "save: trainer blocked" in out and "recover from the peer" in out


def test_sandbox_benchmark_quick_mode_runs_every_available_backend_against_the_baseline():
    out = run_quick("sandbox.py")
    assert "bare subprocess (baseline)" in out and "process (" in out
    assert "Grading 4 answers" in out and "| process |" in out


def test_trainer_step_benchmark_quick_mode_checks_the_losses_agree():
    out = run_quick("trainer_step.py")
    assert "hand-written torch (baseline)" in out and "Framework overhead" in out
    assert "max gradient difference" in out


def test_replay_ablation_quick_mode_runs_all_three_variants():
    out = run_quick("replay_ablation.py")
    assert all(f"\n{name} |" in out for name in ("replay", "naive", "plain"))
    assert "mismatch KL" in out and "success-rate slope over the last 3 tenths" in out
    assert "Last tenth, replay against plain" in out


def test_routing_replay_quick_mode_runs_both_arms_on_a_bfloat16_engine_and_sizes_the_routing_records():
    out = run_quick("routing_replay.py")
    assert "expert sets differing (share of token-layer pairs), replay" in out
    assert "expert sets differing (share of token-layer pairs), no-replay" in out
    assert "bytes per routed position" in out


@pytest.mark.parametrize("workload", ["quickstart", "agent"])
def test_async_vs_sync_quick_mode_runs_both_pipelines_and_the_synchronous_one_wastes_nothing(workload):
    out = run_quick("async_vs_sync.py", "--workload", workload)
    assert "| asynchronous | 0 |" in out and "asynchronous / synchronous" in out
    # The true synchronous loop trains only on-policy groups (staleness 0) and drops none.
    row = next(line for line in out.splitlines() if line.startswith("| synchronous | 0 |"))
    assert row.split(" | ")[6:8] == ["0.00", "0"], row


def test_overhead_quick_mode_runs_relayrl_and_the_hand_written_loop():
    out = run_quick("overhead.py")
    assert "| relayrl | 0 |" in out and "| hand-written | 0 |" in out, out
    assert "relayrl / hand-written groups graded per second" in out


def test_overhead_profile_attributes_samples_to_the_innermost_matching_category(tmp_path):
    """The --profile summary: py-spy's collapsed stacks, each sample counted once, torch inside relayrl wins."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from overhead import collapse

    raw = tmp_path / "rollout.txt"
    raw.write_text(
        "main (relayrl/cli/main.py:10);step (relayrl/rollout/engines/torch_engine.py:150);forward (torch/nn/module.py:1) 30\n"
        "main (relayrl/cli/main.py:10);_run_once (asyncio/base_events.py:1900);grade (relayrl/rollout/batch_grading.py:5) 10\n"
        "main (relayrl/cli/main.py:10);helper (relayrl/rollout/manager.py:20) 5\n"
        "a line py-spy did not write\n")
    summary = collapse(raw)
    assert summary["samples"] == 45
    assert summary["categories"] == {"model forward/backward (torch)": 30,
                                     "sandboxed grading (subprocess, bubblewrap)": 10,
                                     "other Python (relayrl and the standard library)": 5}
    assert summary["relayrl_frames"]["step (rollout/engines/torch_engine.py:150)"] == 30


def test_elastic_ranks_quick_mode_kills_a_rank_in_each_mode():
    out = run_quick("elastic_ranks.py")
    assert "| elastic |" in out and "| restart-all |" in out and "Both runs' ledgers verified" in out


def test_the_gpu_checks_deepspeed_half_runs_on_cpu():
    """benchmarks/gpu/deepspeed_steps.py in its quick mode, on gloo: the GPU check's script cannot rot."""
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=1",
                             str(ROOT / "benchmarks" / "gpu" / "deepspeed_steps.py"), "--quick"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ZeRO-3" in result.stdout and "first publish" in result.stdout


def test_agent_warmup_benchmark_quick_mode_samples_the_warmed_agent():
    out = run_quick("agent_warmup.py")
    assert "demonstrations" in out and "| 5 |" in out


def test_eval_benchmarks_quick_modes_run_with_and_without_eval_then_evaluate_before_and_after_rl(tmp_path):
    # eval_quickstart evaluates the run eval_during_run kept (one quickstart run fewer to wait for).
    out = run_quick("eval_during_run.py", "--runs-dir", str(tmp_path))
    assert "without | 1 |" in out and "with | 1 |" in out and "steps/s with / without [eval]" in out
    out = run_quick("eval_quickstart.py", "--run-dir", str(tmp_path / "with-0"))
    assert "| after the warm-up, before RL | 1 |" in out and "| after RL (4 steps) |" in out



@pytest.mark.parametrize("example, header", [("quickstart", "| steps | success rate |"),
                                             ("agent", "| steps | reward (grader) |"),
                                             ("kernels", "| steps | reward (grader) | correct |")])
def test_example_run_quick_mode_tabulates_ten_tenths(example, header):
    out = run_quick("example_run.py", "--example", example)
    assert header in out, out
    assert sum(line.startswith("| ") and "---" not in line for line in out.splitlines()) >= 11, out  # header + tenths


def test_weight_sync_checksum_benchmark_quick_mode_compares_the_candidates():
    out = run_quick("weight_sync/checksum.py")
    assert "manifest checksum" in out and "zlib.crc32" in out and "blake2b" in out and "first touch" in out


def test_engine_paths_quick_mode_runs_both_serving_paths_or_says_what_is_missing():
    """With vLLM and Dynamo installed both paths run a short quickstart; without, one line says what is missing."""
    import importlib.util

    out = run_quick("engine_paths.py")
    if importlib.util.find_spec("vllm") is None or importlib.util.find_spec("dynamo") is None:
        assert "not measured: this environment lacks" in out
        pytest.skip("vLLM or the Dynamo runtime is not installed: engine_paths.py measured nothing")
    assert "| torch engine | 0 |" in out and "| vLLM + Dynamo | 0 |" in out
    assert "vLLM + Dynamo / torch engine, groups graded per second" in out


def test_kernel_grader_benchmark_quick_mode_runs():
    out = run_quick("kernel_grader.py")
    assert "median speed-up" in out or "skipped:" in out


@pytest.mark.parametrize("behaviour", ["sequential", "verbose"])
def test_length_penalty_effect_quick_mode_runs_the_agent_example_with_and_without_the_penalty(behaviour):
    out = run_quick("length_penalty_effect.py", "--behaviour", behaviour)
    assert "penalty off, seed 0" in out and "penalty on, seed 0" in out
    assert "| 0 | off |" in out and "| 0 | on |" in out and "Means over the seeds" in out
    assert ("successes naming a file twice" in out) == (behaviour == "verbose")


def test_kernels_learning_quick_mode_trains_then_evaluates_version_1_and_the_newest_of_two_variants():
    out = run_quick("kernels_learning.py")
    assert "| multi-turn | 0 | 4 |" in out and "| single-turn-same-start | 0 | 4 |" in out, out
    assert "- multi-turn: held-out reward" in out and "- single-turn-same-start: held-out reward" in out
    assert "Multi-turn minus single-turn-same-start training" in out


def test_trainer_precision_benchmark_quick_mode_runs():
    out = run_quick("trainer_precision.py")
    assert "float32 (baseline)" in out and "bfloat16 autocast" in out and "cosine" in out
