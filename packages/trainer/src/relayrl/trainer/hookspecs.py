"""Hook specifications owned by relayrl-trainer (documented in ``docs/plugins.md``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from relayrl.core.plugins import Registration, hookspec


@hookspec
def relayrl_trainer_backends() -> Iterable[Registration[Any]]:
    """Trainer backends, selected by ``[trainer] backend``.

    ``factory(model, *, algo, config, version, pm, run_config=None)`` returns a trainer with ``step(groups, *, weights=None)
    -> metrics`` (``weights``: one per group, scaling its advantages)
    (one optimiser step over a batch of scored groups), ``accumulate_gradients(groups)``,
    ``version`` (the policy version of its weights), ``model``, ``optimizer``, ``state_dict()`` /
    ``load_state_dict()`` (its checkpoint) and ``named_full_state()``: the whole model's state dict,
    tensor by tensor, for publishing (a sharded backend gathers shards one tensor at a time; all
    ranks iterate together). ``run_config`` is the whole run configuration when there is one
    (``relayrl run``): a backend takes its own section from it (``[deepspeed]``). Built in: ``torch``.

    Capabilities (declared in the registration's ``capabilities``):

    ``data-parallel``
        It trains as one of several data-parallel ranks: under ``[trainer] ranks`` > 1 it is built
        in every rank's process, with torch.distributed already initialised, and every rank passes
        it the same groups; its ``state_dict()`` is then this rank's checkpoint shard.
    ``elastic``
        A data-parallel backend whose every rank holds the whole model and optimiser state, and
        whose step's gradient does not depend on the number of ranks (the built-in ``torch``
        backend): ``[trainer] elastic = true`` then lets the ranks shrink
    and regrow between steps (the group is re-formed with a new world size; ``step`` reduces over
    ``relayrl.trainer.distributed.data_parallel_group()``, which the caller sets, and a rank that
    joins receives rank 0's ``state_dict()``). A step whose collective fails must leave no gradient
    behind: it is redone.
    """
