"""Shared-prefix micro-batches: planned within the token budget, and the same log-probs and gradients as
running every sample's whole sequence."""

import pytest
import torch

from openrft.learner.batch import TrainSample, collate, padded_cost, plan_micro_batches
from openrft.learner.learner import response_logits, token_logp
from tests.tiny_models import tiny_qwen2


def _samples():
    # three groups: prompts of 4, 2 and 6 tokens with responses of varied lengths
    a, b, c = [1, 2, 3, 4], [5, 6], [7, 8, 9, 10, 11, 12]
    return [
        TrainSample(a, [13, 14, 15], 1.0),
        TrainSample(a, [16], -1.0),
        TrainSample(a, [17, 18], 0.5),
        TrainSample(b, [19, 20, 21, 22], -0.5),
        TrainSample(b, [23, 24], 0.5),
        TrainSample(c, [25], 1.0),
        TrainSample(c, [26, 27, 28, 29, 30], -1.0),
    ]


def test_padded_cost_counts_each_prompt_once():
    assert padded_cost([4, 2], [3, 1, 2, 4, 2]) == 2 * 4 + 5 * 4


def test_plan_keeps_groups_within_budget_and_covers_every_sample_once():
    samples = _samples()
    for budget in (1, 8, 14, 20, 40, 1000):
        plan = plan_micro_batches(samples, budget)
        assert sorted(i for mb in plan for i in mb) == list(range(len(samples)))
        for mb in plan:
            prompts = {tuple(samples[i].prompt_ids) for i in mb}
            cost = padded_cost([len(p) for p in prompts], [len(samples[i].response_ids) for i in mb])
            assert len(mb) == 1 or cost <= budget, (budget, mb, cost)
    # a budget that holds everything: one micro-batch (3 prompts of at most 6 tokens, 7 responses of at most 5)
    assert len(plan_micro_batches(samples, 3 * 6 + 7 * 5)) == 1
    # group a alone costs 4 + 3 * 3 = 13: with a budget of 10 it is split, each part carrying the prompt
    split = plan_micro_batches(samples[:3], 10)
    assert len(split) == 2 and all(padded_cost([4], [len(samples[i].response_ids) for i in mb]) <= 10 for mb in split)


def test_collate_layout():
    samples = _samples()
    mb = collate(samples, pad_token_id=0, device=torch.device("cpu"))
    assert mb.prompt_ids.shape == (3, 6) and mb.response_ids.shape == (7, 5)
    assert mb.prompt_index.tolist() == [0, 0, 0, 1, 1, 2, 2]
    assert mb.prompt_ids[1].tolist() == [0, 0, 0, 0, 5, 6]  # left-padded: every prompt ends at the last column
    assert mb.response_ids[3].tolist() == [19, 20, 21, 22, 0]  # right-padded: every response starts after its prompt
    assert mb.response_positions[3].tolist() == [2, 3, 4, 5, 6]
    assert mb.response_mask[1].tolist() == [1, 0, 0, 0, 0]
    assert mb.padded_tokens == 3 * 6 + 7 * 5


def test_same_logprobs_and_gradients_as_whole_sequences():
    torch.manual_seed(0)
    model = tiny_qwen2(32, 64, tie_word_embeddings=True)
    samples = _samples()
    weights = torch.randn(len(samples), 5)

    mb = collate(samples, 0, torch.device("cpu"))
    logp = token_logp(response_logits(model, mb, temperature=0.7), mb.targets)
    (logp * mb.response_mask * weights).sum().backward()
    shared_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()

    total = 0.0
    for i, s in enumerate(samples):  # each sample alone, whole sequence, no padding at all
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        logits = model(input_ids=ids).logits[0, len(s.prompt_ids) - 1 : -1].float() / 0.7
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(s.response_ids).unsqueeze(-1)).squeeze(-1)
        r = len(s.response_ids)
        assert torch.allclose(logp[i, :r], expected, atol=1e-5), (i, logp[i, :r], expected)
        total = total + (expected * weights[i, :r]).sum()
    total.backward()
    for name, param in model.named_parameters():
        assert torch.allclose(shared_grads[name], param.grad, atol=1e-5, rtol=1e-4), name


def test_the_hidden_path_runs_the_head_on_no_position():
    """The learner takes the decoder's hidden states and applies the head itself, chunked: the model's own head
    must not also run (on a sliced position under grad it multiplies each row by its own copy of the head)."""
    from openrft.rollout.kv import forward_outputs

    model = tiny_qwen2(32, 64, tie_word_embeddings=True)
    seen: list[torch.Size] = []
    model.lm_head.register_forward_hook(lambda _m, args, _out: seen.append(args[0].shape))
    ids = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    hidden = forward_outputs(model, True, input_ids=ids, logits_to_keep=1)
    assert seen == [torch.Size([2, 0, model.config.hidden_size])]
    expected = model.model(input_ids=ids).last_hidden_state
    torch.testing.assert_close(hidden, expected)
    logits = forward_outputs(model, False, input_ids=ids)  # the logits path is left whole
    assert logits.shape == (2, 4, model.config.vocab_size) and seen[-1] == torch.Size([2, 4, model.config.hidden_size])


def test_collate_pads_every_row_and_refuses_per_token_values_of_another_length():
    samples = _samples()
    samples[1] = TrainSample(samples[1].prompt_ids, [16], -1.0, loss_mask=[0])
    samples[4] = TrainSample(samples[4].prompt_ids, [23, 24], 0.5, engine_logp=[-0.5, -1.5])
    mb = collate(samples, 0, torch.device("cpu"))
    assert mb.prompt_ids.tolist() == [[0, 0, 1, 2, 3, 4], [0, 0, 0, 0, 5, 6], [7, 8, 9, 10, 11, 12]]  # left-padded
    assert mb.prompt_mask.tolist()[1] == [0, 0, 0, 0, 1, 1]
    assert mb.response_ids.tolist()[3] == [19, 20, 21, 22, 0] and mb.response_ids.tolist()[5] == [25, 0, 0, 0, 0]
    assert mb.response_mask.tolist()[0] == [1, 1, 1, 0, 0]
    assert mb.loss_mask.tolist()[1] == [0, 0, 0, 0, 0] and mb.loss_mask.tolist()[0] == [1, 1, 1, 0, 0]
    engine = mb.engine_logp.tolist()
    assert engine[4][:2] == [-0.5, -1.5] and all(v != v for v in engine[4][2:] + engine[0])  # NaN where none
    assert mb.response_positions.tolist()[3] == [2, 3, 4, 5, 6]  # right after its 2-token prompt

    for field, name in (("loss_mask", "loss-mask values"), ("engine_logp", "engine log-probs")):
        bad = TrainSample([1, 2], [3, 4, 5], 1.0, **{field: [0.0, 1.0]})
        with pytest.raises(ValueError, match=f"a sample has 3 response tokens but 2 {name}"):
            collate([bad], 0, torch.device("cpu"))
