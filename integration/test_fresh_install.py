"""relayrl-core installs alone, without torch, into a fresh virtual environment."""

from __future__ import annotations

import subprocess
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_core_alone_installs_no_torch_and_imports(tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "-c", str(ROOT / "constraints.txt"),
                    str(ROOT / "packages/core")], check=True, timeout=600)
    installed = subprocess.run([str(python), "-m", "pip", "list", "--format=freeze"], check=True,
                               capture_output=True, text=True).stdout.lower()
    names = {line.split("==")[0] for line in installed.splitlines()}
    assert "relayrl-core" in names
    assert "torch" not in names, "relayrl-core must not pull torch"
    assert names <= {"relayrl-core", "msgspec", "pluggy", "fsspec", "zstandard", "pip", "setuptools", "wheel"}, names
    probe = ("import relayrl.core, relayrl.core.store as s, tempfile;"
             "st = s.open_store(tempfile.mkdtemp()); st.put('k', b'v'); assert st.get('k') == b'v';"
             "import sys; assert 'torch' not in sys.modules; print('ok')")
    result = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "ok", result.stderr
