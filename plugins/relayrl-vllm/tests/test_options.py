"""``[rollout] engine_options`` of the ``vllm`` engine are declared: a misspelt or ill-typed key fails when
the config loads, naming it (no vLLM needed)."""

from __future__ import annotations

import pytest

from relayrl.core.config import ConfigError, load_config


def test_declared_options_load():
    options = {"kept_sets": "logits-processor", "max_model_len": 512, "routing": "off", "engine_args": {"swap_space": 0}}
    assert load_config({"rollout": {"engine": "vllm", "engine_options": options}}).rollout.engine_options == options


@pytest.mark.parametrize(("options", "error"), [
    ({"kept_set": "auto"}, r"rollout\.engine_options\.kept_set: unknown key; did you mean kept_sets"),
    ({"kept_sets": "mask"}, r"rollout\.engine_options\.kept_sets: .*expected one of: auto, logits-processor, sampling-mask"),
    ({"max_model_len": 0}, r"rollout\.engine_options\.max_model_len: must be at least 1"),
    ({"dtype": "float16"}, r"rollout\.engine_options\.dtype: unknown key"),  # [rollout] engine_dtype's job
])
def test_a_wrong_option_is_refused_with_its_dotted_key(options, error):
    with pytest.raises(ConfigError, match=error):
        load_config({"rollout": {"engine": "vllm", "engine_options": options}})
