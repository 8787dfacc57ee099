"""Expert routing records of a mixture of experts across the proxy's resumes and the agent's turns."""

from __future__ import annotations

import asyncio

import torch

from relayrl.core.arrays import pack_u32
from relayrl.core.wire import Turn
from relayrl.rollout.agent import _State, generate_turn
from relayrl.rollout.chat import CharTokenizer, PlainChatFormat
from relayrl.rollout.engines.torch_engine import TorchEngine
from relayrl.rollout.protocol import GenerateRequest, SamplingParams
from relayrl.rollout.routing import Router, TokenRecordingProxy
from relayrl.rollout.testing import tiny_moe
from relayrl.rollout.testing.engine_tests import recorded, replayed
from relayrl.rollout.testing.router_tests import FailingEngine


def test_a_generation_resumed_on_another_engine_keeps_one_routing_record_for_every_position():
    model = tiny_moe(seed=0)
    dying = FailingEngine(TorchEngine(model, engine_id="a"), fail_after_tokens=7)
    router = Router([dying, TorchEngine(model, engine_id="b")], policy="round-robin", down_for_s=60)
    prompt = [1, 9, 4, 17]
    params = SamplingParams(max_tokens=25, seed=4, top_p=0.9, routing_from=0)
    result = asyncio.run(TokenRecordingProxy(router).generate(GenerateRequest(request_id="t", prompt=prompt,
                                                                              params=params)))
    assert result.resumes == 1 and len(result.span) == 25
    record = result.span.routing
    assert record is not None and (record.start, record.first_generated, record.end) == (0, 4, 4 + 25 - 1)
    # Replayed with that routing, the trainer's logprobs are the ones both engines recorded.
    torch.testing.assert_close(recorded(result.span), replayed(model, prompt, result.span), atol=2e-4, rtol=0)
    asyncio.run(router.close())


def test_each_agent_turn_records_only_the_positions_no_earlier_turn_of_its_segment_did():
    tokenizer = CharTokenizer("abcdefghij ")
    chat = PlainChatFormat(tokenizer)
    engine = TorchEngine(tiny_moe(seed=1, vocab_size=len(tokenizer)), engine_id="moe")
    proxy = TokenRecordingProxy(engine)
    sampling = SamplingParams(seed=3, routing_from=0)
    context = chat.render("system", "abc") + chat.render("user", "find j")
    state = _State(segments=[], turns=[Turn(role="user", tokens=pack_u32(context))], context=list(context))

    async def two_turns():
        first = await generate_turn(state, proxy, chat, sampling, 6, "t/0")
        state.add(first)
        tool = chat.render("tool", "ab cd")
        state.add(Turn(role="tool", tokens=pack_u32(tool)))
        second = await generate_turn(state, proxy, chat, sampling, 6, "t/1")
        return first, second

    first, second = asyncio.run(two_turns())
    one, two = first.generated.routing, second.generated.routing
    prefix = len(chat.assistant_prefix())
    assert one.start == 0 and one.first_generated == len(context) + prefix
    assert one.end == one.first_generated + len(first.generated) - 1
    # The second request re-sent the whole context; it recorded from where the first record ended
    # (the first turn's last token, never fed back before), through its own tokens.
    assert two.start == one.end and two.first_generated == len(state.context) + prefix
    assert two.end == two.first_generated + len(second.generated) - 1
    asyncio.run(engine.close())
