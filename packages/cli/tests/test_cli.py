"""The relayrl command, run as a real subprocess against real (made-up) plugin distributions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from relayrl.core.testing.distributions import write_distribution


def relayrl(*args, pythonpath=None, env=None):
    environ = dict(os.environ, **(env or {}))
    if pythonpath:
        environ["PYTHONPATH"] = os.pathsep.join([str(pythonpath), environ.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "relayrl.cli", *args], capture_output=True, text=True,
                          env=environ, timeout=120)


def test_plugins_lists_the_builtins():
    result = relayrl("plugins")
    assert result.returncode == 0, result.stderr
    header, *rows = result.stdout.splitlines()
    assert header.split() == ["PLUGIN", "DISTRIBUTION", "VERSION", "KIND", "HOOKS"]
    core = next(row for row in rows if row.startswith("relayrl-core "))
    assert "built-in" in core and "relayrl_core_stores" in core


def test_plugins_json_includes_registrations():
    result = relayrl("plugins", "--json")
    data = json.loads(result.stdout)
    stores = {entry["name"]: entry["plugin"] for entry in data["registrations"]["relayrl_core_stores"]}
    assert stores["file"] == "relayrl-core"


def test_third_party_plugin_is_listed(tmp_path):
    write_distribution(tmp_path, distribution="relayrl-dictstore", module="relayrl_dictstore", version="2.3.4", source="""
        from relayrl.core.plugins import Registration, hookimpl
        from relayrl.core.store import MemoryStore

        @hookimpl
        def relayrl_core_stores():
            yield Registration("dict", MemoryStore.from_url, "a dict store")
    """)
    result = relayrl("plugins", "-r", pythonpath=tmp_path)
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if line.startswith("relayrl-dictstore "))
    assert row.split()[:4] == ["relayrl-dictstore", "relayrl-dictstore", "2.3.4", "plugin"]
    assert any(line.split()[:2] == ["dict", "relayrl-dictstore"] for line in result.stdout.splitlines())


BROKEN = {
    "import": ("import does_not_exist_anywhere\n", "plugin 'relayrl-bad' from relayrl-bad 0.1.0 (relayrl_bad): "
               "import failed: ModuleNotFoundError"),
    "duplicate": ("""
        from relayrl.core.plugins import Registration, hookimpl

        @hookimpl
        def relayrl_core_stores():
            yield Registration("s3", lambda url: None)
    """, "relayrl_core_stores: name 's3' is registered by both plugin 'relayrl-core' and plugin 'relayrl-bad'"),
    "unknown-hook": ("""
        from relayrl.core.plugins import hookimpl

        @hookimpl
        def relayrl_core_nonsense():
            pass
    """, "plugin 'relayrl-bad': implements unknown hook 'relayrl_core_nonsense'"),
}


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_broken_plugin_gives_one_line_error_naming_it(tmp_path, kind):
    source, expected = BROKEN[kind]
    write_distribution(tmp_path, distribution="relayrl-bad", module="relayrl_bad", source=source)
    result = relayrl("plugins", pythonpath=tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("relayrl: error: ")
    assert expected in lines[0]
    # The escape hatch: disabling the broken plugin by name makes the command work again.
    assert relayrl("plugins", pythonpath=tmp_path, env={"RELAYRL_DISABLE_PLUGINS": "relayrl-bad"}).returncode == 0


def test_config_check_accepts_a_valid_file(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[run]\nname = "x"\nseed = 3\n')
    result = relayrl("config", "check", str(path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"ok: {path}")
    shown = json.loads(relayrl("config", "check", str(path), "--set", "run.seed=4", "--show").stdout)
    assert shown["run"] == {"name": "x", "seed": 4, "deterministic": False, "lease_ttl_s": 60.0}


def test_config_check_names_the_bad_key(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("[run]\nsed = 3\n")
    result = relayrl("config", "check", str(path))
    assert result.returncode == 2
    assert result.stderr.strip() == f"relayrl: error: {path}: run.sed: unknown key; did you mean seed?"


def test_data_verify_reports_a_bad_location_on_one_line(tmp_path):
    # With relayrl-sandbox installed the task source refuses the location; without it the command
    # says which package to install. Either way: one line, exit status 2.
    result = relayrl("data", "verify", str(tmp_path / "absent.jsonl"))
    assert result.returncode == 2 and result.stderr.startswith("relayrl: error: ")
    assert "no task source accepts it" in result.stderr or "needs relayrl-sandbox" in result.stderr


BAD_INPUTS = [
    # (config text or None for "the path is a directory", --set overrides, what the one line must name)
    (None, [], "is a directory, not a TOML config file"),
    ("[run]\nname = '../..'\n", [], "run.name: '../..' is not a plain directory name"),
    ("[run]\nname = ''\n", [], "run.name: '' is not a plain directory name"),
    ("[store]\nurl = 'nosuch://bucket/run'\n", [], "store.url: no store handles scheme 'nosuch'"),
    ("[rollout]\nharness_options = { max_tokens = 0 }\n", [], "rollout.harness_options.max_tokens: must be at least 1"),
    ("[rollout]\nharness = 'coding-agent'\nharness_options = { max_turns = 0 }\n", [],
     "rollout.harness_options.max_turns: must be at least 1"),
    ("[algo]\noptimizer = { lr = -1e-4 }\n", [], "algo.optimizer.lr: must be a finite number > 0"),
    ("[algo]\noptimizer = { lr = 0.0 }\n", [], "algo.optimizer.lr: must be a finite number > 0"),
    ("", ["algo.optimizer.lr=nan"], "algo.optimizer.lr: must be a finite number > 0"),
    ("", ["trainer.warmup.lr=inf"], "trainer.warmup.lr: must be a finite number > 0"),
    ("[model]\npath = '/nonexistent/model'\n", [], "model.path: /nonexistent/model is not a model directory"),
    ("", ["run.lease_ttl_s=0"], "run.lease_ttl_s: must be a finite number of seconds > 0"),
    # A bad value from --set is blamed on the override, not on the file it overrides.
    ("[algo]\noptimizer = { lr = 1e-5 }\n", ["algo.optimizer.lr='abc'"],
     "--set algo.optimizer.lr='abc': algo.optimizer.lr: expected float, got str"),
    ("", ["algoo.x=1"], "--set algoo.x=1: algoo: unknown key; did you mean algo?"),
    ("[trainer]\nstepz = 3\n", ["trainer.steps=4"], "run.toml: trainer.stepz: unknown key"),
]


@pytest.mark.parametrize("text,overrides,message", BAD_INPUTS)
def test_bad_configs_get_one_line_naming_the_key_and_exit_2(tmp_path, capsys, text, overrides, message):
    from relayrl.cli.main import main

    path = tmp_path / "run.toml"
    if text is None:
        path.mkdir()
    else:
        path.write_text(text)
    status = main(["config", "check", str(path), *(arg for item in overrides for arg in ("--set", item))])
    error = capsys.readouterr().err
    assert status == 2 and message in error, error
    assert error.startswith("relayrl: error: ") and error.count("\n") == 1 and "Traceback" not in error


def test_a_path_that_cannot_be_written_is_one_line_not_a_traceback(tmp_path, capsys):
    """A file where a directory must go (the same error as a read-only place, for root too)."""
    from relayrl.cli.main import main

    examples = Path(__file__).resolve().parents[3] / "examples"
    blocker = tmp_path / "file"
    blocker.write_text("in the way")
    run_dir = tmp_path / "run"
    (run_dir).mkdir()
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "time": 1.0, "metrics": {"reward/mean": 0.5}}\n')
    cases = [["report", str(run_dir), "-o", str(blocker / "report")],
             ["run", str(examples / "quickstart.toml"), "--run-dir", str(blocker / "run")]]
    for argv in cases:
        status = main(argv)
        error = capsys.readouterr().err
        assert status == 2 and error.startswith("relayrl: error: ") and error.count("\n") == 1, error
        assert str(blocker) in error and "Not a directory" in error


def test_resume_refuses_overrides_that_its_checkpoints_and_weights_cannot_follow(tmp_path, capsys):
    from relayrl.cli.main import main
    from relayrl.core.config import load_config

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    written = json.dumps(load_config(Path(__file__).resolve().parents[3] / "examples" / "quickstart.toml").raw)
    (run_dir / "config.json").write_text(written)
    (run_dir / "checkpoints" / "step-000000001").mkdir(parents=True)  # a run that started (one that never did takes fixes)
    for override, key in [("model.init.hidden_size=64", "model.init.hidden_size"), ("store.url='s3://b/r'", "store.url"),
                          ("weight_sync.prefix='other'", "weight_sync.prefix")]:
        status = main(["run", "--resume", str(run_dir), "--set", override])
        error = capsys.readouterr().err
        assert status == 2 and error.startswith(f"relayrl: error: {key}: cannot change on --resume"), error
        assert error.count("\n") == 1
    assert (run_dir / "config.json").read_text() == written  # nothing rewritten
