"""Static checks of a reward configuration, beyond its shape: what pydantic cannot see.

Template variables name known namespaces, formulas parse and name only their graders, user code
compiles and defines its entry point with the right arguments, LLM judges have an endpoint, the
sandbox can run, callables import. Each problem names its path under ``reward.function``.
"""

from __future__ import annotations

import ast

from openrft.errors import RewardError
from openrft.rewards.formula import FormulaError, compile_formula
from openrft.rewards.judge import judge_base_url
from openrft.rewards.templates import unknown_namespaces
from openrft.spec.errors import FieldProblem
from openrft.spec.rewards import (
    CallableReward,
    LabelModelGrader,
    MultiGrader,
    NovaLambdaReward,
    OpenAIGraderReward,
    PythonGrader,
    RewardSpec,
    ScoreModelGrader,
    SingleRewardConfig,
    StringCheckGrader,
    TextSimilarityGrader,
    VertexReward,
)

ROOT = "reward.function"
OPENAI_NAMESPACES = ("item", "sample.output_text", "sample.output_json", "sample.output_tools")
VERTEX_MATCH_NAMESPACES = ("references",)
AUTORATER_NAMESPACES = ("prompt", "response", "system_instruction", "references")


def check_template(template: str, namespaces: tuple[str, ...], path: str) -> list[FieldProblem]:
    bad = unknown_namespaces(template, namespaces)
    if not bad:
        return []
    names = ", ".join("{{" + b + "}}" for b in bad)
    allowed = ", ".join(
        "{{" + n + (".…" if n in ("item", "references", "sample.output_json") else "") + "}}" for n in namespaces
    )
    return [FieldProblem(path, f"uses {names}; allowed here: {allowed}")]


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


def _sandbox(spec: RewardSpec, path: str) -> list[FieldProblem]:
    if spec.sandbox.isolation == "weak":
        return []
    from openrft.calls.sandbox.mechanism import strict_unavailable

    reason = strict_unavailable()
    return [FieldProblem(path, f"runs user code, but {reason}")] if reason else []


def _judge(spec: RewardSpec, path: str) -> list[FieldProblem]:
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


def _check_single(config: SingleRewardConfig, spec: RewardSpec, path: str) -> list[FieldProblem]:
    problems: list[FieldProblem] = []
    scorer = config.stringMatchRewardScorer
    if scorer is not None:
        if scorer.stringMatchExpression is not None:
            problems += check_template(
                scorer.stringMatchExpression.expression,
                VERTEX_MATCH_NAMESPACES,
                f"{path}.stringMatchRewardScorer.stringMatchExpression.expression",
            )
        if scorer.jsonMatchExpression is not None:
            problems += check_template(
                scorer.jsonMatchExpression.valueStringMatchExpression.expression,
                VERTEX_MATCH_NAMESPACES,
                f"{path}.stringMatchRewardScorer.jsonMatchExpression.valueStringMatchExpression.expression",
            )
    if config.codeExecutionRewardScorer is not None:
        where = f"{path}.codeExecutionRewardScorer.pythonCodeSnippet"
        snippet = config.codeExecutionRewardScorer.pythonCodeSnippet
        if not is_reward_script(snippet):
            problems += [
                p if "defines no top-level" not in p.message else FieldProblem(p.path, p.message + " (nor sets reward)")
                for p in check_source(snippet, "evaluate", 2, where)
            ]
        problems += _sandbox(spec, where)
    if config.autoraterScorer is not None:
        where = f"{path}.autoraterScorer"
        problems += check_template(
            config.autoraterScorer.autoraterPrompt, AUTORATER_NAMESPACES, f"{where}.autoraterPrompt"
        )
        if config.autoraterScorer.exactMatchScorer is not None:
            problems += check_template(
                config.autoraterScorer.exactMatchScorer.expression,
                VERTEX_MATCH_NAMESPACES,
                f"{where}.exactMatchScorer.expression",
            )
        problems += _judge(spec, where)
    return problems


def _check_grader(grader, spec: RewardSpec, path: str) -> list[FieldProblem]:
    problems: list[FieldProblem] = []
    if isinstance(grader, StringCheckGrader | TextSimilarityGrader):
        problems += check_template(grader.input, OPENAI_NAMESPACES, f"{path}.input")
        problems += check_template(grader.reference, OPENAI_NAMESPACES, f"{path}.reference")
    elif isinstance(grader, PythonGrader):
        problems += check_source(grader.source, "grade", 2, f"{path}.source")
        problems += _sandbox(spec, f"{path}.source")
    elif isinstance(grader, ScoreModelGrader | LabelModelGrader):
        for i, message in enumerate(grader.input):
            problems += check_template(message.text(), OPENAI_NAMESPACES, f"{path}.input[{i}].content")
        problems += _judge(spec, path)
    elif isinstance(grader, MultiGrader):
        for key, sub in grader.graders.items():
            problems += _check_grader(sub, spec, f"{path}.graders.{key}")
        try:
            compile_formula(grader.calculate_output, set(grader.graders))
        except FormulaError as exc:
            problems.append(FieldProblem(f"{path}.calculate_output", str(exc), grader.calculate_output))
    return problems


def check_reward(spec: RewardSpec) -> list[FieldProblem]:
    config = spec.function
    if isinstance(config, VertexReward):
        if config.single is not None:
            return _check_single(config.single, spec, f"{ROOT}.single")
        assert config.composite is not None
        problems = []
        for i, weighted in enumerate(config.composite.weightedRewardConfigs):
            problems += _check_single(
                weighted.rewardConfig, spec, f"{ROOT}.composite.weightedRewardConfigs[{i}].rewardConfig"
            )
        return problems
    if isinstance(config, OpenAIGraderReward):
        return _check_grader(config.grader, spec, f"{ROOT}.grader")
    if isinstance(config, CallableReward):
        from openrft.rewards.callables import load_function, module_source, resolve_target

        try:
            if config.sandboxed:
                source = module_source(config.target)
                return check_source(source, resolve_target(config.target)[1], 1, f"{ROOT}.target") + _sandbox(
                    spec, f"{ROOT}.target"
                )
            load_function(config.target)
        except RewardError as exc:
            return [FieldProblem(f"{ROOT}.target", str(exc))]
    if isinstance(config, NovaLambdaReward) and config.transport == "handler":
        return _check_handler(config.endpoint, spec)
    return []


def _check_handler(target: str, spec: RewardSpec) -> list[FieldProblem]:
    """A Lambda handler file: it reads, compiles and defines ``handler(event, context)``; the sandbox runs."""
    from openrft.rewards.lambdas import split_handler

    path, handler = split_handler(target)
    where = f"{ROOT}.endpoint"
    try:
        source = path.read_text(encoding="utf-8")
    except OSError as exc:
        return [FieldProblem(where, f"cannot be read: {exc.strerror}", str(path))]
    return check_source(source, handler, 2, where) + _sandbox(spec, where)
