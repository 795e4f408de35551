"""OpenAI graders: string_check, text_similarity, python, score_model, label_model, multi.

Templates: ``{{item.x}}`` is a field of the dataset line, ``{{sample.output_text}}`` the model's
output, ``{{sample.output_json.x}}`` a value of the output parsed as JSON (an output that is not
JSON is then a ``parse_error``, OpenAI's sample_parse_error).

- ``string_check``: ``eq`` / ``ne`` compare the filled strings exactly; ``like`` is "reference
  occurs in input", ``ilike`` the same ignoring case (Unicode case folding). 1 or 0.
- ``text_similarity``: see ``similarity.py``; in [0, 1].
- ``python``: ``grade(sample, item)`` in the sandbox (2 min per call); ``sample`` is
  ``{output_text, output_json, output_tools}``, ``item`` the dataset line. An exception is a
  ``runtime_error``, a non-number an ``invalid_output``.
- ``score_model``: the filled messages go to the judge; the score read from its reply is clamped
  to ``range``. ``label_model``: 1 when the label it answers is a passing label, else 0.
- ``multi``: every grader runs; ``calculate_output`` combines their scores (by key); each is also
  a sub-score under its key. A failed grader fails the sample with its kind; a formula that
  divides by zero is a ``runtime_error``.
"""

from __future__ import annotations

import json
import time
from typing import Any

from openrft.calls.endpoints import Timer, gather_all
from openrft.rewards.formula import FormulaError, FormulaRuntimeError, compile_formula
from openrft.rewards.judge import label_response_format, parse_label, parse_score, score_response_format
from openrft.rewards.kinds import REWARD_ROOT, Needs
from openrft.rewards.similarity import similarity
from openrft.rewards.templates import NamespaceResolver, check_template, parse_json_output, render
from openrft.rewards.types import (
    PartOutcomes,
    RewardContext,
    RewardFailure,
    RewardOutcome,
    RewardSample,
    as_score,
    check_source,
    explanation,
)
from openrft.spec.errors import FieldProblem, SpecError
from openrft.spec.rewards import (
    LabelModelGrader,
    MultiGrader,
    OpenAIGraderReward,
    PythonGrader,
    RewardSpec,
    ScoreModelGrader,
    StringCheckGrader,
    TextSimilarityGrader,
)

CONFIG = OpenAIGraderReward

PYTHON_GRADER_TIME_LIMIT_S = 120.0
OPENAI_NAMESPACES = ("item", "sample.output_text", "sample.output_json", "sample.output_tools")


def resolver(sample: RewardSample) -> NamespaceResolver:
    return NamespaceResolver(
        {
            "item": sample.example.row(),
            "sample.output_text": sample.output_text,
            "sample.output_tools": sample.output_tools,
        },
        lazy={"sample.output_json": lambda: parse_json_output(sample.output_text)},
    )


def output_json_or_none(text: str) -> Any:
    try:
        return json.loads(text.strip())
    except (ValueError, RecursionError):
        return None


def openai_sample(sample: RewardSample) -> dict[str, Any]:
    """A python grader's ``sample``: ``output_text``, ``output_json`` (``None`` when the output is not JSON) and
    ``output_tools`` (the tool calls parsed from the output, OpenAI's shape); its ``item`` is the dataset
    line (``Example.row()``: every field, ``messages`` included)."""
    text = sample.output_text
    return {"output_text": text, "output_json": output_json_or_none(text), "output_tools": sample.output_tools}


def string_check(grader: StringCheckGrader, text: str, reference: str) -> float:
    if grader.operation == "eq":
        return float(text == reference)
    if grader.operation == "ne":
        return float(text != reference)
    if grader.operation == "like":
        return float(reference in text)
    return float(reference.casefold() in text.casefold())


def build(config: OpenAIGraderReward, spec: RewardSpec, context: RewardContext) -> GraderFunction:
    problems: list[FieldProblem] = []
    function = GraderFunction(config.grader, context, f"{REWARD_ROOT}.grader", problems)
    if problems:
        raise SpecError(problems, "the reward configuration")
    return function


def needs(config: OpenAIGraderReward) -> Needs:
    return Needs()  # python graders run in the sandbox; judges are the operator's (reward.judge)


class GraderFunction:
    """One grader (any type) as a RewardFunction. Built with the problems of its configuration appended
    to ``problems`` (each at its path under ``path``); a grader with problems is never scored."""

    requires_reference = False

    def __init__(self, grader: Any, context: RewardContext, path: str, problems: list[FieldProblem]):
        self.grader = grader
        self.context = context
        self.name = grader.name
        self.computed = isinstance(grader, StringCheckGrader | TextSimilarityGrader)
        """Scored by computation alone (no sandbox, no judge): ``_computed`` scores a sample."""
        if self.computed:
            problems += check_template(grader.input, OPENAI_NAMESPACES, f"{path}.input")
            problems += check_template(grader.reference, OPENAI_NAMESPACES, f"{path}.reference")
        elif isinstance(grader, PythonGrader):
            problems += check_source(grader.source, "grade", 2, f"{path}.source")
            self.pool = context.pool(f"{path}.source", problems)
        elif isinstance(grader, ScoreModelGrader | LabelModelGrader):
            for i, message in enumerate(grader.input):
                problems += check_template(message.text(), OPENAI_NAMESPACES, f"{path}.input[{i}].content")
            self.judge = context.judge(path, problems)
        elif isinstance(grader, MultiGrader):
            self.parts = {
                key: GraderFunction(sub, context, f"{path}.graders.{key}", problems)
                for key, sub in grader.graders.items()
            }
            try:
                self.formula = compile_formula(grader.calculate_output, set(grader.graders))
            except FormulaError as exc:
                problems.append(FieldProblem(f"{path}.calculate_output", str(exc), grader.calculate_output))

    async def score(self, samples: list[RewardSample]) -> list[RewardOutcome]:
        if isinstance(self.grader, MultiGrader):
            return await self._multi(samples)
        if self.computed:  # pure computation: no task each
            return [self._computed(s) for s in samples]
        return await gather_all(self._timed(s) for s in samples)

    def _computed(self, sample: RewardSample) -> RewardOutcome:
        started = time.perf_counter()
        try:
            value = self._grade(sample)
        except RewardFailure as failure:
            return RewardOutcome.of_failure(failure, latency_s=time.perf_counter() - started)
        return RewardOutcome(score=value, latency_s=time.perf_counter() - started)

    async def _timed(self, sample: RewardSample) -> RewardOutcome:
        timer = Timer()
        printed, reply = "", None
        try:
            if isinstance(self.grader, PythonGrader):
                value, printed = await self._python(sample)
            else:
                value, reply = await self._model(sample)
        except RewardFailure as failure:
            return RewardOutcome.of_failure(failure, latency_s=timer.elapsed)
        metrics = {"sandbox_weak": 1.0} if isinstance(self.grader, PythonGrader) and self.pool.weak else {}
        explanations = {self.name: explanation(reply)} if reply is not None else {}
        return RewardOutcome(
            score=value, metrics=metrics, latency_s=timer.elapsed, stdout=printed, explanations=explanations
        )

    async def _python(self, sample: RewardSample) -> tuple[float, str]:
        """``grade(sample, item)`` in the sandbox; the score and what the code printed."""
        grader = self.grader
        time_limit = self.context.spec.sandbox.time_limit_s or PYTHON_GRADER_TIME_LIMIT_S
        args = [openai_sample(sample), sample.example.row()]
        result = await self.pool.call(grader.source, "grade", args, time_limit)
        if not result.ok:
            raise RewardFailure(result.kind, f"grade(): {result.message}", result.stdout)  # type: ignore[arg-type]
        try:
            return as_score(result.value, f"python grader {grader.name}"), result.stdout
        except RewardFailure as failure:
            failure.stdout = result.stdout
            raise

    def _grade(self, sample: RewardSample) -> float:
        grader = self.grader
        assert isinstance(grader, StringCheckGrader | TextSimilarityGrader)
        fill = resolver(sample)
        text, reference = render(grader.input, fill), render(grader.reference, fill)
        if isinstance(grader, StringCheckGrader):
            return string_check(grader, text, reference)
        return similarity(grader.evaluation_metric, text, reference)

    async def _model(self, sample: RewardSample) -> tuple[float, str]:
        """The judge's score and its reply (the grader's explanation)."""
        grader = self.grader
        fill = resolver(sample)
        messages = [{"role": m.role, "content": render(m.text(), fill)} for m in grader.input]
        params = grader.sampling_params
        options: dict[str, Any] = {}
        if params is not None:
            options = {
                "temperature": params.temperature,
                "top_p": params.top_p,
                "seed": params.seed,
                "max_tokens": params.max_completions_tokens,
            }
        response_format = (
            score_response_format() if isinstance(grader, ScoreModelGrader) else label_response_format(grader.labels)
        )
        reply = await self.judge.complete(grader.model, messages, response_format=response_format, **options)
        if isinstance(grader, ScoreModelGrader):
            low, high = grader.range
            return min(high, max(low, parse_score(reply))), reply
        return float(parse_label(reply, grader.labels) in grader.passing_labels), reply

    async def _multi(self, samples: list[RewardSample]) -> list[RewardOutcome]:
        started = time.perf_counter()
        keys = list(self.parts)
        if all(self.parts[k].computed for k in keys):  # pure computation: no task each
            results = [[self.parts[k]._computed(s) for s in samples] for k in keys]
        else:
            results = await gather_all(self.parts[k].score(samples) for k in keys)
        elapsed = time.perf_counter() - started
        outcomes = []
        for i in range(len(samples)):
            parts = PartOutcomes({k: r[i] for k, r in zip(keys, results)})
            failed = parts.failed()
            if failed is not None:
                key, outcome = failed
                error = (outcome.error_kind or "runtime_error", f"{key}: {outcome.error_message}")
                outcomes.append(parts.outcome(elapsed, error=error, limit=outcome.limit))
                continue
            try:
                value = self.formula.evaluate(parts.sub_scores)
            except FormulaRuntimeError as exc:
                outcomes.append(parts.outcome(elapsed, error=("runtime_error", f"calculate_output {exc}")))
                continue
            outcomes.append(parts.outcome(elapsed, score=value))
        return outcomes

    async def aclose(self) -> None:
        return None


def run_view(spec: RewardSpec, outcome: RewardOutcome) -> dict[str, Any]:
    """The shape of OpenAI's ``graders/run`` answer (reward, metadata.errors flags, sub_rewards), for any reward
    (``openrft rewards test --json`` shows every reward in it)."""
    grader = spec.function.grader if isinstance(spec.function, OpenAIGraderReward) else None
    grader_type = getattr(grader, "type", spec.function.type)
    model_grader = grader_type in ("score_model", "label_model")
    kind = outcome.error_kind
    errors = {
        "formula_parse_error": False,
        "sample_parse_error": kind == "parse_error" and not model_grader,
        "truncated_observation_error": False,
        "unresponsive_reward_error": kind == "timeout",
        "invalid_variable_error": kind == "invalid_output",
        "other_error": kind == "runtime_error" and grader_type not in ("python", "multi"),
        "python_grader_server_error": kind == "server_error" and grader_type == "python",
        "python_grader_server_error_type": None,
        "python_grader_runtime_error": kind == "runtime_error" and grader_type in ("python", "multi"),
        "python_grader_runtime_error_details": outcome.error_message if kind == "runtime_error" else None,
        "model_grader_server_error": kind == "server_error" and model_grader,
        "model_grader_refusal_error": False,
        "model_grader_parse_error": kind == "parse_error" and model_grader,
        "model_grader_server_error_details": outcome.error_message if kind == "server_error" else None,
    }
    return {
        "reward": outcome.score if outcome.ok else 0.0,
        "metadata": {
            "name": getattr(grader, "name", spec.function.type),
            "type": grader_type,
            "errors": errors,
            "execution_time": outcome.latency_s,
            "scores": outcome.sub_scores,
            "token_usage": None,
            "sampled_model_name": None,
        },
        "sub_rewards": outcome.sub_scores,
        "model_grader_token_usage_per_model": {},
    }
