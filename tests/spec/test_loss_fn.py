"""A job names its loss in the ``openrft`` block (``openrft.loss_fn``, ``openrft.loss_fn_config``): every
dialect, with ``spec explain`` provenance; unknown names and settings refused by name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from dialect_builders import Sizes, nova_recipe, openai_job, vertex_request

from openrft.spec.dialects import resolve_document
from openrft.spec.errors import SpecError


def resolve(doc):
    return resolve_document(doc, base_dir=Path("/jobs"), dataset_size=Sizes(1000, 10))


def problems(doc) -> list[str]:
    with pytest.raises(SpecError) as info:
        resolve(doc)
    return [str(p) for p in info.value.problems]


@pytest.mark.parametrize("build", [nova_recipe, vertex_request, openai_job])
def test_each_dialect_names_its_loss_in_the_openrft_block(build):
    doc = build(openrft={"loss_fn": "cispo", "loss_fn_config": {"clip_high_threshold": 5}})
    r = resolve(doc)
    assert r.spec.algorithm.loss_fn == "cispo"
    assert r.spec.algorithm.loss_fn_config == {"clip_high_threshold": 5.0}
    assert r.provenance["algorithm.loss_fn"].field == "openrft.loss_fn"
    assert r.provenance["algorithm.loss_fn"].origin == "user"
    assert r.provenance["algorithm.loss_fn_config"].field == "openrft.loss_fn_config"


def test_without_a_name_the_job_keeps_the_grpo_objective():
    r = resolve(nova_recipe())
    assert r.spec.algorithm.loss_fn == "grpo" and r.spec.algorithm.loss_fn_config == {}
    assert r.provenance["algorithm.loss_fn"].origin == "default"


@pytest.mark.parametrize(
    ("openrft", "message"),
    [
        (
            {"loss_fn": "dppo"},
            "openrft.loss_fn: resolves to .*'dppo' is not supported; supported: grpo, importance_sampling",
        ),
        ({"loss_fn": "cross_entropy"}, "openrft.loss_fn: .*'cross_entropy' is not supported"),
        (
            {"loss_fn": "ppo", "loss_fn_config": {"clip_lo": 1}},
            r"openrft.loss_fn_config: .*clip_lo is not a setting of ppo",
        ),
        ({"loss_fn": "dro", "loss_fn_config": {"beta": -1}}, "openrft.loss_fn_config: .*beta must be >= 0, got -1"),
        ({"loss_fn_config": {"clip_ratio_low": 0.1}}, "openrft.loss_fn_config: .*grpo takes no loss_fn_config"),
    ],
)
def test_bad_loss_names_and_settings_are_refused_at_the_users_field(openrft, message):
    found = problems(nova_recipe(openrft=openrft))
    assert any(re.search(message, p) for p in found), found
