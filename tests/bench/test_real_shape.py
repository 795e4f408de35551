"""The real-shape benchmark's own parts: its tokenizer covers the whole vocabulary, its reward varies."""

from __future__ import annotations

import pytest

from benchmarks.real_shape import build_tokenizer, summarise, vowel_share


def test_every_id_of_the_vocabulary_decodes_and_the_special_tokens_come_last(tmp_path):
    from transformers import AutoTokenizer

    specials = build_tokenizer(tmp_path, 5_000)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert len(tokenizer) == 5_000
    assert sorted(specials.values()) == [4_997, 4_998, 4_999]
    assert tokenizer.eos_token_id == specials["<|im_end|>"]
    words = tokenizer.convert_ids_to_tokens(list(range(5_000)))
    assert None not in words and len(set(words)) == 5_000
    assert max(tokenizer("What is 12+7? Answer: 19")["input_ids"]) < 96  # text encodes to the demo's own tokens
    assert tokenizer.decode([100, 101]).split() == [words[100][1:], words[101][1:]]


def test_the_reward_is_the_share_of_vowels_among_letters():
    batch = [{"completion": " aaaa ebcd"}, {"completion": "12 + 3"}, {"completion": "XYZU"}]
    assert vowel_share(batch) == [pytest.approx(5 / 8), 0.0, 0.25]


def test_a_configuration_row_leaves_the_warm_up_step_out():
    record = {
        "step_s": [9.0, 2.0, 4.0],
        "step_cpu_s": [9.0, 1.0, 3.0],
        "generate_s": [5.0, 1.0, 1.0],
        "learner_s": [4.0, 1.0, 3.0],
        "learner_flops": [8e9, 8e9, 8e9],
        "generate_flops": [1e9, 2e9, 2e9],
        "generated_tokens": 100,
    }
    row = summarise("openrft", 2, record, peak=1e10)
    assert (row["step_s"], row["step_cpu_s"], row["generate_tokens_per_s"]) == (3.0, 2.0, 100.0)
    assert row["learner_flops_fraction"] == pytest.approx(8e9 / 2.0 / 1e10, abs=1e-3) and row["steps_timed"] == 2
    assert row["generate_flops_fraction"] == pytest.approx(2e9 / 1.0 / 1e10, abs=1e-3)
    assert row["step_flops_fraction"] == pytest.approx(10e9 / 3.0 / 1e10, abs=1e-3)  # both phases over the step


def test_sampling_flops_count_each_prompts_prefill_once_and_every_answer_token():
    from benchmarks.real_shape import sampling_flops
    from openrft.learner.batch import TrainSample
    from openrft.learner.flops import DecoderShape, generation_flops
    from tests.tiny_models import tiny_qwen2_config

    config = tiny_qwen2_config(vocab_size=100, max_position_embeddings=64)
    samples = [TrainSample([1, 2, 3], [4, 5], advantage=0.0), TrainSample([1, 2, 3], [6, 7], advantage=0.0)]
    samples.append(TrainSample([8, 9], [4, 5, 6], advantage=0.0))
    expected = generation_flops(DecoderShape.from_config(config), [3, 2], [[2, 2], [3]], 16)
    assert sampling_flops(samples, config) == expected > 0


def test_the_job_runs_every_answer_to_its_length_and_the_suite_can_add_ray_learners(tmp_path):
    from benchmarks.__main__ import parse_args
    from benchmarks.real_shape import job_spec

    spec = job_spec(tmp_path, steps=2, threads=2, new_tokens=128, prompts=8, samples=8)
    assert spec.sampling.ignore_eos and spec.sampling.max_new_tokens == 128  # in every process, Ray's learners too
    assert parse_args(["real-shape", "--real-learners"]).real_learners
    assert not parse_args(["real-shape"]).real_learners
