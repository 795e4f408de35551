"""Vertex AI rewards: parse the response, score it, clip to [-1, 1]; composites as weighted means.

Parsing (``parseResponseConfig``): ``IDENTITY`` keeps the response; ``REGEX_EXTRACT`` keeps the
last match of the expression (its first group if it has one). No match gives an empty parsed
response and the metric ``parse_failed`` = 1: the sample is then scored (a wrong answer), not
failed, because an unparseable answer is the model's mistake, which training should see.

String matching (``{{references.key}}`` placeholders filled from the example's ``references``;
both sides trimmed of surrounding whitespace; case matters):

- ``EXACT_MATCH``: the parsed response equals the expression;
- ``PARTIAL_MATCH``: the expression occurs in the parsed response;
- ``REGEX_CONTAINS``: the expression, a regex, matches somewhere in it (placeholder values are
  inserted escaped, so a reference ``3.5`` matches only ``3.5``);
- ``jsonMatchExpression``: the parsed response is read as a JSON object and the value at
  ``keyName`` (a string as is, anything else as compact JSON) is matched. A response that is not
  a JSON object, or lacks the key, is a wrong answer with ``parse_failed`` = 1.

Code execution calls ``evaluate(example, response)`` in the sandbox, ``example`` being the line in
Vertex's dataset shape and ``response`` the parsed text (100 s per call). Cloud Run gets ``POST
{"example", "response": {"role": "model", "parts": [{"text"}]}, "metadata": {"step",
"tuning_job_id"}}`` and answers ``{"reward", "user_requested_aux_info"}`` (5 min per call). The
autorater sends the filled ``autoraterPrompt`` (or, without one, ``DEFAULT_AUTORATER_PROMPT``) to the
judge ``samplingCount`` times and averages the scores of the replies (parsed by
``autoraterResponseParseConfig``, then scored by ``exactMatchScorer`` or read as a number); when no reply
gives a score it is a ``parse_error``.
"""

from __future__ import annotations

import ast
import asyncio
import json
import re
from typing import Any

from openrft.calls.endpoints import Timer, gather_all
from openrft.data.records import Example
from openrft.rewards.input_limits import regex_matches
from openrft.rewards.judge import parse_score
from openrft.rewards.kinds import REWARD_ROOT, Needs
from openrft.rewards.templates import NamespaceResolver, check_template, render
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
    CompositeRewardConfig,
    ParseResponseConfig,
    RewardSpec,
    SingleRewardConfig,
    StringMatchExpression,
    StringMatchRewardScorer,
    VertexReward,
)

CONFIG = VertexReward
MATCH_NAMESPACES = ("references",)
AUTORATER_NAMESPACES = ("prompt", "response", "system_instruction", "references")

DEFAULT_AUTORATER_PROMPT = """You are grading a model's response to a prompt.

System instruction the model was given:
{system_instruction}

Prompt:
{prompt}

Response to grade:
{response}
{references}
Grade how well the response answers the prompt{against}: 1 for a fully correct and helpful answer, 0 for a wrong, \
empty or unhelpful one, a value between for a partly correct one. Reply with the score only, a number from 0 to 1."""
"""The judge's prompt of an ``autoraterScorer`` without ``autoraterPrompt``. Google's SDK sends such a scorer
(python-genai's ``test_tune_reinforcement``: ``autoraterConfig.autoraterModel`` only), its API and SDK
declare the prompt optional (``autorater_prompt: Optional[str]``) with the placeholders ``{{prompt}}``,
``{{response}}``, ``{{system_instruction}}`` and ``{{references.key}}``, but do not publish the prompt the
service then uses; this one is OpenRFT's (docs/rewards.md): those same values, every reference of the
example, and a score from 0 to 1 read as any judge's reply is."""


def default_autorater_prompt(example: Example, response: str) -> str:
    """``DEFAULT_AUTORATER_PROMPT`` filled for one sample (values inserted as they are, not as templates)."""
    references = vertex_references(example)
    block = ""
    if references:
        lines = [f"- {k}: {v if isinstance(v, str) else json.dumps(v)}" for k, v in references.items()]
        block = "\nReference information for grading:\n" + "\n".join(lines) + "\n"
    return DEFAULT_AUTORATER_PROMPT.format(
        system_instruction=system_text(example) or "(none)",
        prompt=prompt_text(example),
        response=response,
        references=block,
        against=" and agrees with the reference information" if references else "",
    )


CODE_EXECUTION_TIME_LIMIT_S = 100.0
CLOUD_RUN_TIMEOUT_S = 300.0
TUNING_JOB_ID = 0


VERTEX_ROLES = {"user": "user", "assistant": "model", "tool": "user"}


def system_text(example: Example) -> str:
    return "\n".join(m["content"] for m in example.messages if m["role"] == "system")


def prompt_text(example: Example) -> str:
    """The conversation without its system message, one turn per line (the last is usually the question)."""
    return "\n".join(m["content"] for m in example.messages if m["role"] != "system")


def vertex_example(example: Example) -> dict[str, Any]:
    """The example as Vertex's reward code sees it, in Vertex's dataset shape (``contents``,
    ``systemInstruction``, ``references``), built from the messages when the line was in the messages format."""
    fields = dict(example.fields)
    if "contents" not in fields:
        fields["contents"] = [
            {"role": VERTEX_ROLES.get(m["role"], "user"), "parts": [{"text": m["content"]}]}
            for m in example.messages
            if m["role"] != "system"
        ]
    if "systemInstruction" not in fields and system_text(example):
        fields["systemInstruction"] = {"role": "system", "parts": [{"text": system_text(example)}]}
    fields.setdefault("references", {})
    return fields


def vertex_references(example: Example) -> dict[str, Any]:
    references = example.fields.get("references")
    return references if isinstance(references, dict) else {}


def is_reward_script(source: str, result: str = "reward", entry: str = "evaluate") -> bool:
    """A snippet in the script style of Google's SDK examples (``reward = 1.0 if response == ...``): no
    top-level ``evaluate()``, a top-level assignment to ``reward``."""
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


def clip(value: float) -> float:
    return min(1.0, max(-1.0, value))


def parse_response(config: ParseResponseConfig | None, text: str) -> tuple[str, bool]:
    """The parsed response and whether parsing found something."""
    if config is None or config.parseType != "REGEX_EXTRACT":
        return text, True
    matches = regex_matches(config.regexExtractExpression or "", text, "regexExtractExpression")
    if not matches:
        return "", False
    last = matches[-1]
    return (last.group(1) if last.re.groups else last.group(0)) or "", True


def response_content(parsed: str) -> dict[str, Any]:
    """The parsed response as Vertex hands it to reward code: a Content object in ProtoJSON."""
    return {"role": "model", "parts": [{"text": parsed}]}


def convert_to_float(text: str) -> float:
    """``parsedResponseConversionScorer``: the parsed judge reply is the number (``" 0.75 "`` -> 0.75)."""
    try:
        value = float(text.strip())
    except ValueError:
        raise RewardFailure("parse_error", f"the parsed judge reply is not a number: {text[:120]!r}") from None
    if value != value:
        raise RewardFailure("parse_error", "the parsed judge reply is NaN")
    return value


def fill(expression: str, sample: RewardSample, regex: bool = False) -> str:
    resolver = NamespaceResolver({"references": vertex_references(sample.example)})
    return render(expression, resolver, re.escape if regex else None)


def string_match(match: StringMatchExpression, parsed: str, sample: RewardSample) -> bool:
    expression = fill(match.expression, sample, regex=match.matchOperation == "REGEX_CONTAINS").strip()
    parsed = parsed.strip()
    if match.matchOperation == "EXACT_MATCH":
        return parsed == expression
    if match.matchOperation == "PARTIAL_MATCH":
        return expression in parsed
    return bool(regex_matches(expression, parsed, "REGEX_CONTAINS expression"))


def json_value(parsed: str, key: str) -> str | None:
    try:
        obj = json.loads(parsed.strip())
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or key not in obj:
        return None
    value = obj[key]
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def build(
    config: VertexReward, spec: RewardSpec, context: RewardContext
) -> VertexSingleFunction | VertexCompositeFunction:
    problems: list[FieldProblem] = []
    function: VertexSingleFunction | VertexCompositeFunction
    if config.composite is not None:
        function = VertexCompositeFunction(config.composite, context, f"{REWARD_ROOT}.composite", problems)
    else:
        assert config.single is not None
        function = VertexSingleFunction(config.single, context, f"{REWARD_ROOT}.single", problems)
    if problems:
        raise SpecError(problems, "the reward configuration")
    return function


def _singles(config: VertexReward) -> list[tuple[SingleRewardConfig, str]]:
    """Each single reward config and its path in the user's request (a composite's are nested)."""
    if config.single is not None:
        return [(config.single, "")]
    assert config.composite is not None
    return [
        (w.rewardConfig, f"weightedRewardConfigs[{i}].rewardConfig.")
        for i, w in enumerate(config.composite.weightedRewardConfigs)
    ]


def needs(config: VertexReward) -> Needs:
    """Cloud Run scorers call their URLs; code execution runs in the sandbox; autoraters use the operator's judge."""
    return Needs(
        endpoints=[
            (f"{where}cloudRunRewardScorer.cloudRunUri", single.cloudRunRewardScorer.cloudRunUri)
            for single, where in _singles(config)
            if single.cloudRunRewardScorer is not None
        ]
    )


def _match_problems(scorer: StringMatchRewardScorer, path: str) -> list[FieldProblem]:
    if scorer.stringMatchExpression is not None:
        where = f"{path}.stringMatchRewardScorer.stringMatchExpression.expression"
        return check_template(scorer.stringMatchExpression.expression, MATCH_NAMESPACES, where)
    assert scorer.jsonMatchExpression is not None
    where = f"{path}.stringMatchRewardScorer.jsonMatchExpression.valueStringMatchExpression.expression"
    return check_template(scorer.jsonMatchExpression.valueStringMatchExpression.expression, MATCH_NAMESPACES, where)


def cloud_run_reward(body: Any, label: str, warnings: list[str]) -> tuple[float, str | None]:
    """A Cloud Run scorer's answer ``{reward, user_requested_aux_info}``: ``reward`` is required (a number);
    the optional aux info (a string, the grader's explanation), when it is not a string, is dropped with a
    warning and the reward kept."""
    if not isinstance(body, dict) or "reward" not in body:
        raise RewardFailure("invalid_output", f"{label} answered {str(body)[:100]} without reward")
    reward = as_score(body["reward"], label)
    aux = body.get("user_requested_aux_info")
    if aux is not None and not isinstance(aux, str):
        warnings.append(f"{label} user_requested_aux_info is {type(aux).__name__}, not a string; dropped")
        aux = None
    return reward, aux


class VertexSingleFunction:
    """One scorer. Built with the problems of its configuration appended to ``problems`` (at ``path``)."""

    requires_reference = False

    def __init__(self, config: SingleRewardConfig, context: RewardContext, path: str, problems: list[FieldProblem]):
        self.config = config
        self.context = context
        self.name = config.rewardName or next(s for s in config.SCORERS if getattr(config, s) is not None)
        if config.stringMatchRewardScorer is not None:
            problems += _match_problems(config.stringMatchRewardScorer, path)
        if config.codeExecutionRewardScorer is not None:
            where = f"{path}.codeExecutionRewardScorer.pythonCodeSnippet"
            snippet = config.codeExecutionRewardScorer.pythonCodeSnippet
            self.script = is_reward_script(snippet)
            if not self.script:
                problems += [
                    p
                    if "defines no top-level" not in p.message
                    else FieldProblem(p.path, p.message + " (nor sets reward)")
                    for p in check_source(snippet, "evaluate", 2, where)
                ]
            self.pool = context.pool(where, problems)
        if config.cloudRunRewardScorer is not None:
            self.cloud_run = context.endpoint(
                config.cloudRunRewardScorer.cloudRunUri, CLOUD_RUN_TIMEOUT_S, f"Cloud Run reward {self.name}"
            )
            self.cloud_run_slots = asyncio.Semaphore(context.spec.remote.max_concurrency)
        if config.autoraterScorer is not None:
            scorer, where = config.autoraterScorer, f"{path}.autoraterScorer"
            if scorer.autoraterPrompt is not None:
                problems += check_template(scorer.autoraterPrompt, AUTORATER_NAMESPACES, f"{where}.autoraterPrompt")
            if scorer.exactMatchScorer is not None:
                expression = scorer.exactMatchScorer.expression
                problems += check_template(expression, MATCH_NAMESPACES, f"{where}.exactMatchScorer.expression")
            self.judge = context.judge(where, problems)

    async def score(self, samples: list[RewardSample]) -> list[RewardOutcome]:
        return await gather_all(self._score_one(s) for s in samples)

    async def _score_one(self, sample: RewardSample) -> RewardOutcome:
        timer = Timer()
        try:
            parsed, found = parse_response(self.config.parseResponseConfig, sample.completion)
        except RewardFailure as failure:
            return RewardOutcome.of_failure(failure, latency_s=timer.elapsed)
        metrics = {"parse_failed": 0.0 if found else 1.0}
        warnings: list[str] = []
        try:
            printed, said = "", None
            if self.config.codeExecutionRewardScorer is not None:
                value, printed = await self._code_execution(sample, parsed)
                extra: dict[str, float] = {}
            else:
                value, extra, said = await self._scorer(sample, parsed, warnings)
        except RewardFailure as failure:
            return RewardOutcome.of_failure(failure, metrics=metrics, latency_s=timer.elapsed)
        metrics.update(extra)
        if self.context.spec.sandbox.isolation == "weak" and self.config.codeExecutionRewardScorer is not None:
            metrics["sandbox_weak"] = 1.0
        explanations = {self.name: explanation(said)} if said else {}
        return RewardOutcome(
            score=clip(value),
            metrics=metrics,
            latency_s=timer.elapsed,
            stdout=printed,
            explanations=explanations,
            warnings=warnings,
        )

    async def _code_execution(self, sample: RewardSample, parsed: str) -> tuple[float, str]:
        """``evaluate(example, response)`` in the sandbox: ``example`` a ReinforcementTuningExample,
        ``response`` the parsed response as a Content object (the REST reference's shapes)."""
        scorer = self.config.codeExecutionRewardScorer
        assert scorer is not None
        time_limit = self.context.spec.sandbox.time_limit_s or CODE_EXECUTION_TIME_LIMIT_S
        example = vertex_example(sample.example)
        script = None
        if self.script:  # Google's script style: example, response and references in scope, reward set
            script = {
                "names": ["example", "response"],
                "extra": {"references": example["references"]},
                "result": "reward",
            }
        result = await self.pool.call(
            scorer.pythonCodeSnippet,
            "evaluate",
            [example, response_content(parsed)],
            time_limit,
            content_args=(1,),
            script=script,
        )
        if not result.ok:
            raise RewardFailure(result.kind, f"evaluate(): {result.message}", result.stdout)  # type: ignore[arg-type]
        try:
            return as_score(result.value, "evaluate()"), result.stdout
        except RewardFailure as failure:
            failure.stdout = result.stdout
            raise

    async def _scorer(
        self, sample: RewardSample, parsed: str, warnings: list[str]
    ) -> tuple[float, dict[str, float], str | None]:
        """The score, extra metrics, and what the scorer said of it (Cloud Run's ``user_requested_aux_info``,
        the autorater's replies); malformed optional parts of the answer are added to ``warnings``."""
        config = self.config
        if config.stringMatchRewardScorer is not None:
            scorer = config.stringMatchRewardScorer
            if scorer.stringMatchExpression is not None:
                correct = string_match(scorer.stringMatchExpression, parsed, sample)
                return (scorer.correctAnswerReward if correct else scorer.wrongAnswerReward), {}, None
            assert scorer.jsonMatchExpression is not None
            value = json_value(parsed, scorer.jsonMatchExpression.keyName)
            if value is None:
                return scorer.wrongAnswerReward, {"parse_failed": 1.0}, None
            correct = string_match(scorer.jsonMatchExpression.valueStringMatchExpression, value, sample)
            return (scorer.correctAnswerReward if correct else scorer.wrongAnswerReward), {}, None
        if config.cloudRunRewardScorer is not None:
            payload = {
                "example": vertex_example(sample.example),
                "response": response_content(parsed),
                "metadata": {"step": sample.step, "tuning_job_id": TUNING_JOB_ID},
            }
            async with self.cloud_run_slots:
                body = await self.cloud_run.post_json(payload)
            reward, said = cloud_run_reward(body, self.cloud_run.label, warnings)
            return reward, {}, said
        return await self._autorater(sample, parsed)

    async def _autorater(self, sample: RewardSample, parsed: str) -> tuple[float, dict[str, float], str]:
        scorer = self.config.autoraterScorer
        assert scorer is not None
        resolver = NamespaceResolver(
            {
                "references": vertex_references(sample.example),
                "prompt": prompt_text(sample.example),
                "response": parsed,
                "system_instruction": system_text(sample.example),
            }
        )
        if scorer.autoraterPrompt is None:
            prompt = default_autorater_prompt(sample.example, parsed)
        else:
            prompt = render(scorer.autoraterPrompt, resolver)
        generation = scorer.autoraterConfig.generationConfig
        options: dict[str, Any] = {}
        if generation is not None:
            options = {
                "temperature": generation.temperature,
                "top_p": generation.topP,
                "max_tokens": generation.maxOutputTokens,
                "seed": generation.seed,
            }
        replies = await gather_all(
            self.judge.complete(scorer.autoraterConfig.autoraterModel, [{"role": "user", "content": prompt}], **options)
            for _ in range(scorer.autoraterConfig.samplingCount)
        )
        scores, failures = [], []
        for reply in replies:
            try:
                scores.append(self._judge_score(reply, sample))
            except RewardFailure as failure:
                failures.append(failure)
        if not scores:
            raise failures[0]
        said = "\n---\n".join(replies)  # every reply the average was taken over
        return sum(scores) / len(scores), {"judge_parse_failures": float(len(failures))}, said

    def _judge_score(self, reply: str, sample: RewardSample) -> float:
        scorer = self.config.autoraterScorer
        assert scorer is not None
        text, found = parse_response(scorer.autoraterResponseParseConfig, reply)
        if not found:
            raise RewardFailure(
                "parse_error",
                f"the judge's reply does not match "
                f"{(scorer.autoraterResponseParseConfig.regexExtractExpression or '')[:100]!r}: "  # type: ignore[union-attr]
                f"{reply[:120]!r}",
            )
        if scorer.exactMatchScorer is not None:
            expected = fill(scorer.exactMatchScorer.expression, sample).strip()
            match = scorer.exactMatchScorer
            return match.correctAnswerReward if text.strip() == expected else match.wrongAnswerReward
        if scorer.parsedResponseConversionScorer is not None:
            return convert_to_float(text)
        return parse_score(text)

    async def aclose(self) -> None:
        return None


class VertexCompositeFunction:
    """``sum(w * r) / sum(w)`` of clipped rewards; each part's reward is a sub-score under its name."""

    name = "vertex_composite"
    requires_reference = False

    def __init__(self, config: CompositeRewardConfig, context: RewardContext, path: str, problems: list[FieldProblem]):
        self.parts = []
        for i, weighted in enumerate(config.weightedRewardConfigs):
            where = f"{path}.weightedRewardConfigs[{i}].rewardConfig"
            function = VertexSingleFunction(weighted.rewardConfig, context, where, problems)
            if not weighted.rewardConfig.rewardName:
                function.name = f"reward_{i}"
            self.parts.append((function, weighted.weight))

    async def score(self, samples: list[RewardSample]) -> list[RewardOutcome]:
        timer = Timer()
        results = await gather_all(function.score(samples) for function, _ in self.parts)
        return [self._combine([r[i] for r in results], timer.elapsed) for i in range(len(samples))]

    def _combine(self, outcomes: list[RewardOutcome], elapsed: float) -> RewardOutcome:
        latency = max((o.latency_s or 0.0 for o in outcomes), default=elapsed)
        parts = PartOutcomes({f.name: o for (f, _), o in zip(self.parts, outcomes)})
        failed = parts.failed()
        if failed is not None:
            name, outcome = failed
            assert outcome.error_kind is not None
            return parts.outcome(latency, error=(outcome.error_kind, f"{name}: {outcome.error_message}"))
        total = sum(w * parts.sub_scores[f.name] for f, w in self.parts) / sum(w for _, w in self.parts)
        warnings = [f"{f.name}: {w}" for (f, _), o in zip(self.parts, outcomes) for w in o.warnings]
        return parts.outcome(latency, score=clip(total), warnings=warnings)

    async def aclose(self) -> None:
        return None


def validate_view(spec: RewardSpec, outcome: RewardOutcome) -> dict[str, Any]:
    """The shape of Vertex's reward validation answer (overallReward, error, rewardInfoDetails), for any reward."""
    details: dict[str, Any] = {
        name: {"reward": value, "userRequestedAuxInfo": ""} for name, value in outcome.sub_scores.items()
    }
    config = spec.function
    if isinstance(config, VertexReward) and config.single is not None and outcome.ok:
        details[config.single.rewardName or "reward"] = {"reward": outcome.score, "userRequestedAuxInfo": ""}
    error = None if outcome.ok else f"{outcome.error_kind}: {outcome.error_message}"
    return {"overallReward": outcome.score, "error": error, "rewardInfoDetails": details}
