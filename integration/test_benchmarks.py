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


def test_sandbox_benchmark_quick_mode_runs_every_available_backend_against_the_baseline():
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks/sandbox.py"), "--quick"], capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "bare subprocess (baseline)" in result.stdout and "process (" in result.stdout
    assert "grading 4 answers with process" in result.stdout
