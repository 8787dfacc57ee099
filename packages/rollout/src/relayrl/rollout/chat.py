"""Chat formats and the tool-call format: how messages become tokens, and text becomes tool calls.

The agent loop never re-tokenises what the model generated: the context is the concatenation of
every message's *rendered* tokens (system, user, tool results: :meth:`ChatFormat.render`) and the
assistant's *sampled* tokens, exactly as the engine saw them. So the trainer trains on precisely
the tokens the policy produced, in precisely the context it produced them in.

**Default chat format** (for models without a chat template; :class:`PlainChatFormat`)::

    <|system|>\\n{content}<|end|>\\n<|user|>\\n{content}<|end|>\\n<|assistant|>\\n{generated}<|end|>\\n<|tool|>\\n{content}<|end|>\\n

The assistant turn opens with ``<|assistant|>\\n`` (context) and the model ends it by generating
``<|end|>`` (a stop sequence). :class:`TemplateChatFormat` uses a Hugging Face tokenizer's own chat
template instead, rendering each message as the difference between the conversation with and
without it.

**Tool-call format.** Inside an assistant message, each call is a JSON object between tags; several
calls in one message run in parallel::

    <tool_call>{"name": "bash", "arguments": {"command": "pytest -x"}}</tool_call>
    <tool_call>{"name": "read_file", "arguments": {"path": "src/a.py", "start": 1, "end": 40}}</tool_call>

A call that is not valid JSON, lacks ``name``, or has non-object ``arguments`` becomes a
:class:`MalformedCall` whose error message is returned to the model as that call's result, so the
loop never crashes on the model's mistakes. Tool results are returned in call order, one ``tool``
message each: ``[call_id] exit=N time=Ts\\n<output>`` (without ``time=`` when the harness hides it).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from typing import Any, Protocol

from relayrl.core.wire import ToolCall, ToolResult

__all__ = ["ChatFormat", "MalformedCall", "PlainChatFormat", "RawChatFormat", "TemplateChatFormat", "Tokenizer", "format_tool_result",
           "parse_tool_calls"]

TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


class Tokenizer(Protocol):
    """What the agent loop needs of a tokenizer (Hugging Face tokenizers and CharTokenizer qualify)."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, tokens: Sequence[int]) -> str: ...


@dataclasses.dataclass(frozen=True)
class MalformedCall:
    """A ``<tool_call>`` block that could not be parsed; ``error`` is shown to the model."""

    call_id: str
    raw: str
    error: str


def parse_tool_calls(text: str, *, id_prefix: str = "call") -> list[ToolCall | MalformedCall]:
    """Every ``<tool_call>`` block of ``text``, in order, as calls or malformed calls."""
    calls: list[ToolCall | MalformedCall] = []
    for index, match in enumerate(TOOL_CALL.finditer(text)):
        call_id = f"{id_prefix}-{index}"
        raw = match.group(1).strip()
        try:
            payload = json.loads(raw)
        except json.JSONDecodeError as exc:
            calls.append(MalformedCall(call_id, raw, f"tool call is not valid JSON: {exc.msg} at column {exc.colno}"))
            continue
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            calls.append(MalformedCall(call_id, raw, 'tool call needs {"name": "...", "arguments": {...}}'))
            continue
        arguments = payload.get("arguments", {})
        if not isinstance(arguments, dict):
            calls.append(MalformedCall(call_id, raw, "tool call arguments must be a JSON object"))
            continue
        calls.append(ToolCall(id=call_id, name=payload["name"], arguments=arguments))
    return calls


def format_tool_result(result: ToolResult, *, show_time: bool = True) -> str:
    """The text a tool result is shown to the model as (its wall time only with ``show_time``)."""
    if result.error:
        return f"[{result.call_id}] error: {result.error}"
    timing = f" time={result.wall_time_s:.2f}s" if show_time else ""
    return f"[{result.call_id}] exit={result.exit_status}{timing}\n{result.output}"


class ChatFormat(Protocol):
    """Renders messages to tokens and says how an assistant turn opens and ends."""

    def render(self, role: str, content: str) -> list[int]:
        """Tokens of one complete non-assistant message."""

    def assistant_prefix(self) -> list[int]:
        """Context tokens that open an assistant turn (before the model generates)."""

    def stop_token_ids(self) -> list[int]:
        """Token ids that end an assistant turn."""

    def decode(self, tokens: Sequence[int]) -> str: ...


class PlainChatFormat:
    """The documented default format (module docstring) over any :class:`Tokenizer`.

    ``end_token`` must encode to a single id: it is the stop token of assistant turns.
    """

    def __init__(self, tokenizer: Tokenizer, *, end_token: str = "<|end|>") -> None:
        self.tokenizer = tokenizer
        self.end_token = end_token
        end_ids = tokenizer.encode(end_token)
        if len(end_ids) != 1:
            raise ValueError(f"end token {end_token!r} must be one token for this tokenizer, got {end_ids}")
        self._end_id = end_ids[0]

    def render(self, role: str, content: str) -> list[int]:
        return self.tokenizer.encode(f"<|{role}|>\n{content}{self.end_token}\n")

    def assistant_prefix(self) -> list[int]:
        return self.tokenizer.encode("<|assistant|>\n")

    def stop_token_ids(self) -> list[int]:
        return [self._end_id]

    def decode(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(list(tokens))


class RawChatFormat(PlainChatFormat):
    """Completion style, for small task-specific models: messages are their content, nothing more.

    ``render`` encodes the content alone (no role markers), the assistant prefix is empty and the
    assistant ends its answer by generating ``end_token``. A single-turn prompt ``"3 4 7>17:"``
    therefore costs exactly its characters: the countdown quickstart uses it.
    """

    def render(self, role: str, content: str) -> list[int]:
        return self.tokenizer.encode(content)

    def assistant_prefix(self) -> list[int]:
        return []


class TemplateChatFormat:
    """A Hugging Face tokenizer's own chat template, message by message."""

    def __init__(self, tokenizer: Any) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("tokenizer has no chat_template; use PlainChatFormat")
        self.tokenizer = tokenizer

    def _ids(self, messages: list[dict[str, str]], *, generation_prompt: bool = False) -> list[int]:
        ids = self.tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=generation_prompt)
        if hasattr(ids, "keys"):  # transformers 5 returns a BatchEncoding, earlier versions a list
            ids = ids["input_ids"]
        return list(ids)

    def render(self, role: str, content: str) -> list[int]:
        anchor = [{"role": "user", "content": "."}]
        full = self._ids([*anchor, {"role": role, "content": content}])
        base = self._ids(anchor)
        if full[: len(base)] != base:  # template does not render incrementally: fall back to the full render
            return self._ids([{"role": role, "content": content}])
        return full[len(base):]

    def assistant_prefix(self) -> list[int]:
        anchor = [{"role": "user", "content": "."}]
        return self._ids(anchor, generation_prompt=True)[len(self._ids(anchor)):]

    def stop_token_ids(self) -> list[int]:
        return [self.tokenizer.eos_token_id] if self.tokenizer.eos_token_id is not None else []

    def decode(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(list(tokens), skip_special_tokens=False)


class CharTokenizer:
    """A character-level tokenizer over a fixed alphabet plus whole special tokens.

    Small and deterministic: the quickstart and tests use it (no downloads). Unknown characters map
    to ``unknown``.
    """

    def __init__(self, alphabet: str, *, specials: Sequence[str] = ("<pad>", "<bos>", "<|end|>"),
                 unknown: str = "?") -> None:
        self.specials = list(specials)
        symbols = self.specials + [char for char in dict.fromkeys(alphabet + unknown)]
        self.vocab = {symbol: index for index, symbol in enumerate(symbols)}
        self.inverse = symbols
        self.unknown_id = self.vocab[unknown]
        self.eos_token_id = self.vocab.get("<|end|>")
        self.pad_token_id = self.vocab.get("<pad>", 0)
        self._special = re.compile("|".join(re.escape(token) for token in sorted(self.specials, key=len, reverse=True)))

    def __len__(self) -> int:
        return len(self.inverse)

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        position = 0
        for match in self._special.finditer(text):
            ids += [self.vocab.get(char, self.unknown_id) for char in text[position:match.start()]]
            ids.append(self.vocab[match.group(0)])
            position = match.end()
        ids += [self.vocab.get(char, self.unknown_id) for char in text[position:]]
        return ids

    def decode(self, tokens: Sequence[int]) -> str:
        return "".join(self.inverse[token] if 0 <= token < len(self.inverse) else "?" for token in tokens)
