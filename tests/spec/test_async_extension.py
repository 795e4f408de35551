"""Asynchronous rollouts from the Vertex and OpenAI dialects, through the `openrft` extension block."""

from __future__ import annotations

from pathlib import Path

import pytest
from dialect_builders import Sizes, nova_recipe, openai_job, vertex_request

from openrft.spec.dialects import resolve_document
from openrft.spec.errors import SpecError

BUILDERS = {"vertex": vertex_request, "openai": openai_job}


def resolve(doc):
    return resolve_document(doc, base_dir=Path("/jobs"), dataset_size=Sizes(100, 10))


def problems(doc) -> list[str]:
    with pytest.raises(SpecError) as info:
        resolve(doc)
    return [str(p) for p in info.value.problems]


@pytest.mark.parametrize("dialect", BUILDERS)
def test_without_the_extension_rollouts_are_synchronous(dialect):
    rollout = resolve(BUILDERS[dialect]()).spec.rollout
    assert (rollout.strategy, rollout.age_tolerance, rollout.replicas, rollout.generation_replicas) == ("sync", 0, 1, 1)


@pytest.mark.parametrize("dialect", BUILDERS)
def test_off_policy_async_takes_nova_default_tolerance_and_the_replicas(dialect):
    ext = {"rollout_strategy": "off_policy_async", "generation_replicas": 3, "replicas": 2}
    r = resolve(BUILDERS[dialect](openrft=ext))
    rollout = r.spec.rollout
    assert (rollout.strategy, rollout.age_tolerance, rollout.replicas, rollout.generation_replicas) == (
        "off_policy_async",
        2,
        2,
        3,
    )
    assert r.provenance["rollout.age_tolerance"].origin == "default"
    assert r.provenance["rollout.strategy"].field == "openrft.rollout_strategy"


@pytest.mark.parametrize("dialect", BUILDERS)
def test_an_explicit_tolerance_is_kept(dialect):
    ext = {"rollout_strategy": "off_policy_async", "age_tolerance": 0}
    assert resolve(BUILDERS[dialect](openrft=ext)).spec.rollout.age_tolerance == 0


@pytest.mark.parametrize("dialect", BUILDERS)
def test_a_tolerance_on_sync_rollouts_is_an_error_naming_both_fields(dialect):
    found = problems(BUILDERS[dialect](openrft={"age_tolerance": 3}))
    assert found == [
        "openrft.age_tolerance: 3 needs openrft.rollout_strategy: off_policy_async (sync rollouts have age 0)"
    ]


def test_an_unknown_strategy_is_refused():
    found = problems(vertex_request(openrft={"rollout_strategy": "eventual"}))
    assert len(found) == 1 and found[0].startswith("openrft.rollout_strategy: ")
    assert "off_policy_async" in found[0]


def test_a_nova_recipe_sets_them_in_the_recipe_not_the_extension():
    found = problems(nova_recipe(openrft={"rollout_strategy": "off_policy_async", "generation_replicas": 2}))
    assert sorted(found) == [
        "openrft.generation_replicas: 2 is set by run.generation_replicas in a Nova job; set it there",
        "openrft.rollout_strategy: 'off_policy_async' is set by training_config.rollout.rollout_strategy.type in a "
        "Nova job; set it there",
    ]
