"""A scripted kernel writer: faster candidates for generated chains, derived from the reference.

A chain task's reference (:func:`relayrl.environments.kernels.catalog.chain_task`) computes one
temporary per operation. :func:`fused_chain` rewrites it the way a person would: the first operation
allocates the one buffer, and every later one is applied to it in place with NumPy's ``out=`` (no
temporaries), with ``t ** 2`` and ``t ** 3`` as products (NumPy's float32 power is a general
``pow``). The rewrite keeps the reference's names, one line per step (``t1 = np.tanh(t0, out=t0)``:
``t1`` is ``t0``'s buffer), so each line of the candidate answers one line of the reference, which is
also what makes the rewrite learnable by a small model. The demonstrations of the supervised warm-up
are played by this expert and by players that copy the reference (correct, no faster), so RL has
something to prefer, and by players that first submit a :func:`slipped` rewrite (one constant
miscopied, or a parenthesis dropped: the small model's own typical failures), so the grader's
feedback ("incorrect", "load_error") appears in the warm-up followed by either a retry or nothing.
"""

from __future__ import annotations

import ast
import re

__all__ = ["NotAChain", "fused_chain", "renamed_reference", "slipped"]


class NotAChain(ValueError):
    """The reference is not a chain of the operations :func:`fused_chain` knows."""


def renamed_reference(reference: str) -> str:
    """The reference itself as a candidate: correct, and exactly as fast."""
    return reference.replace("def reference(", "def kernel(", 1)


_DECIMAL = re.compile(r"-?\d+\.\d+")


def slipped(candidate: str) -> str:
    """``candidate`` with one slip of the kind a small model makes when copying: its last decimal
    constant miscopied (sign flipped and one larger in magnitude, which a later ``abs`` or square
    does not hide: graded incorrect), or, without one, the first operation's closing parenthesis
    dropped (a load error). Rarely the constant belongs to a clamp that never binds (a maximum with
    0.0 after a sigmoid) and the slip changes nothing."""
    head, separator, body = candidate.partition("def kernel(")
    constants = list(_DECIMAL.finditer(body))
    if constants:
        last = constants[-1]
        value = float(last.group())
        decimals = len(last.group().split(".")[1])
        wrong = f"{-(abs(value) + 1.0) if value >= 0 else abs(value) + 1.0:.{decimals}f}"
        return head + separator + body[:last.start()] + wrong + body[last.end():]
    first_line_end = body.index("\n", body.index("\n") + 1)  # the signature's line, then the first operation's
    closing = body.rindex(")", 0, first_line_end)
    return head + separator + body[:closing] + body[closing + 1:]


def fused_chain(reference: str) -> str:
    """A faster candidate for a chain reference (``NotAChain`` when the reference is something else,
    a PyTorch one included: the rewrite is NumPy's)."""
    if "import numpy as np" not in reference:
        raise NotAChain("not a NumPy reference")
    function = _function(reference)
    arguments = [argument.arg for argument in function.args.args]
    lines = [f"def kernel({', '.join(arguments)}):"]
    current: str | None = None  # the reference's name for the chain's value so far
    *steps, last = function.body
    for statement in steps:
        if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name)):
            raise NotAChain(f"not an assignment to a name: {ast.unparse(statement)}")
        names = {node.id for node in ast.walk(statement.value) if isinstance(node, ast.Name)} - {"np"}
        allowed = set(arguments) if current is None else {current, *arguments[1:]}
        if not names or not names <= allowed or (current is not None and current not in names):
            raise NotAChain(f"not a step of one chain: {ast.unparse(statement)}")
        target = statement.targets[0].id
        lines.append(f"    {target} = {_step(statement.value, current)}")
        current = target
    if not (current and isinstance(last, ast.Return) and isinstance(last.value, ast.Name) and last.value.id == current):
        raise NotAChain("the reference does not return its chain's last value")
    lines.append(f"    return {current}")
    return "import numpy as np\n\n" + "\n".join(lines) + "\n"


def _function(reference: str) -> ast.FunctionDef:
    tree = ast.parse(reference)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "reference":
            return node
    raise NotAChain("no `reference` function")


def _operand(node: ast.expr) -> tuple[str, str]:
    """(the chain operand, the other operand's source) of a binary operation or two-argument call."""
    if isinstance(node, ast.BinOp):
        left, right = node.left, node.right
    elif isinstance(node, ast.Call) and len(node.args) == 2:
        left, right = node.args
    else:
        raise NotAChain(f"unexpected expression {ast.unparse(node)}")
    return ast.unparse(left), ast.unparse(right)


def _step(value: ast.expr, current: str | None) -> str:
    """One operation as an expression: in place on ``current``'s buffer (``out=``), or, for the first
    operation (``current`` None: its operands are the inputs, which must stay untouched), allocating."""
    source = ast.unparse(value)
    out = f", out={current}" if current is not None else ""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and len(value.args) == 1:
        return f"np.{value.func.attr}({ast.unparse(value.args[0])}{out})"  # np.tanh(v), np.abs(v)
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and len(value.args) == 2:
        chain, other = _operand(value)  # np.maximum(v, c), np.minimum(v, c), np.maximum(v, y)
        return f"np.{value.func.attr}({chain}, {other}{out})"
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Pow) and isinstance(value.right, ast.Constant):
        base = ast.unparse(value.left)
        if value.right.value == 2:
            return f"np.multiply({base}, {base}{out})"
        if value.right.value == 3:
            return f"np.multiply({base}, {base} * {base}{out})"
        raise NotAChain(f"unexpected power {source}")
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Div) and ast.unparse(value.left) == "1.0":
        # 1.0 / (1.0 + np.exp(-v)): the sigmoid, four operations on one buffer
        inner = value.right
        if not (isinstance(inner, ast.BinOp) and isinstance(inner.right, ast.Call)
                and isinstance(inner.right.args[0], ast.UnaryOp)):
            raise NotAChain(f"unexpected division {source}")
        argument = ast.unparse(inner.right.args[0].operand)
        if current is None:
            return f"np.reciprocal(np.exp(np.negative({argument})) + 1.0)"
        return f"np.reciprocal(np.add(np.exp(np.negative({argument}{out}){out}), 1.0{out}){out})"
    if isinstance(value, ast.BinOp) and isinstance(value.op, (ast.Add, ast.Sub, ast.Mult)):
        name = {ast.Add: "add", ast.Sub: "subtract", ast.Mult: "multiply"}[type(value.op)]
        chain, other = _operand(value)
        return f"np.{name}({chain}, {other}{out})"
    raise NotAChain(f"unexpected operation {source}")
