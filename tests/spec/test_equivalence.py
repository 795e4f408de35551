"""Property tests: one job written in two dialects resolves to the same spec, and a resolved spec always
keeps every documented limit (and every request inside the limits resolves)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from dialect_builders import EXAMPLES, OPENAI_GRADER, Sizes, nova_recipe, openai_job, vertex_request
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from openrft.spec.dialects import load_job, resolve_document
from openrft.spec.errors import SpecError

# What differs by design between dialects: their tag, the shape of their reward config, and the dataset
# limits only Vertex has (docs/hyperparameters.md).
DIALECT_ONLY = {
    "dialect": True,
    "reward": {"function": True},
    "data": {"train_examples_limit": True, "validation_examples_limit": True, "validation_max_examples": True},
}
RANKS = {
    1: "ADAPTER_SIZE_ONE",
    2: "ADAPTER_SIZE_TWO",
    4: "ADAPTER_SIZE_FOUR",
    8: "ADAPTER_SIZE_EIGHT",
    16: "ADAPTER_SIZE_SIXTEEN",
    32: "ADAPTER_SIZE_THIRTY_TWO",
}
DEMO_RATE = 2e-4
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def resolve(doc, prompts):
    return resolve_document(doc, base_dir=Path("/jobs"), dataset_size=Sizes(prompts))


def comparable(spec) -> dict:
    return spec.model_dump(exclude=DIALECT_ONLY)


@st.composite
def shared_jobs(draw):
    """A job both Vertex and Nova can write: samples per step one of Nova's global batch sizes."""
    global_batch = draw(st.sampled_from([16, 32, 64, 128, 256]))
    samples = draw(st.sampled_from([n for n in range(2, global_batch + 1) if global_batch % n == 0]))
    return {
        "global_batch": global_batch,
        "samples": samples,
        "steps": draw(st.integers(1, 500)),
        "evaluate": draw(st.integers(1, 50)),
        "checkpoint": draw(st.integers(1, 50)),
        "multiplier": draw(st.floats(0.25, 4)),
        "rank": draw(st.sampled_from(sorted(RANKS))),
        "max_tokens": draw(st.integers(1, 32768)),
        "seed": draw(st.integers(0, 2**31 - 1)),
        "prompts": draw(st.integers(1, 5000)),
    }


@FAST
@given(shared_jobs())
def test_vertex_and_nova_write_the_same_job(job):
    vertex = vertex_request(
        {
            "stepCount": job["steps"],
            "batchSize": job["global_batch"] // job["samples"],
            "samplesPerPrompt": job["samples"],
            "evaluateInterval": job["evaluate"],
            "checkpointInterval": job["checkpoint"],
            "learningRateMultiplier": job["multiplier"],
            "adapterSize": RANKS[job["rank"]],
            "maxOutputTokens": job["max_tokens"],
            "thinkingLevel": "HIGH",
        },
        openrft={"seed": job["seed"]},
    )
    nova = nova_recipe(
        {
            "global_batch_size": job["global_batch"],
            "max_length": job["max_tokens"] + 8192,
            "reasoning_effort": "high",
            "rollout": {
                "advantage_strategy": {"number_generation": job["samples"]},
                "generator": {"max_new_tokens": job["max_tokens"]},
                "rewards": {"preset_reward_function": "exact_match"},
            },
        },
        {
            "max_steps": job["steps"],
            "test_steps": job["evaluate"],
            "save_steps": job["checkpoint"],
            "save_top_k": 3,
            "refit_freq": 0,
            "optim_config": {"lr": job["multiplier"] * DEMO_RATE},
            "peft": {"lora_tuning": {"alpha": 2 * job["rank"], "lora_plus_lr_ratio": 16}},
        },
        run={"name": "openrft-job"},
        openrft={"seed": job["seed"], "lora_rank": job["rank"]},
    )
    a, b = resolve(vertex, job["prompts"]).spec, resolve(nova, job["prompts"]).spec
    assert comparable(a) == comparable(b)
    assert a.samples_per_step == job["global_batch"]


@st.composite
def vertex_openai_jobs(draw):
    batch = draw(st.integers(1, 256))
    samples = draw(st.sampled_from([n for n in range(2, 161) if (batch * n) % 16 == 0 and batch * n <= 8192]))
    prompts = draw(st.integers(1, 5000))
    epochs = draw(st.integers(1, 50).filter(lambda e: math.ceil(e * prompts / batch) <= 500))
    return {
        "batch": batch,
        "samples": samples,
        "prompts": prompts,
        "epochs": epochs,
        "evaluate": draw(st.integers(1, 100)),
        "multiplier": draw(st.floats(0.25, 4)),
        "rank": draw(st.sampled_from(sorted(RANKS))),
        "max_tokens": draw(st.integers(1, 32768)),
        "seed": draw(st.integers(0, 2**31 - 1)),
        "eval_samples": draw(st.integers(1, 8)),
    }


@FAST
@given(vertex_openai_jobs())
def test_vertex_and_openai_write_the_same_job(job):
    vertex = vertex_request(
        {
            "epochCount": job["epochs"],
            "batchSize": job["batch"],
            "samplesPerPrompt": job["samples"],
            "evaluateInterval": job["evaluate"],
            "checkpointInterval": job["evaluate"],
            "learningRateMultiplier": job["multiplier"],
            "adapterSize": RANKS[job["rank"]],
            "maxOutputTokens": job["max_tokens"],
            "thinkingLevel": "HIGH",
        },
        openrft={"seed": job["seed"], "eval_samples_per_prompt": job["eval_samples"]},
    )
    openai = openai_job(
        {
            "n_epochs": job["epochs"],
            "batch_size": job["batch"],
            "compute_multiplier": job["samples"] / 16,
            "eval_interval": job["evaluate"],
            "eval_samples": job["eval_samples"],
            "learning_rate_multiplier": job["multiplier"],
            "reasoning_effort": "high",
        },
        seed=job["seed"],
        openrft={"lora_rank": job["rank"], "max_new_tokens": job["max_tokens"]},
    )
    a, b = resolve(vertex, job["prompts"]).spec, resolve(openai, job["prompts"]).spec
    assert comparable(a) == comparable(b)


@FAST
@given(st.integers(1, 5000))
def test_vertex_and_openai_defaults_agree(prompts):
    """Left to their defaults (OpenAI: "auto"), the two dialects train the same way on any dataset size."""
    a = resolve(vertex_request(), prompts).spec
    b = resolve(openai_job({"reasoning_effort": "high"}), prompts).spec
    assert comparable(a) == comparable(b)
    assert a.training.total_steps == min(math.ceil(min(110 * 32 / prompts, 10) * prompts / 32 - 1e-9), 500)


def test_the_demo_jobs_are_the_same_job():
    vertex, openai = load_job(EXAMPLES / "vertex_job.json"), load_job(EXAMPLES / "openai_job.json")
    nova = load_job(Path(__file__).parent / "arithmetic_recipe.yaml")
    a, b, c = comparable(vertex), comparable(openai), comparable(nova)
    assert a.pop("data")["train"].endswith("vertex_train.jsonl") and b.pop("data")["train"].endswith("/train.jsonl")
    assert c.pop("data") == comparable(openai)["data"]
    assert a == b == c
    assert vertex.training.total_steps == 30 and vertex.training.epochs == 1 and nova.training.epochs == 1
    assert openai.reward.function.grader.type == "string_check"


# Every documented limit, for any request ----------------------------------------------------------

ANY_NUMBER = st.one_of(st.integers(-5, 10_000), st.floats(-1, 10_000, allow_nan=False), st.none())


@st.composite
def vertex_hyperparameters(draw):
    hp = {}
    for name, values in {
        "epochCount": st.one_of(st.floats(-1, 60, allow_nan=False), st.integers(-1, 60)),
        "stepCount": st.integers(-1, 2000),
        "learningRateMultiplier": st.floats(0, 5, allow_nan=False),
        "batchSize": st.integers(-1, 600),
        "samplesPerPrompt": st.integers(-1, 64),
        "evaluateInterval": st.integers(-1, 50),
        "checkpointInterval": st.integers(-1, 50),
        "maxOutputTokens": st.integers(-1, 40_000),
        "thinkingLevel": st.sampled_from(["MINIMAL", "LOW", "MEDIUM", "HIGH", "NONE"]),
        "adapterSize": st.sampled_from([*RANKS.values(), "ADAPTER_SIZE_SIXTY_FOUR"]),
    }.items():
        if draw(st.booleans()):
            hp[name] = draw(values)
    return hp


def vertex_valid(hp: dict) -> bool:
    """Vertex's documented limits (and OpenRFT's samplesPerPrompt >= 2), written independently of the code."""
    batch, samples = hp.get("batchSize", 32), hp.get("samplesPerPrompt", 16)
    checks = [
        not ("epochCount" in hp and "stepCount" in hp),
        hp.get("epochCount", 1) > 0,
        hp.get("stepCount", 1) >= 1,
        0.25 <= hp.get("learningRateMultiplier", 1) <= 4,
        batch >= 1,
        samples >= 2,
        batch < 1 or samples < 2 or ((batch * samples) % 16 == 0 and batch * samples <= 8192),
        hp.get("evaluateInterval", 1) >= 1,
        hp.get("checkpointInterval", 1) >= 1,
        1 <= hp.get("maxOutputTokens", 1) <= 32768,
        hp.get("thinkingLevel", "HIGH") != "NONE",  # the REST enum: MINIMAL, LOW, MEDIUM, HIGH
        hp.get("adapterSize", "ADAPTER_SIZE_ONE") in RANKS.values(),
    ]
    return all(checks)


@settings(max_examples=300, deadline=None)
@given(vertex_hyperparameters(), st.integers(1, 5000))
def test_a_resolved_vertex_spec_keeps_every_documented_limit(hp, prompts):
    try:
        r = resolve(vertex_request(hp), prompts)
    except SpecError:
        assert not vertex_valid(hp)
        return
    assert vertex_valid(hp)
    s = r.spec
    per_step = s.training.prompts_per_step * s.sampling.samples_per_prompt
    assert 1 <= s.training.total_steps <= 500
    assert per_step % 16 == 0 and per_step <= 8192
    assert 0.25 * DEMO_RATE <= s.optimizer.lr <= 4 * DEMO_RATE * (1 + 1e-12)
    assert 1 <= s.sampling.max_new_tokens <= 32768 and s.lora.rank in RANKS
    assert s.evaluation.interval >= 1 and s.checkpoint.interval >= 1
    if "stepCount" not in hp:
        epochs = hp.get("epochCount") or min(110 * s.training.prompts_per_step / prompts, 10)
        expected = math.ceil(round(epochs * prompts / s.training.prompts_per_step, 9))
        assert s.training.total_steps == min(max(expected, 1), 500)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from([8, 16, 24, 32, 48, 64, 100, 128, 256, 512]),
    st.integers(1, 20),
    st.floats(-0.5, 1.5, allow_nan=False),
    st.floats(-10, 120, allow_nan=False),
)
def test_a_resolved_nova_spec_keeps_every_documented_limit(global_batch, generations, weight_decay, lora_plus):
    doc = nova_recipe(
        {
            "global_batch_size": global_batch,
            "rollout": {
                "advantage_strategy": {"number_generation": generations},
                "rewards": {"preset_reward_function": "exact_match"},
            },
        },
        {"optim_config": {"weight_decay": weight_decay}, "peft": {"lora_tuning": {"lora_plus_lr_ratio": lora_plus}}},
    )
    valid = (
        16 <= global_batch <= 256  # HyperPod documents the whole range
        and generations >= 2
        and global_batch % generations == 0
        and 0 <= weight_decay <= 1
        and 0 <= lora_plus <= 100
    )
    try:
        s = resolve(doc, 1000).spec
    except SpecError:
        assert not valid
        return
    assert valid
    assert 16 <= s.samples_per_step <= 256
    assert 0 <= s.optimizer.weight_decay <= 1 and 0 <= s.lora.lora_plus_lr_ratio <= 100


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(st.just("auto"), st.integers(-1, 300)),
    st.one_of(st.just("auto"), st.integers(-1, 60)),
    st.one_of(st.just("auto"), st.floats(0, 11, allow_nan=False)),
    st.integers(1, 5000),
)
def test_a_resolved_openai_spec_keeps_every_documented_limit(batch, epochs, compute, prompts):
    valid = (
        (batch == "auto" or 1 <= batch <= 256)
        and (epochs == "auto" or 1 <= epochs <= 50)
        and (compute == "auto" or 0.00001 <= compute <= 10)
    )
    try:
        s = resolve(openai_job({"batch_size": batch, "n_epochs": epochs, "compute_multiplier": compute}), prompts).spec
    except SpecError:
        assert not valid
        return
    assert valid
    assert 1 <= s.training.prompts_per_step <= 256 and 2 <= s.sampling.samples_per_prompt <= 160
    assert s.training.total_steps == math.ceil(round(s.training.epochs * prompts / s.training.prompts_per_step, 9))


def test_a_grader_reaches_the_spec_unchanged():
    grader = resolve(openai_job(), 100).spec.reward.function.grader
    assert grader.model_dump(exclude_unset=True) == OPENAI_GRADER


@pytest.mark.parametrize("prompts", [1, 7, 100, 4999])
def test_openai_auto_and_vertex_default_steps_match_the_formula(prompts):
    steps = resolve(openai_job(), prompts).spec.training.total_steps
    assert steps == math.ceil(round(min(110 * 32 / prompts, 10) * prompts / 32, 9))
