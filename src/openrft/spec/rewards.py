"""Reward configurations as the job spec holds them, and read from a document of any shape
(``reward_spec_from_document``). The ``rewards`` package builds functions from these.

Each kind keeps the exact configuration shape of the service it comes from (docs/contracts.md): Vertex
configs in Vertex's camelCase JSON, OpenAI graders in OpenAI's schema with its ``type``
discriminator, the Nova Lambda contract with its batch and concurrency settings. The dialects
construct them from the user's raw dicts (``VertexReward(single={...})``,
``OpenAIGraderReward(grader={...})``), so pydantic's field errors carry the user's own path.

How remote calls, LLM judges and sandboxed user code behave (timeouts, retries, circuit breaker,
judge endpoint, sandbox limits) is OpenRFT's own configuration (``spec/call_options.py``):
``RewardSpec.remote``, ``.judge`` and ``.sandbox``, all with documented defaults, so that no dialect has to
know about them.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal, get_args

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, field_validator, model_validator

from openrft.spec.call_options import MAX_CALL_CONCURRENCY as MAX_CALL_CONCURRENCY
from openrft.spec.call_options import MAX_CALL_TIMEOUT_S as MAX_CALL_TIMEOUT_S
from openrft.spec.call_options import JudgeSpec, RemoteCallSpec, SandboxSpec
from openrft.spec.errors import FieldProblem, SpecError, problems_from_validation
from openrft.spec.urls import RewardUrl

# ------------------------------------------------------------------------------------------------
# shared helpers


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


MAX_REGEX_CHARS = 10_000
"""Characters of a regex, as written or once filled: compiling is not under the match's time limit."""


def _check_regex(pattern: str) -> str:
    if len(pattern) > MAX_REGEX_CHARS:
        raise ValueError(f"has {len(pattern):,} characters, more than the cap of {MAX_REGEX_CHARS:,} per regex")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"is not a valid regular expression: {exc}") from None
    return pattern


def _exactly_one(model: BaseModel, names: tuple[str, ...], what: str) -> None:
    given = [n for n in names if getattr(model, n) is not None]
    if len(given) != 1:
        raise ValueError(f"{what} needs exactly one of {', '.join(names)}; got {', '.join(given) or 'none'}")


# ------------------------------------------------------------------------------------------------
# presets


class PresetReward(_Strict):
    """A built-in reward: ``exact_match`` (normalised text equality) or ``numeric_match``."""

    type: Literal["preset"] = "preset"
    name: Literal["exact_match", "numeric_match"]


# ------------------------------------------------------------------------------------------------
# Vertex AI reward configs (camelCase, as in the tuningJobs request)


class ParseResponseConfig(_Strict):
    """How the response is cut before scoring: as it is, or the last match of a regex.

    With ``REGEX_EXTRACT`` the last match wins; its first capture group if it has one, else the
    whole match. No match gives an empty parsed response (which then scores as a wrong answer).
    """

    parseType: Literal["IDENTITY", "REGEX_EXTRACT", "RESPONSE_PARSE_TYPE_UNSPECIFIED"] = "IDENTITY"
    regexExtractExpression: str | None = None

    @field_validator("regexExtractExpression")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        return None if value is None else _check_regex(value)

    @model_validator(mode="after")
    def _needs_regex(self) -> ParseResponseConfig:
        if self.parseType == "REGEX_EXTRACT" and not self.regexExtractExpression:
            raise ValueError("parseType REGEX_EXTRACT needs regexExtractExpression")
        return self


class StringMatchExpression(_Strict):
    """``expression`` may hold ``{{references.key}}`` placeholders, filled from the example."""

    matchOperation: Literal["EXACT_MATCH", "PARTIAL_MATCH", "REGEX_CONTAINS"]
    expression: str


class JsonMatchExpression(_Strict):
    """Parse the response as a JSON object, take its top-level ``keyName``, match that value."""

    keyName: str = Field(min_length=1)
    valueStringMatchExpression: StringMatchExpression


class StringMatchRewardScorer(_Strict):
    correctAnswerReward: float = 1.0
    wrongAnswerReward: float = 0.0
    stringMatchExpression: StringMatchExpression | None = None
    jsonMatchExpression: JsonMatchExpression | None = None

    @model_validator(mode="after")
    def _one_expression(self) -> StringMatchRewardScorer:
        _exactly_one(self, ("stringMatchExpression", "jsonMatchExpression"), "stringMatchRewardScorer")
        return self


class CodeExecutionRewardScorer(_Strict):
    """Python source defining ``def evaluate(example, response) -> float``, run in the sandbox.

    ``example`` is the dataset line as a ReinforcementTuningExample (camelCase keys); ``response`` the
    parsed response as a Content object, ``{"role": "model", "parts": [{"text": ...}]}``, which also
    behaves as the parsed text itself (see ``calls/sandbox/worker.py``)."""

    pythonCodeSnippet: str = Field(min_length=1)


class CloudRunRewardScorer(_Strict):
    """An HTTP endpoint called once per sample with ``{example, response, metadata}``."""

    cloudRunUri: RewardUrl

    @field_validator("cloudRunUri")
    @classmethod
    def _http(cls, value: str) -> str:
        return _check_http_url(value, "serve your function behind an HTTP endpoint (see docs/rewards.md)")


class GenerationConfig(_Strict):
    temperature: float | None = Field(None, ge=0)
    topP: float | None = Field(None, gt=0, le=1)
    topK: int | None = Field(None, ge=1)
    maxOutputTokens: int | None = Field(None, ge=1, le=32768)  # the judge's reply, as JudgeSpec.max_tokens
    seed: int | None = None


class AutoraterConfig(_Strict):
    autoraterModel: str | None = None
    samplingCount: int = Field(4, ge=1, le=32, description="judge replies averaged per sample (Vertex default 4)")
    flipEnabled: bool | None = Field(None, description="accepted for compatibility; pairwise metrics only")
    generationConfig: GenerationConfig | None = None


class AutoraterExactMatchScorer(_Strict):
    """(interpretation) Score the parsed judge reply by equality with ``expression``.

    The public schema names this scorer but not its fields; OpenRFT reads it like a string-match
    scorer: ``expression`` (placeholders allowed) and the two rewards.
    """

    expression: str
    correctAnswerReward: float = 1.0
    wrongAnswerReward: float = 0.0


class ParsedResponseConversionScorer(_Strict):
    """Vertex's scorer without fields: the parsed judge reply, converted to a float, is the reward."""


class AutoraterScorer(_Strict):
    """An LLM judge. The prompt may use ``{{prompt}}``, ``{{response}}``, ``{{system_instruction}}`` and
    ``{{references.key}}``; without one (Google's SDK sends only ``autoraterModel``) the judge gets
    OpenRFT's default prompt. ``parsedResponseConversionScorer`` reads the parsed reply as a number;
    ``exactMatchScorer`` compares it with an expression; with neither, the score is read from the reply
    as for any judge (a number, a JSON ``score``, ``score: 7``)."""

    autoraterConfig: AutoraterConfig = AutoraterConfig()
    autoraterPrompt: str | None = Field(
        None,
        min_length=1,
        description="optional, as in Google's API and SDK; without it the judge gets OpenRFT's default prompt "
        "(rewards/kinds/vertex.py, DEFAULT_AUTORATER_PROMPT; docs/rewards.md)",
    )
    autoraterResponseParseConfig: ParseResponseConfig | None = None
    parsedResponseConversionScorer: ParsedResponseConversionScorer | None = None
    exactMatchScorer: AutoraterExactMatchScorer | None = None

    @model_validator(mode="after")
    def _one_scorer(self) -> AutoraterScorer:
        if self.parsedResponseConversionScorer is not None and self.exactMatchScorer is not None:
            raise ValueError(
                "autoraterScorer takes one of parsedResponseConversionScorer and exactMatchScorer, not both"
            )
        return self


class SingleRewardConfig(_Strict):
    rewardName: str | None = None
    parseResponseConfig: ParseResponseConfig | None = None
    stringMatchRewardScorer: StringMatchRewardScorer | None = None
    codeExecutionRewardScorer: CodeExecutionRewardScorer | None = None
    cloudRunRewardScorer: CloudRunRewardScorer | None = None
    autoraterScorer: AutoraterScorer | None = None

    SCORERS: ClassVar[tuple[str, ...]] = (
        "stringMatchRewardScorer",
        "codeExecutionRewardScorer",
        "cloudRunRewardScorer",
        "autoraterScorer",
    )

    @model_validator(mode="after")
    def _one_scorer(self) -> SingleRewardConfig:
        _exactly_one(self, self.SCORERS, "a reward config")
        return self


class WeightedRewardConfig(_Strict):
    rewardConfig: SingleRewardConfig
    weight: float = Field(1.0, gt=0)


class CompositeRewardConfig(_Strict):
    """Weighted mean of up to 16 rewards: ``sum(w * r) / sum(w)``, each ``r`` clipped to [-1, 1]."""

    weightedRewardConfigs: list[WeightedRewardConfig] = Field(min_length=1, max_length=16)

    @model_validator(mode="after")
    def _unique_names(self) -> CompositeRewardConfig:
        names = [w.rewardConfig.rewardName for w in self.weightedRewardConfigs if w.rewardConfig.rewardName]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"rewardName must be unique within a composite; repeated: {', '.join(repeated)}")
        return self


class VertexReward(_Strict):
    """A Vertex ``singleRewardConfig`` or ``compositeRewardConfig``, in Vertex's own JSON shape."""

    type: Literal["vertex"] = "vertex"
    single: SingleRewardConfig | None = None
    composite: CompositeRewardConfig | None = None

    @model_validator(mode="after")
    def _one(self) -> VertexReward:
        _exactly_one(self, ("single", "composite"), "a Vertex reward")
        return self


# ------------------------------------------------------------------------------------------------
# OpenAI graders


class InputText(_Strict):
    type: Literal["input_text"] = "input_text"
    text: str


class OutputText(_Strict):
    type: Literal["output_text"] = "output_text"
    text: str


ContentPart = Annotated[InputText | OutputText, Field(discriminator="type")]


def _content_shape(value: object) -> str:
    return "text" if isinstance(value, str) else "parts" if isinstance(value, list) else "part"


MessageContent = Annotated[
    Annotated[str, Tag("text")] | Annotated[ContentPart, Tag("part")] | Annotated[list[ContentPart], Tag("parts")],
    Discriminator(_content_shape),
]
"""A string, one content part or a list of them; told apart by shape, so that a wrong part gets only
the errors of its own shape."""


class GraderMessage(_Strict):
    """One judge prompt message; ``content`` may hold ``{{item.x}}`` / ``{{sample.output_text}}`` templates."""

    role: Literal["system", "developer", "user", "assistant"]
    content: MessageContent
    type: Literal["message"] | None = None

    def text(self) -> str:
        parts = self.content if isinstance(self.content, list) else [self.content]
        return "".join(p if isinstance(p, str) else p.text for p in parts)


class _NamedGrader(_Strict):
    """A grader whose ``name`` may be left out, as OpenAI accepts: it is then named after its ``type``
    (inside a multi grader, after its key)."""

    @model_validator(mode="before")
    @classmethod
    def _default_name(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("name") is None and isinstance(data.get("type"), str):
            data = {**data, "name": data["type"]}
        return data


class GraderSamplingParams(_Strict):
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = None
    max_completions_tokens: int | None = Field(None, ge=1, le=32768)  # as JudgeSpec.max_tokens
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None


class StringCheckGrader(_NamedGrader):
    """1 when ``input`` and ``reference`` satisfy ``operation`` (eq, ne, like = contains, ilike = contains
    ignoring case), else 0."""

    type: Literal["string_check"]
    name: str
    input: str
    reference: str
    operation: Literal["eq", "ne", "like", "ilike"]


SimilarityMetric = Literal[
    "fuzzy_match", "bleu", "gleu", "meteor", "rouge_1", "rouge_2", "rouge_3", "rouge_4", "rouge_5", "rouge_l"
]
SIMILARITY_METRICS: tuple[str, ...] = get_args(SimilarityMetric)


class TextSimilarityGrader(_NamedGrader):
    type: Literal["text_similarity"]
    name: str
    input: str
    reference: str
    evaluation_metric: Literal["cosine"] | SimilarityMetric  # cosine: OpenAI's, refused below
    pass_threshold: float | None = None

    @field_validator("evaluation_metric")
    @classmethod
    def _no_cosine(cls, value: str) -> str:
        if value == "cosine":
            raise ValueError(
                "cosine needs an embeddings model, which OpenRFT does not call; use one of "
                + ", ".join(SIMILARITY_METRICS)
            )
        return value


class PythonGrader(_NamedGrader):
    """Python source defining ``def grade(sample, item) -> float``, run in the sandbox."""

    type: Literal["python"]
    name: str
    source: str = Field(min_length=1)
    image_tag: str | None = Field(None, description="accepted for compatibility; the sandbox runs this Python")


class ScoreModelGrader(_NamedGrader):
    """An LLM judge whose reply holds a number; clamped to ``range``."""

    type: Literal["score_model"]
    name: str
    model: str
    input: list[GraderMessage] = Field(min_length=1)
    range: tuple[float, float] = (0.0, 1.0)
    sampling_params: GraderSamplingParams | None = None
    pass_threshold: float | None = None

    @field_validator("range")
    @classmethod
    def _ordered(cls, value: tuple[float, float]) -> tuple[float, float]:
        if value[0] >= value[1]:
            raise ValueError("must be [low, high] with low < high")
        return value


class LabelModelGrader(_NamedGrader):
    """An LLM judge that answers one of ``labels``; 1 when it is one of ``passing_labels``, else 0."""

    type: Literal["label_model"]
    name: str
    model: str
    input: list[GraderMessage] = Field(min_length=1)
    labels: list[str] = Field(min_length=1)
    passing_labels: list[str] = Field(min_length=1)
    sampling_params: GraderSamplingParams | None = None

    @model_validator(mode="after")
    def _subset(self) -> LabelModelGrader:
        unknown = [label for label in self.passing_labels if label not in self.labels]
        if unknown:
            raise ValueError(f"passing_labels {unknown} are not among labels {self.labels}")
        return self


SimpleGrader = Annotated[
    StringCheckGrader | TextSimilarityGrader | PythonGrader | ScoreModelGrader | LabelModelGrader,
    Field(discriminator="type"),
]


class MultiGrader(_NamedGrader):
    """Several graders combined by ``calculate_output``, a formula over their keys
    (``+ - * / ^``, parentheses, numbers, ``min max abs floor ceil exp sqrt log``)."""

    type: Literal["multi"]
    name: str
    graders: dict[str, SimpleGrader] = Field(min_length=1)
    calculate_output: str

    @field_validator("graders", mode="before")
    @classmethod
    def _keyed(cls, value: object) -> object:
        """Graders keyed by the names ``calculate_output`` uses; a sub-grader without ``name`` takes its key.
        One grader object (the SDK's type allows it) is keyed by its own name."""
        if isinstance(value, dict) and isinstance(value.get("type"), str):
            value = {str(value.get("name") or value["type"]): value}
        if isinstance(value, dict):
            return {
                key: ({**sub, "name": key} if isinstance(sub, dict) and sub.get("name") is None else sub)
                for key, sub in value.items()
            }
        return value

    @field_validator("graders")
    @classmethod
    def _keys(cls, value: dict[str, object]) -> dict[str, object]:
        bad = [k for k in value if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)]
        if bad:
            raise ValueError(f"keys {bad} cannot be used in calculate_output (letters, digits and _ only)")
        return value


Grader = Annotated[
    StringCheckGrader | TextSimilarityGrader | PythonGrader | ScoreModelGrader | LabelModelGrader | MultiGrader,
    Field(discriminator="type"),
]


class OpenAIGraderReward(_Strict):
    """An OpenAI grader object (string_check, text_similarity, python, score_model, label_model, multi)."""

    type: Literal["openai_grader"] = "openai_grader"
    grader: Grader


# ------------------------------------------------------------------------------------------------
# Nova Lambda and Python callables


def _check_http_url(value: str, advice: str) -> str:
    if not re.match(r"^https?://[^/\s]+", value):
        what = "is an AWS ARN" if value.startswith("arn:") else "is not an http(s) URL"
        raise ValueError(f"{what}: OpenRFT calls reward functions over HTTP: {advice}")
    return value


NOVA_ENDPOINT_ADVICE = (
    "give the URL of a server implementing the Nova Lambda contract (e.g. http://127.0.0.1:8080/), an absolute "
    "path.py:lambda_handler, or an arn:aws:lambda ARN — see docs/compatibility.md"
)


class NovaLambdaReward(_Strict):
    """The Nova reward "Lambda" batch contract: up to ``batch_size`` samples per invocation, at most
    ``concurrency_limit`` invocations in flight. ``endpoint`` is where the Lambda runs:

    - ``http(s)://...``: a server taking the Lambda's event (a JSON list of samples) as a POST body;
    - ``/abs/path/reward.py:lambda_handler``: a published Lambda file, called as ``(event, context)`` in
      the sandbox;
    - ``arn:aws:lambda:...``: the AWS Lambda itself, invoked through boto3 (needs AWS credentials).

    The Nova and Bedrock dialects map their Lambda ARN fields here (``openrft.lambda_map``)."""

    type: Literal["nova_lambda"] = "nova_lambda"
    endpoint: RewardUrl
    batch_size: int = Field(128, ge=1, le=4096)  # the Nova recipe's lambda_batch_size bound
    concurrency_limit: int = Field(12, ge=1, le=1000)  # ... lambda_concurrency_limit's

    @field_validator("endpoint")
    @classmethod
    def _target(cls, value: str) -> str:
        if re.match(r"^arn:aws[a-z-]*:lambda:", value) or re.match(r"^/.+\.py:[A-Za-z_]\w*$", value):
            return value
        return _check_http_url(value, NOVA_ENDPOINT_ADVICE)

    @property
    def transport(self) -> Literal["http", "handler", "aws"]:
        if self.endpoint.startswith("arn:"):
            return "aws"
        return "http" if re.match(r"^https?://", self.endpoint) else "handler"


class CallableReward(_Strict):
    """A Python function named ``module:function`` that scores a batch of samples.

    It receives a list of dicts in the Nova Lambda input shape (``id``, ``messages`` ending with the
    assistant's answer, ``metadata``, ``reference_answer``) and returns one entry per sample: a
    number, ``{"score", "sub_scores", "metrics"}``, or a Nova output entry. ``sandboxed: true`` runs
    it in the sandbox (its module must then be one file); otherwise it runs in-process, trusted.
    """

    type: Literal["callable"] = "callable"
    target: str
    sandboxed: bool = False

    @field_validator("target")
    @classmethod
    def _target(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", value):
            raise ValueError("must be module:function, e.g. my_rewards:score")
        return value


RewardConfig = Annotated[
    PresetReward | VertexReward | OpenAIGraderReward | NovaLambdaReward | CallableReward,
    Field(discriminator="type"),
]


class RewardSpec(_Strict):
    function: RewardConfig
    on_error: Literal["exclude", "zero", "fail"] = Field(
        "exclude",
        description="a sample whose reward failed: excluded from its group's advantage (default), "
        "scored 0 (counted all the same), or the job fails",
    )
    remote: RemoteCallSpec = RemoteCallSpec()
    judge: JudgeSpec = JudgeSpec()
    sandbox: SandboxSpec = SandboxSpec()


# ------------------------------------------------------------------------------------------------
# a reward configuration in any shape a user has at hand

OUR_TYPES = tuple(config.model_fields["type"].default for config in get_args(get_args(RewardConfig)[0]))
"""The ``type`` tags of the reward configurations (``RewardConfig``): no list of kinds to keep here."""
GRADER_TYPES = tuple(get_args(grader.model_fields["type"].annotation)[0] for grader in get_args(get_args(Grader)[0]))
"""OpenAI's grader types (``Grader``)."""
VERTEX_PROTO_KEYS = {
    "weighted_reward_configs",
    "reinforcement_tuning_spec",
    "string_match_reward_scorer",
    "code_execution_reward_scorer",
    "cloud_run_reward_scorer",
    "autorater_scorer",
}

PROTO_MAPS = ("labels", "openrft")
"""Fields whose keys are the user's own (a map) or OpenRFT's (snake_case by design), never renamed."""


def json_name(name: str) -> str:
    """A proto field name as its JSON name: ``tuned_model_display_name`` -> ``tunedModelDisplayName``."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def canonical_names(value: Any, path: str = "", problems: list[FieldProblem] | None = None) -> Any:
    """``value`` with every proto field name (snake_case) written as its JSON name (lowerCamelCase).

    The proto3 JSON mapping has parsers accept both spellings, and the Python SDK and gcloud write the proto
    names, so a request in either reads the same; errors and ``spec explain`` then name the canonical JSON
    fields. A field given in both spellings is a problem (appended to ``problems``)."""
    if isinstance(value, list):
        return [canonical_names(item, f"{path}[{i}]", problems) for i, item in enumerate(value)]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for key, item in value.items():
        name = json_name(key) if isinstance(key, str) and "_" in key.strip("_") else key
        where = f"{path}.{name}" if path else name
        if name in out and problems is not None:
            problems.append(FieldProblem(where, f"is also given as {key}: write it once"))
        out[name] = item if name in PROTO_MAPS else canonical_names(item, where, problems)
    return out


def _wrap(document: Any) -> tuple[dict[str, Any], str]:
    """The RewardSpec dict for a document, and the prefix that maps its paths back to the user's."""
    if not isinstance(document, dict):
        raise SpecError([FieldProblem("<root>", "is not a reward configuration (expected an object)")])
    if "function" in document:
        return document, ""
    kind = document.get("type")
    if kind in OUR_TYPES:
        return {"function": document}, ""
    if kind in GRADER_TYPES:
        return {"function": {"type": "openai_grader", "grader": document}}, "grader"
    if VERTEX_PROTO_KEYS & set(document):  # a Vertex config in proto field names (the SDK's, gcloud's)
        document = canonical_names(document)
    if "weightedRewardConfigs" in document:
        return {"function": {"type": "vertex", "composite": document}}, "compositeRewardConfig"
    if any(key in document for key in SingleRewardConfig.SCORERS):
        return {"function": {"type": "vertex", "single": document}}, "singleRewardConfig"
    tuning = document.get("reinforcementTuningSpec", document)
    if isinstance(tuning, dict):
        for key, slot in (("singleRewardConfig", "single"), ("compositeRewardConfig", "composite")):
            if key in tuning:
                where = f"reinforcementTuningSpec.{key}" if tuning is not document else key
                return {"function": {"type": "vertex", slot: tuning[key]}}, where
    method = document.get("method")
    if (
        isinstance(method, dict)
        and isinstance(method.get("reinforcement"), dict)
        and "grader" in method["reinforcement"]
    ):
        return {
            "function": {"type": "openai_grader", "grader": method["reinforcement"]["grader"]}
        }, "method.reinforcement.grader"
    raise SpecError(
        [
            FieldProblem(
                "<root>",
                "is not a reward configuration: expected an OpenAI grader (type: "
                "string_check, ...), a Vertex singleRewardConfig/compositeRewardConfig, a reward "
                "spec {function: ...}, or a job file",
            )
        ]
    )


def _map_path(problem: FieldProblem, prefix: str) -> FieldProblem:
    """``function.grader.x`` -> the user's own path (``method.reinforcement.grader.x``)."""
    for ours in ("function.grader", "function.single", "function.composite"):
        if problem.path.startswith(ours):
            return FieldProblem(prefix + problem.path[len(ours) :], problem.message, problem.value)
    return problem


def reward_spec_from_document(document: Any, source: str | None = None) -> RewardSpec:
    """A reward configuration in any shape (JSON or YAML data): a canonical ``RewardSpec``
    (``{function, on_error, ...}``); one reward config with OpenRFT's ``type`` tag; an OpenAI grader object; a
    Vertex ``singleRewardConfig`` or ``compositeRewardConfig`` body (JSON or proto field names); a whole Vertex
    request or OpenAI job (their reward part is read). Problems name the user's own paths."""
    wrapped, prefix = _wrap(document)
    try:
        return RewardSpec.model_validate(wrapped)
    except ValidationError as exc:
        problems = problems_from_validation(exc, RewardSpec)
        if prefix:
            problems = [_map_path(p, prefix) for p in problems]
        raise SpecError(problems, source) from None
