"""Tiny random models for tests (dense Llama, Qwen3 mixture of experts): built from a config, no downloads."""

from __future__ import annotations

from pathlib import Path

import torch


def tiny_llama(*, vocab_size: int = 64, seed: int = 0, hidden_size: int = 64, layers: int = 2):
    """A randomly initialised Llama-style causal LM (~80k parameters at the defaults), in eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, intermediate_size=2 * hidden_size,
                         max_position_embeddings=1024, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
                         pad_token_id=0)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.eval()


def tiny_moe(*, vocab_size: int = 64, seed: int = 0, hidden_size: int = 64, layers: int = 2, experts: int = 8,
             top_k: int = 2):
    """A randomly initialised Qwen3-MoE causal LM (every layer sparse, ``experts`` experts, ``top_k`` per
    token, gates renormalised over them), in eval mode."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=layers,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=hidden_size // 4,
                            intermediate_size=2 * hidden_size, moe_intermediate_size=hidden_size, num_experts=experts,
                            num_experts_per_tok=top_k, norm_topk_prob=True, decoder_sparse_step=1,
                            max_position_embeddings=1024, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
                            pad_token_id=0)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen3MoeForCausalLM(config)
    return model.eval()


def save_tiny_model(directory: Path | str, **kwargs) -> Path:
    """Write a tiny Llama (safetensors + config) to ``directory``, ready for ``from_pretrained``."""
    directory = Path(directory)
    tiny_llama(**kwargs).save_pretrained(directory)
    return directory
