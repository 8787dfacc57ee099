"""The README's quickstart, as written, from a fresh virtual environment (a short run of it).

The install line is taken verbatim from the README; the run line too, with flags appended that make
it short (a few steps, a tiny warm-up) and keep every group, so the whole pipeline is exercised in
about a minute. Whether it learns is the full run's business (docs/quickstart.md), never CI's.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHORT = ["--steps", "3", "--set", "trainer.warmup.steps=3", "--set", "rollout.environment_options.tasks=500",
         "--set", "buffer.batch_groups=2", "--set", "rollout.skip_zero_variance=false",
         "--set", "buffer.admission=['staleness']"]


def readme_quickstart() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- quickstart -->\s*```bash\n(.*?)```\s*<!-- /quickstart -->", text, re.DOTALL)
    assert block, "README.md lost its marked quickstart block"
    return [line for line in block.group(1).splitlines() if line.strip()]


@pytest.fixture
def env_dir(tmp_path):
    """A fresh venv, deleted afterwards (it holds torch: pytest's kept temp folders would pile up GBs)."""
    location = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(location)
    yield location
    shutil.rmtree(location, ignore_errors=True)


def test_the_readme_quickstart_installs_and_runs_in_a_fresh_environment(tmp_path, env_dir):
    install, run = readme_quickstart()
    assert install.startswith("python3 -m pip install") and run.startswith("relayrl run ")
    bin_dir = env_dir / "bin"
    subprocess.run([str(bin_dir / "python"), *shlex.split(install)[1:], "-q"], cwd=ROOT, check=True, timeout=1200)

    run_dir = tmp_path / "run"
    command = [str(bin_dir / "relayrl"), *shlex.split(run)[1:], "--run-dir", str(run_dir), *SHORT]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in records] == [1, 2, 3]
    # The rollout process's own count (status/rollout.json, rewritten every second): a step's
    # metrics carry it only once that process has reported, which a 3-step run can outpace.
    rollout = json.loads((run_dir / "status" / "rollout.json").read_text())
    assert rollout["metrics"]["sandbox/calls"] > 0
    assert (run_dir / "report" / "report.html").exists()
    assert "report:" in result.stdout
