"""Host-side checks of an extracted answer, before it is scored (a flag earns 0 whatever the score).

Answers to reasoning-gym tasks are numbers, words, lists or expressions. Some datasets score an
answer by evaluating it (sympy's ``parse_expr`` calls ``eval``), so an answer written as Python
code can build an object that compares equal to anything inside the scorer's process. Code has no
place in an answer: an answer that calls a builtin used for reflection or execution, names a
dunder, defines a lambda or imports is flagged ``code-in-answer``. This is a coarse screen, not
the defence: the scorer runs each answer in a sandboxed child of its own (see
:mod:`relayrl_reasoning_gym.scorer`), so a missed case can at most pay the answer that made it.
"""

from __future__ import annotations

import re

__all__ = ["CODE_IN_ANSWER", "code_in_answer"]

CODE_IN_ANSWER = re.compile(
    r"__|\blambda\b|\bimport\b|\b(?:exec|eval|compile|getattr|setattr|delattr|globals|locals|vars|type|open|input|"
    r"breakpoint|help|memoryview|object|super|classmethod|staticmethod|property|dir|id|hasattr|isinstance|"
    r"issubclass|iter|next|map|filter|print|exit|quit|Function|Lambda|sympify|parse_expr)\s*\(")
"""What flags an answer: reflection or execution builtins called, dunders, lambdas, imports."""


def code_in_answer(answer: str) -> str:
    """Evidence that ``answer`` is code (the matched text), or ``""``."""
    match = CODE_IN_ANSWER.search(answer)
    return match.group(0) if match else ""
