"""Generated inputs: like the tests' own calls (same types and shape, one argument varied), never theirs."""

from __future__ import annotations

import random

import pytest

from relayrl.sandbox.probes import decode, encode, mutate, variations

RECORDED = [("pkg.mod.clamp", encode([5, 0, 10]), encode({})),
            ("pkg.mod.median", encode([[4, 1, 3, 2]]), encode({})),
            ("pkg.mod.to_roman", encode([1994]), encode({})),
            ("pkg.mod.count", encode(["the cat the"]), encode({"case": True}))]


def test_variations_vary_one_argument_of_a_recorded_call_and_keep_the_rest():
    made = variations(RECORDED, random.Random(0))
    assert 8 <= len(made) <= 24
    recorded = {(path, repr(decode(args)), repr(decode(kwargs))) for path, args, kwargs in RECORDED}
    originals = {path: (decode(args), decode(kwargs)) for path, args, kwargs in RECORDED}
    for path, args, kwargs in made:
        args, kwargs = decode(args), decode(kwargs)
        assert (path, repr(args), repr(kwargs)) not in recorded
        original_args, original_kwargs = originals[path]
        changed = [a != b for a, b in zip(args, original_args)] + [kwargs[k] != original_kwargs[k] for k in kwargs]
        assert sum(changed) == 1, (path, args, kwargs)  # exactly one argument moved
        assert [type(a) for a in args] == [type(a) for a in original_args] and kwargs.keys() == original_kwargs.keys()


def test_values_keep_their_type_sign_and_characters():
    rng = random.Random(1)
    for _ in range(200):
        assert mutate(1994, rng) > 0 and mutate(-7, rng) < 0 and type(mutate(2.5, rng)) is float
        word = mutate("the cat", rng)
        assert set(word) <= set("the cat") and len(word) == len("the cat")
        assert len(mutate([4, 1, 3, 2], rng)) == 4 and type(mutate((1, 2), rng)) is tuple
        assert mutate(True, rng) is True and mutate(None, rng) is None


def test_a_seed_per_group_gives_each_group_other_inputs():
    first, again, other = (variations(RECORDED, random.Random(seed)) for seed in (7, 7, 8))
    assert first == again and first != other


def test_only_plain_data_can_be_varied():
    with pytest.raises(ValueError, match="not plain data"):
        variations([("pkg.f", [{"h": {"id": 1, "kind": "object", "name": "x"}}], {"d": []})], random.Random(0))
