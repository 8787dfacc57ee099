"""Inputs the answer cannot know: variations of the hidden tests' own calls, answered by the gold solution.

A table of the hidden tests' expected outputs passes the tests, in whatever spelling; it fails on
inputs nobody wrote down. For a task with a gold patch, the grader (``split`` verdict):

1. runs the hidden tests on the gold solution with the split runner in ``record`` mode, which
   reports the calls the tests made to module-level functions of the workspace with plain data in
   and plain data out;
2. makes new inputs like them with :func:`variations` (numbers moved within their sign and
   magnitude, strings rearranged within their own characters, sequences reordered, each element
   varied), from a seed drawn for each group of answers, so no two groups see the same inputs;
3. has the gold solution answer them (``probe`` mode; each twice, in fresh imports: an input whose
   answer changes, or that raises, is dropped: only what the gold solution answers plainly and
   stably becomes a check);
4. grades each answer on them as well (``checks`` in the payload): after the hidden tests, in a
   fresh import, every check must give the gold solution's result (and leave the arguments as it
   did); they are ``relayrl.check.N`` in the inventory, so a failed check fails the answer.

The inputs stay close to the tests' own, so an honest fix agrees with the gold solution on them; a
task whose tests pass only hand-picked inputs a fix may treat differently should set
``metadata["probes"] = false``.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from typing import Any

from relayrl.sandbox import split_runner

__all__ = ["MAX_CHECKS", "VARIANTS_PER_CALL", "mutate", "variations"]

MAX_CHECKS = 24
"""The most generated inputs per group of answers (each costs two calls of the gold solution, one of the answer)."""
VARIANTS_PER_CALL = 4

_ENCODE, _DECODE = split_runner.wire_codec()  # the runner's wire format: what the calls were recorded in


def _plain_only(tag: str, body: Any) -> Any:
    raise ValueError("a recorded call holds something that is not plain data")


def decode(data: Any) -> Any:
    """Plain data from the split runner's encoding (a handle is refused)."""
    return _DECODE(data, _plain_only)


def encode(value: Any) -> Any:
    """The split runner's encoding of plain ``value``."""
    return _ENCODE(value, lambda item: _plain_only("h", item))


def mutate(value: Any, rng: random.Random) -> Any:
    """A value like ``value``: the same types and shape, other contents."""
    kind = type(value)
    if value is None or kind is bool:
        return value
    if kind is int:
        if value == 0:
            return rng.randint(0, 3)
        step = max(1, abs(value) // 4)
        moved = abs(value) + rng.choice([-1, 1]) * rng.randint(1, step)
        return (1 if value > 0 else -1) * max(1, moved)
    if kind is float:
        return value * (1 + rng.uniform(-0.25, 0.25)) if value else rng.uniform(0, 1)
    if kind in (str, bytes):
        items = list(value)
        if len(items) > 1 and rng.random() < 0.5:
            rng.shuffle(items)
        elif len(items) > 1:
            items[rng.randrange(len(items))] = rng.choice(items)
        return "".join(items) if kind is str else bytes(items)
    if kind in (list, tuple):
        items = [mutate(item, rng) if rng.random() < 0.6 else item for item in value]
        if len(items) > 1 and rng.random() < 0.4:
            rng.shuffle(items)
        return items if kind is list else tuple(items)
    if kind is dict:
        return {key: mutate(item, rng) for key, item in value.items()}
    if kind in (set, frozenset):
        return kind(mutate(item, rng) for item in value)
    return value


def variations(calls: Iterable[Sequence[Any]], rng: random.Random, *, limit: int = MAX_CHECKS,
               per_call: int = VARIANTS_PER_CALL) -> list[list[Any]]:
    """New ``[path, args, kwargs]`` (encoded) like the recorded ``calls``, none equal to a recorded one.

    Each varies one argument of a recorded call and keeps the others: the call stays as meaningful
    as the test made it (``clamp(x, low, high)`` keeps its bounds while ``x`` moves).
    """
    recorded = [(str(path), decode(args), decode(kwargs)) for path, args, kwargs in calls]
    seen = {repr((path, args, kwargs)) for path, args, kwargs in recorded}
    made: list[list[Any]] = []
    for _ in range(3 * per_call):  # a draw may repeat a recorded or made input: it is skipped
        for path, args, kwargs in recorded:
            if len(made) >= limit:
                return made
            if not args and not kwargs:
                continue
            args, kwargs = list(args), dict(kwargs)
            which = rng.randrange(len(args) + len(kwargs))
            if which < len(args):
                args[which] = mutate(args[which], rng)
            else:
                name = sorted(kwargs)[which - len(args)]
                kwargs[name] = mutate(kwargs[name], rng)
            candidate = (path, args, kwargs)
            if repr(candidate) in seen:
                continue
            seen.add(repr(candidate))
            made.append([path, encode(candidate[1]), encode(candidate[2])])
    return made
