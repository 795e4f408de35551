"""What ``stable_reinforce`` needs from sampling time (docs/tinker.md, "StableReinforce").

A sampling request with ``record_stability_info`` has each of its sequences recorded here under the
``sequence_id`` the SDK gives it (``SampledSequence.sequence_id``): its tokens and the log-probs the
sampler computed for them. A ``stable_reinforce`` datum names, run by run, the sampled sequence behind
each of its target tokens (``Datum.with_provenance``: ``loss_fn_input_spans`` tiling ``target_tokens``);
``resolve`` turns those runs into the datum's recorded log-probs, checking that the tokens are the ones
sampled. Records belong to the tenant that sampled them and last a day after their last use (Tinker:
"one day after sampling; each training request that uses a sequence restarts that day"); the server
keeps at most ``max_tokens`` recorded tokens, the least recently used dropped first.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch
from tinker.proto import tinker_public_pb2 as pb

from openrft.algo.tinker_losses import LossInputError

DAY_S = 24 * 3600.0
MAX_RECORDED_TOKENS = 4_000_000  # 8 bytes a token (int32 id, float32 log-prob): 32 MB at most


@dataclass(frozen=True)
class Span:
    """One run of a datum's provenance: ``length`` positions from ``offset`` of a sequence's sampled
    tokens (``sampled``) or of its request's prompt (not sampled: no recorded log-probs)."""

    sampled: bool
    sequence_id: str
    offset: int
    length: int


@dataclass
class Record:
    tokens: np.ndarray  # int32
    logprobs: np.ndarray  # float32
    used: float


class StabilityRecords:
    def __init__(self, ttl_s: float = DAY_S, max_tokens: int = MAX_RECORDED_TOKENS, clock=time.monotonic) -> None:
        self.ttl_s, self.max_tokens, self.clock = ttl_s, max_tokens, clock
        self._records: OrderedDict[tuple[str, str], Record] = OrderedDict()  # least recently used first
        self._tokens = 0
        self._lock = threading.Lock()

    def record(self, owner: str, sequence_ids: list[str], response: bytes) -> None:
        """Record the sequences of a ``SampleResponse`` message, in order, under ``sequence_ids``."""
        message = pb.SampleResponse()
        message.ParseFromString(response)
        now = self.clock()
        with self._lock:
            for sequence_id, sequence in zip(sequence_ids, message.sequences, strict=True):
                tokens = np.frombuffer(sequence.tokens, np.int32).copy()
                logprobs = np.frombuffer(sequence.logprobs, np.float32).copy()
                self._put((owner, sequence_id), Record(tokens, logprobs, now))
            self._evict(now)

    def _put(self, key: tuple[str, str], record: Record) -> None:
        old = self._records.pop(key, None)
        if old is not None:
            self._tokens -= len(old.tokens)
        self._records[key] = record
        self._tokens += len(record.tokens)

    def _evict(self, now: float) -> None:
        while self._records:
            key, oldest = next(iter(self._records.items()))
            if self._tokens <= self.max_tokens and now - oldest.used <= self.ttl_s:
                break
            del self._records[key]
            self._tokens -= len(oldest.tokens)

    def __len__(self) -> int:
        return len(self._records)

    def resolve(
        self, owner: str, datum: int, spans: list[Span] | None, targets: torch.Tensor, advantages: torch.Tensor
    ) -> torch.Tensor:
        """The recorded log-probs of the datum's target tokens ``[length]``: each sampled run's from its
        sequence's record (the tokens checked against it); a prompt run's positions carry no recorded
        log-prob (0 there) and must have advantage 0. Refusals name the datum, the run and the position."""
        where = f"data[{datum}]"
        if not spans:
            raise LossInputError(
                f"{where} has no provenance: stable_reinforce takes the log-probs recorded when its tokens were "
                "sampled; name each run of target_tokens by its sequence_id (Datum.with_provenance)"
            )
        bad = next((i for i, s in enumerate(spans) if s.offset < 0 or s.length < 0), None)
        if bad is not None:
            raise LossInputError(f"{where}.loss_fn_input_spans[{bad}] has a negative offset or length")
        length = len(targets)
        covered = sum(s.length for s in spans)
        if covered != length:
            raise LossInputError(
                f"{where}.loss_fn_input_spans cover {covered} positions; they must tile target_tokens ({length})"
            )
        recorded = torch.zeros(length, dtype=torch.float32)
        position = 0
        now = self.clock()
        with self._lock:
            self._evict(now)
            for run, span in enumerate(spans):
                here = slice(position, position + span.length)
                if not span.sampled:
                    if bool((advantages[here] != 0).any()):
                        first = position + int(torch.nonzero(advantages[here] != 0)[0])
                        raise LossInputError(
                            f"{where}.loss_fn_inputs.advantages[{first}] is not 0, but the position is a prompt "
                            f"run (loss_fn_input_spans[{run}]): only sampled tokens carry what stable_reinforce needs"
                        )
                else:
                    record = self._records.get((owner, span.sequence_id))
                    if record is None:
                        raise LossInputError(
                            f"{where}.loss_fn_input_spans[{run}] names sequence {span.sequence_id!r}, which this "
                            "server has no record of for this key: sample with record_stability_info=True (records "
                            "last a day after their last use)"
                        )
                    if span.offset + span.length > len(record.tokens):
                        raise LossInputError(
                            f"{where}.loss_fn_input_spans[{run}] covers tokens {span.offset} to "
                            f"{span.offset + span.length} of sequence {span.sequence_id!r}, which has "
                            f"{len(record.tokens)}"
                        )
                    sampled = torch.from_numpy(record.tokens[span.offset : span.offset + span.length]).long()
                    differ = torch.nonzero(targets[here].long() != sampled)
                    if differ.numel():
                        at = int(differ[0])
                        raise LossInputError(
                            f"{where}.loss_fn_inputs.target_tokens[{position + at}] is {int(targets[position + at])}, "
                            f"but token {span.offset + at} of sequence {span.sequence_id!r} was {int(sampled[at])} "
                            f"(loss_fn_input_spans[{run}])"
                        )
                    recorded[here] = torch.from_numpy(record.logprobs[span.offset : span.offset + span.length])
                    record.used = now
                    self._records.move_to_end((owner, span.sequence_id))
                position += span.length
        return recorded


def spans_of(datum: pb.Datum) -> list[Span] | None:
    """A wire datum's ``loss_fn_input_spans`` (None when it has none)."""
    if not len(datum.loss_fn_input_spans):
        return None
    out = []
    for span in datum.loss_fn_input_spans:
        kind = span.WhichOneof("span")
        arm = getattr(span, kind) if kind else None
        if arm is None:
            out.append(Span(False, "", 0, 0))
            continue
        out.append(Span(kind == "sampled_tokens", arm.sequence_id, int(arm.offset), int(arm.length)))
    return out
