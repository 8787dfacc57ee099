"""The README's quickstart, as written, from a fresh virtual environment (a short run of it).

The install line is taken verbatim from the README; the run line too, with flags appended that make
it short (a few steps, a tiny warm-up) and keep every group, so the whole pipeline is exercised in
about a minute. Whether it learns is the full run's business (docs/quickstart.md), never CI's.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shlex
import shutil
import subprocess
import uuid
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


SYSTEM_PYTHON = "/usr/bin/python3"


def why_no_nonroot_quickstart() -> str | None:
    """Why the non-root quickstart test cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "needs root to create the user (run as a non-root user, the test above is this test)"
    for tool in ("useradd", "su"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if subprocess.run([SYSTEM_PYTHON, "-c", "import venv, ensurepip"], capture_output=True).returncode != 0:
        return f"{SYSTEM_PYTHON} cannot make virtual environments (Debian: apt-get install -y python3-venv)"
    return None


@pytest.fixture
def env_dir(tmp_path):
    """A fresh venv, deleted afterwards (it holds torch: pytest's kept temp folders would pile up GBs)."""
    location = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(location)
    yield location
    shutil.rmtree(location, ignore_errors=True)


def test_the_readme_quickstart_installs_and_runs_in_a_fresh_environment(tmp_path, env_dir):
    if why_no_nonroot_quickstart() is None:
        # The test below does all this from a fresh venv as a fresh non-root user, the harder case
        # (and the README's reader); running both spent ~3.5 min of CI on the same install and run.
        pytest.skip("as root, the non-root quickstart test below runs this install and run as a fresh user")
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


def test_the_readme_quickstart_runs_as_a_non_root_user(tmp_path):
    """The people the README addresses are rarely root: as a fresh non-root user, from a venv of the
    system Python, the quickstart installs and runs, on the strongest sandbox that user can have."""
    reason = why_no_nonroot_quickstart()
    if reason is not None:
        pytest.skip(reason)
    user = "relayrl-quickstart"
    if subprocess.run(["id", user], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "--create-home", user], check=True, capture_output=True)
    home = Path(pwd.getpwnam(user).pw_dir)
    work = home / f"quickstart-{uuid.uuid4().hex[:8]}"
    try:
        shutil.copytree(ROOT, work, ignore=shutil.ignore_patterns(".git", ".nox", "runs", "__pycache__", "*.egg-info"))
        subprocess.run(["chown", "-R", f"{user}:", str(work)], check=True)
        install, run = readme_quickstart()
        script = " && ".join([
            f"cd {shlex.quote(str(work))}", f"{SYSTEM_PYTHON} -m venv venv",
            f"venv/bin/python {shlex.join(shlex.split(install)[1:])} -q",
            f"venv/bin/relayrl {shlex.join([*shlex.split(run)[1:], '--run-dir', 'run', *SHORT])}"])
        result = subprocess.run(["su", user, "-s", "/bin/bash", "-c", script], capture_output=True, text=True,
                                timeout=1800)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        assert re.search(r"^sandbox: \w+ with .*network-none", result.stdout, re.MULTILINE), result.stdout[:2000]
        records = [json.loads(line) for line in (work / "run" / "metrics.jsonl").read_text().splitlines()]
        assert [record["step"] for record in records] == [1, 2, 3]
        rollout = json.loads((work / "run" / "status" / "rollout.json").read_text())
        assert rollout["metrics"]["sandbox/calls"] > 0
        assert (work / "run" / "report" / "report.html").exists()
        assert "report:" in result.stdout
    finally:
        shutil.rmtree(work, ignore_errors=True)
