"""Checks the reward kinds run as they build, beyond a configuration's shape: what pydantic cannot see.

User code compiles and defines its entry point with the
right arguments, LLM judges have an endpoint, the sandbox can run. Each problem names its path under
``reward.function`` (the kind passes it).
"""

from __future__ import annotations

import ast

from openrft.rewards.judge import judge_base_url
from openrft.spec.errors import FieldProblem
from openrft.spec.rewards import RewardSpec


def check_source(source: str, entry: str, arity: int, path: str) -> list[FieldProblem]:
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return [FieldProblem(path, f"is not valid Python: line {exc.lineno}: {exc.msg}")]
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == entry:
            if isinstance(node, ast.AsyncFunctionDef):
                return [FieldProblem(path, f"defines {entry}() as async; it must be a plain function")]
            args = node.args
            positional = len(args.posonlyargs) + len(args.args)
            required = positional - len(args.defaults)
            if not (required <= arity and (positional >= arity or args.vararg is not None)):
                return [
                    FieldProblem(path, f"defines {entry}() with {positional} argument(s); it is called with {arity}")
                ]
            return []
    return [FieldProblem(path, f"defines no top-level function {entry}()")]


def is_reward_script(source: str, result: str = "reward", entry: str = "evaluate") -> bool:
    """A Vertex snippet in the script style of Google's SDK examples (``reward = 1.0 if response == ...``):
    no top-level ``evaluate()``, a top-level assignment to ``reward``."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == entry:
            return False
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return result in names


def sandbox_problems(spec: RewardSpec, path: str) -> list[FieldProblem]:
    if spec.sandbox.isolation == "weak":
        return []
    from openrft.calls.sandbox.mechanism import strict_unavailable

    reason = strict_unavailable()
    return [FieldProblem(path, f"runs user code, but {reason}")] if reason else []


def judge_problems(spec: RewardSpec, path: str) -> list[FieldProblem]:
    if judge_base_url(spec.judge):
        return []
    return [
        FieldProblem(
            path,
            "is an LLM judge but no endpoint is set: point OPENRFT_JUDGE_BASE_URL (or OPENAI_BASE_URL, or "
            "reward.judge.base_url) at an OpenAI-compatible chat server (e.g. `openrft serve-model`), and map a "
            "hosted judge model it does not serve with --map MODEL=LOCAL_MODEL",
        )
    ]
