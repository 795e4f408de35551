"""The records stable_reinforce reads (service/tinker/stability.py): per tenant, a day after their last
use, at most ``max_tokens`` tokens (the least recently used dropped first)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tinker.proto import tinker_public_pb2 as pb

from openrft.algo.tinker_losses import LossInputError
from openrft.service.tinker.stability import Span, StabilityRecords


def response(*sequences: tuple[list[int], list[float]]) -> bytes:
    out = pb.SampleResponse()
    for tokens, logprobs in sequences:
        item = out.sequences.add()
        item.tokens = np.asarray(tokens, np.int32).tobytes()
        item.logprobs = np.asarray(logprobs, np.float32).tobytes()
    return out.SerializeToString()


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_records_resolve_per_tenant_and_expire_a_day_after_last_use():
    clock = Clock()
    records = StabilityRecords(ttl_s=100, clock=clock)
    records.record("a", ["r:0", "r:1"], response(([5, 6, 7], [-0.5, -1.0, -1.5]), ([8], [-2.0])))
    spans = [Span(False, "r:0", 0, 1), Span(True, "r:0", 1, 2)]
    q = records.resolve("a", 0, spans, torch.tensor([3, 6, 7]), torch.tensor([0.0, 1.0, 1.0]))
    assert q.tolist() == [0.0, -1.0, -1.5]
    with pytest.raises(LossInputError, match="'r:0', which this server has no record of"):
        records.resolve("b", 0, spans, torch.tensor([3, 6, 7]), torch.zeros(3))  # another tenant's
    clock.now = 90
    records.resolve("a", 0, spans, torch.tensor([3, 6, 7]), torch.zeros(3))  # a use restarts its day
    clock.now = 150
    records.resolve("a", 0, spans, torch.tensor([3, 6, 7]), torch.zeros(3))
    with pytest.raises(LossInputError, match="no record"):  # r:1 was last used at 0
        records.resolve("a", 0, [Span(True, "r:1", 0, 1)], torch.tensor([8]), torch.zeros(1))
    clock.now = 300
    with pytest.raises(LossInputError, match="no record"):
        records.resolve("a", 0, spans, torch.tensor([3, 6, 7]), torch.zeros(3))


def test_at_most_max_tokens_the_least_recently_used_dropped_first():
    records = StabilityRecords(max_tokens=5, clock=Clock())
    records.record("a", ["x"], response(([1, 2, 3], [0.0] * 3)))
    records.record("a", ["y"], response(([4, 5], [0.0] * 2)))
    records.resolve("a", 0, [Span(True, "x", 0, 3)], torch.tensor([1, 2, 3]), torch.zeros(3))  # x used last
    records.record("a", ["z"], response(([6], [0.0])))
    assert len(records) == 2
    with pytest.raises(LossInputError, match="'y', which this server has no record"):
        records.resolve("a", 0, [Span(True, "y", 0, 2)], torch.tensor([4, 5]), torch.zeros(2))


@pytest.mark.parametrize(
    ("spans", "message"),
    [
        (None, r"data\[2\] has no provenance"),
        (
            [Span(True, "x", 0, 2)],
            r"data\[2\].loss_fn_input_spans cover 2 positions; they must tile target_tokens \(3\)",
        ),
        ([Span(True, "x", 2, 3)], "covers tokens 2 to 5 of sequence 'x', which has 3"),
        ([Span(True, "x", -1, 3)], "negative offset or length"),
    ],
)
def test_provenance_that_does_not_fit_is_refused_by_name(spans, message):
    records = StabilityRecords(clock=Clock())
    records.record("a", ["x"], response(([1, 2, 3], [0.0] * 3)))
    with pytest.raises(LossInputError, match=message):
        records.resolve("a", 2, spans, torch.tensor([1, 2, 3]), torch.zeros(3))
