"""relayrl-buffer's own plugin: its hookspecs, built-in admission policies and prompt scheduler, ``[buffer]``."""

from __future__ import annotations

from relayrl.core.plugins import Registration, hookimpl


@hookimpl
def relayrl_addhooks(pluginmanager):
    from relayrl.buffer import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


@hookimpl
def relayrl_buffer_admission_policies():
    from relayrl.buffer.admission import StalenessPolicy, ZeroVariancePolicy

    yield Registration("staleness", StalenessPolicy.from_config,
                       "bound trainer version minus oldest token version; drop or down-weight beyond it")
    yield Registration("zero-variance", ZeroVariancePolicy.from_config,
                       "drop groups whose rewards are all equal (no learning signal)")


@hookimpl
def relayrl_buffer_prompt_schedulers():
    from relayrl.buffer.prompts import PromptScheduler

    yield Registration("pass-rate", PromptScheduler,
                       "seeded epochs over the tasks; per-task pass rates; optional difficulty band")


@hookimpl
def relayrl_core_config_sections():
    from relayrl.buffer.config import BufferSection

    yield Registration("buffer", BufferSection, "rollout segments, staleness admission, batching, prompt scheduling")
