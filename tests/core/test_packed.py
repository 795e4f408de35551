"""``openrft.learner.packed``: a micro-batch's prompts and responses in one forward give the shared-prefix
passes' log-probs and gradients (float64), through one pass of each decoder layer instead of two."""

import pytest
import torch

from openrft.learner.batch import collate
from openrft.learner.learner import response_logits, token_logp
from openrft.learner.logprobs import chunked_logp_entropy
from openrft.learner.packed import fits, layout, packing, width
from tests.core.test_shared_prefix import _samples
from tests.tiny_models import tiny_qwen2

ALWAYS = lambda model, mb: True  # noqa: E731


def _model(attention: str = "sdpa"):
    torch.manual_seed(0)
    model = tiny_qwen2(32, 64, tie_word_embeddings=True, attn_implementation=attention).double()
    return model


def _layer_calls(model) -> list[int]:
    calls = [0]
    model.model.layers[0].register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def _logp_and_grads(model, mb, packed: bool, chunked: bool):
    model.zero_grad()
    with packing(ALWAYS if packed else (lambda model, mb: False)):
        if chunked:
            logp, entropy = chunked_logp_entropy(model, mb, 0.7, chunk=5)
        else:
            logp, entropy = token_logp(response_logits(model, mb, 0.7), mb.targets), None
    weights = torch.linspace(-1, 1, mb.targets.numel(), dtype=torch.float64).view(mb.targets.shape)
    loss = (logp * mb.response_mask * weights).sum()
    if entropy is not None:
        loss = loss + (entropy * mb.response_mask).sum() * 0.1
    loss.backward()
    return logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("chunked", [False, True], ids=["logits", "chunked-head"])
def test_packed_matches_the_shared_prefix_passes(attention, chunked):
    """Against the shared-prefix passes through sdpa (eager attention turns a left-padded prompt's fully masked
    rows into NaN there; packed, a pad query sees itself). Eager's softmax runs in float32, hence its tolerance."""
    model, reference = _model(attention), _model("sdpa")
    mb = collate(_samples(), 0, torch.device("cpu"))
    calls, reference_calls = _layer_calls(model), _layer_calls(reference)
    logp, grads = _logp_and_grads(reference, mb, packed=False, chunked=chunked)
    assert reference_calls[0] == 2  # the prompts, then the responses on their cache
    packed_logp, packed_grads = _logp_and_grads(model, mb, packed=True, chunked=chunked)
    assert calls[0] == 1  # one pass: the packed rows
    valid, tolerance = mb.response_mask.bool(), 1e-10 if attention == "sdpa" else 1e-6
    assert torch.allclose(packed_logp[valid], logp[valid], atol=tolerance, rtol=0)
    for name, grad in grads.items():
        assert torch.allclose(packed_grads[name], grad, atol=tolerance, rtol=tolerance), name


def test_the_layout_lets_a_response_see_its_prompt_and_its_own_past_only():
    mb = collate(_samples(), 0, torch.device("cpu"))
    ids, positions, allowed, columns = layout(mb)
    prompt_width = mb.prompt_ids.shape[1]  # 6; the widest response is 5 tokens, 4 of them inputs
    assert ids.shape == (3, width(mb)) == (3, prompt_width + 3 * 4)  # prompt a has three responses
    # prompt a ([1, 2, 3, 4], left-padded by 2): its responses' inputs [13, 14, 15], [16], [17, 18] in slots 0-2
    assert ids[0].tolist() == [0, 0, 1, 2, 3, 4, 13, 14, 15, 0, 16, 0, 0, 0, 17, 18, 0, 0]
    assert positions[0, 6:8].tolist() == [4, 5] and positions[0, 14].item() == 4  # each starts after its prompt
    first, second = 6, 10  # the first column of the first and the second response of prompt a
    assert allowed[0, first + 1, 2 : first + 2].tolist() == [True] * 6  # the prompt and its own first token
    assert not allowed[0, second, first : first + 4].any()  # nothing of another response
    assert not allowed[0, first, :2].any()  # nor the prompt's padding
    assert not allowed[0, 3, 4:].any()  # a prompt token: no later token
    assert columns[0].tolist() == [5, 6, 7, 8, 9] and columns[1].tolist() == [5, 10, 11, 12, 13]


def test_fits_only_a_small_mask_and_an_attention_that_takes_one():
    mb = collate(_samples(), 0, torch.device("cpu"))
    model = _model()
    assert fits(model, mb)
    mask_bytes = 3 * width(mb) ** 2 * 8  # three prompts' masks, in the model's float64
    assert fits(model, mb, max_mask_bytes=mask_bytes) and not fits(model, mb, max_mask_bytes=mask_bytes - 1)
    model.config._attn_implementation = "flash_attention_2"
    assert not fits(model, mb)
