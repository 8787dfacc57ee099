"""Benchmarks keep running: each one executes in its quick mode (results are printed, never asserted on time)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wire_benchmark_quick_mode_runs_and_checks_round_trips():
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks/wire.py"), "--quick"], capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "relayrl msgpack+zstd" in result.stdout and "pickle" in result.stdout and "json" in result.stdout


def test_replay_benchmark_quick_mode_runs_and_agrees_with_the_dense_reference():
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks/replay.py"), "--quick"], capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "dense mask (baseline)" in result.stdout and "gradients agree" in result.stdout


def test_engine_benchmark_quick_mode_runs():
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks/engine.py"), "--quick"], capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "relayrl / generate" in result.stdout


def test_buffer_benchmark_quick_mode_runs_on_local_files_and_s3():
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks/buffer.py"), "--quick"], capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "local files" in result.stdout and "S3 (moto, loopback)" in result.stdout and "ingest/read x" in result.stdout


def _run_weight_sync_benchmark(name: str) -> str:
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks/weight_sync" / name), "--quick"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    return result.stdout


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


def test_weight_sync_bootstrap_benchmark_quick_mode_compares_replay_with_a_snapshot():
    out = _run_weight_sync_benchmark("bootstrap.py")
    assert "snapshot + 24 deltas" in out and "one full snapshot" in out


def test_checkpoint_benchmark_quick_mode_runs():
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks/checkpoint.py"), "--quick"], capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "save: trainer blocked" in result.stdout and "recover from peer" in result.stdout


def test_sandbox_benchmark_quick_mode_runs_every_available_backend_against_the_baseline():
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks/sandbox.py"), "--quick"], capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "bare subprocess (baseline)" in result.stdout and "process (" in result.stdout
    assert "grading 4 answers with process" in result.stdout
