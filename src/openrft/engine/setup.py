"""Everything a job needs before its first step, built from the spec: data, model, reward, policy.

Cheap checks come first (datasets, reward, model location) so that bad input fails in seconds,
before any weights are loaded.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from openrft.data.loader import DatasetError, LineProblem, load_dataset, split_validation
from openrft.data.records import Example
from openrft.engine.phase_threads import engine_measures
from openrft.models import (
    configure_threads,
    eos_token_ids,
    load_causal_lm,
    load_tokenizer,
    pick_device,
    pick_dtype,
    resolve_model_path,
)
from openrft.rewards.episodes import EpisodeReward
from openrft.rewards.types import RewardFunction, build_reward
from openrft.rollout.prompts import render_prompt
from openrft.spec.job import JobSpec


@dataclass
class Datasets:
    train: list[Example]
    validation: list[Example]


def held_out_validation(spec: JobSpec, train: list[Example]) -> tuple[list[Example], list[Example]]:
    """Train split into (train, validation) when the job names no validation file."""
    data = spec.data
    return split_validation(
        train,
        data.validation_fraction,
        data.validation_min_examples,
        spec.training.seed,
        data.validation_max_examples,
    )


def load_datasets(spec: JobSpec, require_reference: bool) -> Datasets:
    """Train and validation examples (messages or Vertex format); with no validation file, a held-out part of
    train (DataSpec: Vertex's rule, 25% or 50 examples, whichever is larger)."""
    train = load_dataset(spec.data.train, require_reference, spec.data.train_examples_limit)
    if spec.data.validation:
        validation = load_dataset(spec.data.validation, require_reference, spec.data.validation_examples_limit)
    else:
        train, validation = held_out_validation(spec, train)
    if spec.data.max_train_examples:
        train = train[: spec.data.max_train_examples]
    if spec.evaluation.max_examples:
        validation = validation[: spec.evaluation.max_examples]
    return Datasets(train, validation)


def render_prompts(tokenizer, examples: list[Example], spec: JobSpec, location: str) -> list[list[int]]:
    """Prompt token ids; prompts that leave no room for an answer within ``max_length`` are errors."""
    prompts, problems = [], []
    limit = spec.sampling.max_length - 1
    for example in examples:
        ids = render_prompt(tokenizer, example.messages, example.tools, spec.sampling.reasoning_effort)
        if len(ids) > limit:
            problems.append(
                LineProblem(
                    location,
                    example.line or 0,
                    "messages",
                    f"prompt is {len(ids)} tokens; max_length {spec.sampling.max_length} leaves no room for an answer",
                )
            )
        prompts.append(ids)
    if problems:
        raise DatasetError(location, problems)
    return prompts


@dataclass
class JobParts:
    datasets: Datasets
    reward: RewardFunction
    tokenizer: object
    model: torch.nn.Module | None
    train_prompts: list[list[int]]
    val_prompts: list[list[int]]
    eos_ids: list[int]
    max_new_tokens: int  # the spec's; each sample's completion is also capped by max_length (SamplingParams)
    device: torch.device
    threads: int


def load_generation_config(spec: JobSpec):
    """An object with the model's ``generation_config`` (its end tokens), without loading weights."""
    from types import SimpleNamespace

    from transformers import GenerationConfig

    try:
        config = GenerationConfig.from_pretrained(
            resolve_model_path(spec.model.name_or_path), revision=spec.model.revision
        )
    except OSError:
        config = None
    return SimpleNamespace(generation_config=config)


def tool_template_problems(spec: JobSpec, tokenizer, examples: list[Example]) -> list[str]:
    """A two-turn tool episode rendered with the job's model template (the first row that offers tools): what
    ``openrft spec validate`` reports and ``openrft train`` refuses to start with."""
    from openrft.tools.continuation import template_problems

    row = next((e for e in examples if e.tools), None)
    if row is None:
        return []
    ends = [
        tokenizer.decode([i], skip_special_tokens=False) for i in eos_token_ids(tokenizer, load_generation_config(spec))
    ]
    return template_problems(tokenizer, row.messages, row.tools, spec.sampling.reasoning_effort, ends)


def build_parts(spec: JobSpec, load_model: bool = True) -> JobParts:
    """Everything but the model when ``load_model`` is False (the learner loads it elsewhere: a Ray actor)."""
    reward = build_reward(spec.reward)
    if spec.tools is not None:  # episodes a tool could not finish fail; an environment's own score counts
        reward = EpisodeReward(reward, spec.tools.turn_rewards)
    elif spec.rollout.agent is not None:  # so do an agent's dropped trajectories; its UpdateReward counts
        reward = EpisodeReward(reward)
    datasets = load_datasets(spec, reward.requires_reference)
    if spec.tools is not None and spec.tools.mcp_servers:  # the servers' tools join every row before rendering
        from openrft.tools.mcp import add_mcp_tools

        add_mcp_tools(spec.tools, datasets.train + datasets.validation)
    resolve_model_path(spec.model.name_or_path)  # fails fast on a missing path
    threads = configure_threads(spec.runtime.threads, measured=engine_measures(spec))
    device = pick_device(spec.runtime.device)
    tokenizer = load_tokenizer(spec.model.name_or_path, spec.model.revision)
    if spec.tools is not None:  # the check `openrft spec validate` runs, before any weights are loaded
        problems = tool_template_problems(spec, tokenizer, datasets.train + datasets.validation)
        if problems:
            from openrft.tools.continuation import ToolTemplateError

            raise ToolTemplateError(f"model {spec.model.name_or_path}: {'; '.join(problems)}")
    train_prompts = render_prompts(tokenizer, datasets.train, spec, spec.data.train)
    val_prompts = render_prompts(tokenizer, datasets.validation, spec, spec.data.validation or spec.data.train)
    max_new_tokens = spec.sampling.max_new_tokens  # per sample, max_length caps prompt + completion (generator)
    torch.manual_seed(spec.training.seed)  # adapter initialisation
    model = (
        load_causal_lm(spec.model.name_or_path, device, pick_dtype(spec.model.dtype, device), spec.model.revision)
        if load_model
        else None
    )
    return JobParts(
        datasets=datasets,
        reward=reward,
        tokenizer=tokenizer,
        model=model,
        train_prompts=train_prompts,
        val_prompts=val_prompts,
        eos_ids=eos_token_ids(tokenizer, model if model is not None else load_generation_config(spec)),
        max_new_tokens=max_new_tokens,
        device=device,
        threads=threads,
    )
