"""relayrl-buffer's own plugin: its hookspecs, built-in admission policies and prompt scheduler, ``[buffer]``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from relayrl.core.plugins import Registration, RelayrlPluginManager, hookimpl

if TYPE_CHECKING:
    from relayrl.buffer.hookspecs import AdmissionPolicyFactory, PromptSchedulerFactory


@hookimpl
def relayrl_addhooks(pluginmanager: RelayrlPluginManager) -> None:
    from relayrl.buffer import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


@hookimpl
def relayrl_buffer_admission_policies() -> Iterator[Registration[AdmissionPolicyFactory]]:
    from relayrl.buffer.admission import StalenessPolicy, ZeroVariancePolicy

    yield Registration("staleness", StalenessPolicy.from_config,
                       "bound trainer version minus oldest token version; drop or down-weight beyond it")
    yield Registration("zero-variance", ZeroVariancePolicy.from_config,
                       "drop groups whose rewards are all equal (no learning signal)")


@hookimpl
def relayrl_buffer_prompt_schedulers() -> Iterator[Registration[PromptSchedulerFactory]]:
    from relayrl.buffer.prompts import PromptScheduler

    yield Registration("pass-rate", PromptScheduler,
                       "seeded epochs over the tasks; per-task pass rates; optional difficulty band")


@hookimpl
def relayrl_core_config_sections() -> Iterator[Registration[Any]]:
    from relayrl.buffer.config import BufferSection

    yield Registration("buffer", BufferSection, "rollout segments, staleness admission, batching, prompt scheduling")
